#!/usr/bin/env bash
# Stage the header-only build dependencies beside the tree, for a GPU machine that has no package
# registry. Run it on a Debian/Ubuntu machine that has one (no root needed once apt's lists exist):
#   tools/stage-deps.sh [PKG...]      default: catch2 libcli11-dev nlohmann-json3-dev
# The packages are downloaded with `apt-get download` and unpacked (not installed) into .deps/usr
# (include/, lib/cmake/, share/). .deps/ is git-ignored: copy it with the tree to the GPU machine,
# where tools/gpu-check.sh passes -DCMAKE_PREFIX_PATH=.deps/usr to CMake when .deps/usr exists
# (for a build by hand, pass it yourself).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.deps
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(catch2 libcli11-dev nlohmann-json3-dev)

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "stage-deps: needs apt-get and dpkg-deb (Debian or Ubuntu)" >&2; exit 1
fi
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
  echo "stage-deps: apt has no package lists yet; running apt-get update"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
fi

debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
chmod 755 "$debs"  # apt's download sandbox user must be able to write there
( cd "$debs" && apt-get download -q "${pkgs[@]}" ) ||
  { echo "stage-deps: apt-get download ${pkgs[*]} failed" >&2; exit 1; }
mkdir -p "$deps"
for f in "$debs"/*.deb; do
  dpkg-deb -x "$f" "$deps"
  echo "stage-deps: $(basename "$f")"
done

# Say so when a default package arrived without the header CMake's find_package looks for.
declare -A marker=([catch2]=include/catch2/catch.hpp [libcli11-dev]=include/CLI/CLI.hpp
                   [nlohmann-json3-dev]=include/nlohmann/json.hpp)
for p in "${pkgs[@]}"; do
  m=${marker[$p]:-}
  [ -z "$m" ] || [ -f "$deps/usr/$m" ] || echo "stage-deps: $p did not provide usr/$m" >&2
done
grep -qxF '/.deps/' "$root/.gitignore" 2>/dev/null || echo "stage-deps: note: .deps/ is not in .gitignore" >&2
echo "stage-deps: $(du -sh "$deps" | cut -f1) in $deps; configure with -DCMAKE_PREFIX_PATH=$deps/usr"
