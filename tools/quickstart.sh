#!/usr/bin/env bash
# One command from a fresh Debian machine to a working scalemm:
#   bash tools/quickstart.sh demo   install what is missing, build, run the demo (GPU if present,
#                                   else the host emulator)
#   bash tools/quickstart.sh test   install what is missing, build, run the full test suite (C++ tests,
#                                   then the Python package built against this build and its pytest suite)
# Environment: BUILD_DIR (default build), JOBS (default nproc), SCALEMM_CUDA_ARCHITECTURES (default 90).
set -euo pipefail
mode=${1:-test}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/lib/cmake/Catch2/Catch2Config.cmake ] || need_apt+=(catch2)
[ -f /usr/include/CLI/CLI.hpp ] || need_apt+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "quickstart: installing ${need_apt[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
if ! python3 -c 'import numpy, ml_dtypes' 2>/dev/null; then
  echo "quickstart: installing numpy and ml_dtypes (test oracles)"
  pip_install numpy ml_dtypes
fi
if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH
  else echo "quickstart: the CUDA toolkit (nvcc) is required; install it from NVIDIA's packages" >&2; exit 1; fi
fi

# CUTLASS's headers (PyPI wheel nvidia-cutlass) for the grouped blockwise kernel; without them the
# library builds and grouped calls run on the per-group backend.
bash "$root/tools/fetch-cutlass.sh" ||
  echo "quickstart: CUTLASS headers unavailable: the CUTLASS grouped kernel will not be built"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSCALEMM_CUDA_ARCHITECTURES="${SCALEMM_CUDA_ARCHITECTURES:-90}" >/dev/null
case "$mode" in
  demo)
    # The demo needs the library and the CLI only: no tests, no benchmarks.
    cmake --build "$build" -j "$jobs" --target scalemm_cli
    exec "$build/tools/cli/scalemm" demo ;;
  test)
    cmake --build "$build" -j "$jobs"
    rc=0
    (cd "$build" && ctest -j "$jobs" --output-on-failure) || rc=$?
    # CTest lists Skipped tests without their reason; the test main printed it into the log.
    bash "$root/tools/skip-reasons.sh" "$build"
    # The Python package, linked against this build's library (installed under the build folder), so
    # the library is compiled once; only the binding compiles here.
    if ! python3 -c 'import nanobind, scikit_build_core, pytest' 2>/dev/null; then
      echo "quickstart: installing nanobind, scikit-build-core and pytest (Python package)"
      pip_install nanobind scikit-build-core pytest
    fi
    cmake --install "$build" --prefix "$build/install" >/dev/null
    # CPU jax before the package is configured: its FFI headers are found then (scalemm.jax's host tests).
    if ! python3 -c 'import jax, flax, optax' 2>/dev/null; then
      echo "quickstart: installing CPU jax, flax and optax (scalemm.jax host tests)"
      pip_install 'jax>=0.10,<0.12' flax optax || echo "quickstart: jax could not be installed: the scalemm.jax tests will skip"
    fi
    echo "quickstart: building and installing the Python package (python/)"
    pip_install --no-build-isolation -Cbuild-dir="$build/python" \
      -Ccmake.define.scalemm_DIR="$build/install/lib/cmake/scalemm" "$root/python"
    # Not from python/, whose scalemm/ source folder (no compiled module) would shadow the installed one.
    (cd "$build" && python3 -m pytest -q -rs "$root/python/tests") || rc=$?
    exit "$rc" ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
