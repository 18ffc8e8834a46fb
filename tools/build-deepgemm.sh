#!/usr/bin/env bash
# Builds the DeepGEMM staged by tools/fetch-deepgemm.sh (.deps/deepgemm) in place against the installed
# torch, on the GPU machine (no network needed), and prints the environment a benchmark needs:
#   eval "$(tools/build-deepgemm.sh)"      then python/benchmarks/grouped.py times DeepGEMM too
# One host C++ file is compiled (about a minute); the kernels are compiled by nvcc at first use into
# DG_JIT_CACHE_DIR (7-9 s per new shape configuration). Environment: PYTHON (default
# /opt/torch/.venv/bin/python3, else python3), CUDA_HOME (default /usr/local/cuda).
#
# The preload of the system libstdc++ is needed on the lent machines: without it DeepGEMM's extension
# crashes inside std::regex on its first GEMM (a second, older libstdc++ in the process).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/.deps/deepgemm
cutlass=$root/.deps/cutlass/include
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -f "$src/setup.py" ] || { echo "build-deepgemm: no $src/setup.py: run tools/fetch-deepgemm.sh first" >&2; exit 1; }
[ -f "$cutlass/cute/tensor.hpp" ] || { echo "build-deepgemm: no CUTLASS headers in $cutlass: run tools/fetch-cutlass.sh" >&2; exit 1; }
# CUTLASS where setup.py compiles the extension and where the JIT looks (deep_gemm/include).
mkdir -p "$src/third-party/cutlass"
rm -rf "$src/third-party/cutlass/include" && cp -r "$cutlass" "$src/third-party/cutlass/include"
for d in cute cutlass; do rm -rf "$src/deep_gemm/include/$d" && cp -r "$cutlass/$d" "$src/deep_gemm/include/$d"; done
# setup.py imports wheel.bdist_wheel; where the `wheel` package is absent, setuptools' own serves.
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
if ! "$PYTHON" -c 'import wheel.bdist_wheel' 2>/dev/null; then
  mkdir -p "$shim/wheel" && : >"$shim/wheel/__init__.py"
  echo 'from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401' >"$shim/wheel/bdist_wheel.py"
fi
preload=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
log=${OUT:-/tmp}/deepgemm-build.log
if ! (cd "$src" && PYTHONPATH=$shim DG_USE_LOCAL_VERSION=0 LD_PRELOAD=$preload "$PYTHON" setup.py build_ext --inplace) \
    >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "build-deepgemm: build failed (log: $log)" >&2
  exit 1
fi
echo "export PYTHONPATH=$src\${PYTHONPATH:+:\$PYTHONPATH} LD_PRELOAD=$preload CUDA_HOME=$CUDA_HOME DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/deepgemm-jit}"
