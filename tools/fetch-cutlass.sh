#!/usr/bin/env bash
# Installs CUTLASS's C++ headers for the grouped blockwise kernel (lib/backends/cutlass_grouped_sm90a.cu):
# the PyPI wheel nvidia-cutlass carries them under cutlass_library/source/include. They are unpacked
# into .deps/cutlass/include (git-ignored), where CMake looks first (SCALEMM_CUTLASS_DIR overrides),
# and given one barrier per scale-stage release in the blockwise mainloop (tools/cutlass/).
#   tools/fetch-cutlass.sh [WHEEL]     WHEEL: a downloaded nvidia_cutlass-*.whl (no network needed);
#                                      default: download nvidia-cutlass==$CUTLASS_VERSION from PyPI
# Environment: CUTLASS_VERSION (default 4.2.0.0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${CUTLASS_VERSION:-4.2.0.0}
dest=$root/.deps/cutlass
stamp=$dest/VERSION
# The one change made to CUTLASS's headers (idempotent): see tools/cutlass/scale_release_barrier.py.
patch_headers() { python3 "$root/tools/cutlass/scale_release_barrier.py" "$dest/include"; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -f "$dest/include/cutlass/cutlass.h" ]; then
  patch_headers
  echo "fetch-cutlass: CUTLASS $version headers already in $dest/include"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheel=${1:-}
if [ -z "$wheel" ]; then
  for w in "$root"/.whl/nvidia_cutlass-"$version"-*.whl; do [ -f "$w" ] && wheel=$w; done
fi
if [ -z "$wheel" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$version" ||
    { echo "fetch-cutlass: could not download nvidia-cutlass==$version from PyPI" >&2; exit 1; }
  wheel=$(ls "$tmp"/nvidia_cutlass-*.whl)
fi
python3 - "$wheel" "$tmp/unpacked" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"fetch-cutlass: {wheel} has no {prefix}")
    for n in names:
        z.extract(n, out)
EOF
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/unpacked/cutlass_library/source/include" "$dest/include"
patch_headers
echo "$version" > "$stamp"
echo "fetch-cutlass: CUTLASS $version headers in $dest/include ($(du -sh "$dest/include" | cut -f1))"
