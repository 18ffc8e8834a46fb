#!/usr/bin/env bash
# The Python package on a GPU machine without network: install it from the checkout, run the pytest
# suite (GPU tests included), the training example and the overhead benchmark; logs go to $OUT.
#
#   bash python/tests/gpu-check.sh [all|install|test|example|bench|distributed|grouped]      (default: all)
#
# grouped (not part of all: a few minutes): python/benchmarks/grouped.py, with DeepGEMM built first where
# tools/fetch-deepgemm.sh staged it (.deps/deepgemm). Both in one command: a later call that copies
# .deps with the tree again replaces the built extension.
# distributed (part of all when the machine has >= 2 GPUs): python/benchmarks/distributed.py under
# torchrun on every GPU for ddp, fsdp2, fsdp2-fp8, ep and ep-fp8, each against the same training on one GPU.
#
# Run from anywhere inside the repository. Needs, in the repository root:
#   .whl/       the build and test wheels (pure Python, py3-none-any), fetched on a machine with network:
#                 pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#                   --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#                   --platform manylinux2014_x86_64 -d .whl nanobind scikit-build-core pytest
#               (resolves to nanobind, scikit-build-core, packaging, pathspec, pytest, pluggy, iniconfig,
#               pygments; numpy and ml_dtypes must already be installed, as they are beside jax)
#   .deps/usr   staged header packages for the C++ build (nlohmann-json is the one the library needs;
#               Catch2 and CLI11 are not used: the package builds no tests or tools)
# Environment: PYTHON (default /opt/torch/.venv/bin/python3, else python3), OUT (default out/python), COMMIT,
#   SCALEMM_CUDA_ARCHITECTURES (default 90), JOBS (default nproc), MODES (distributed: default "ddp fsdp2 fsdp2-fp8 ep ep-fp8"),
#   SCALEMM_DIR (install: link the scalemm installed there, <prefix>/lib/cmake/scalemm, instead of compiling the
#   library again: `cmake --install build-gpu --prefix P` after a build of the tests takes the install to seconds).
# Each stage fits in a few minutes; run them one by one where a command has a time limit.
set -uo pipefail
stage=${1:-all}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/out/python}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
export PATH=/usr/local/cuda/bin:$PATH
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
status=0

note() { echo "== $*" | tee -a "$OUT/summary.txt"; }

install() {
  note "install: $($PYTHON --version) at $PYTHON, nvcc $(nvcc --version | tail -1)"
  if ! $PYTHON -c 'import nanobind, scikit_build_core, pytest' 2>/dev/null; then
    [ -d .whl ] || { note "install: FAILED: no .whl/ folder (see this script's header for the pip download line)"; return 1; }
    $PYTHON -m pip install --no-index --find-links .whl nanobind scikit-build-core pytest 2>&1 | tail -3
  fi
  local t0=$SECONDS
  # Build in place (build-dir python/build/...), so a rerun recompiles only what changed.
  if $PYTHON -m pip install --no-index --find-links .whl --no-build-isolation -v \
      --config-settings=cmake.args="-DCMAKE_PREFIX_PATH=$root/.deps/usr" \
      --config-settings=cmake.define.SCALEMM_CUDA_ARCHITECTURES="${SCALEMM_CUDA_ARCHITECTURES:-90}" \
      ${SCALEMM_DIR:+--config-settings=cmake.define.scalemm_DIR="$SCALEMM_DIR"} \
      ./python >"$OUT/pip-install.log" 2>&1; then
    note "install: ok in $((SECONDS - t0)) s; $(cd /tmp && $PYTHON -c 'import scalemm; print("scalemm", scalemm.__version__, "plans for", scalemm.device())')"
  else
    tail -30 "$OUT/pip-install.log"
    note "install: FAILED (log: pip-install.log)"
    return 1
  fi
}

run_tests() {
  local t0=$SECONDS
  # -s: the TORCH-COMPARE lines (torch._scaled_mm against the float64 reference) go to the log.
  # Not from python/, whose scalemm/ source folder (no compiled module) would shadow the installed one.
  (cd "$OUT" && $PYTHON -m pytest -v -s -rs "$root/python/tests") >"$OUT/pytest.log" 2>&1
  local rc=$?
  grep "TORCH-COMPARE" "$OUT/pytest.log" >"$OUT/torch-compare.txt" || true
  note "pytest: rc $rc in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
  grep -E "^(FAILED|ERROR)|SKIPPED" "$OUT/pytest.log" | head -40 | tee -a "$OUT/summary.txt"
  return $rc
}

example() {
  local t0=$SECONDS rc=0
  (cd python && $PYTHON examples/train_mlp.py) >"$OUT/train_mlp.log" 2>&1 || rc=$?
  note "train_mlp: rc $rc in $((SECONDS - t0)) s"
  tail -3 "$OUT/train_mlp.log" | tee -a "$OUT/summary.txt"
  (cd python && $PYTHON examples/train_mlp.py --compile --steps 100) >"$OUT/train_mlp_compiled.log" 2>&1 || rc=$?
  note "train_mlp --compile: rc $rc"
  tail -2 "$OUT/train_mlp_compiled.log" | tee -a "$OUT/summary.txt"
  return $rc
}

bench() {
  local rc=0
  (cd python && $PYTHON benchmarks/overhead.py --json "$OUT/overhead.json") >"$OUT/overhead.log" 2>&1 || rc=$?
  note "overhead benchmark: rc $rc"
  cat "$OUT/overhead.log" | tee -a "$OUT/summary.txt"
  return $rc
}

grouped() {
  local rc=0 env=""
  if [ -f "$root/.deps/deepgemm/setup.py" ]; then
    if env=$(OUT=$OUT PYTHON=$PYTHON bash "$root/tools/build-deepgemm.sh" 2>"$OUT/deepgemm-build.err"); then
      note "grouped: DeepGEMM built"
    else
      note "grouped: DeepGEMM did not build (deepgemm-build.err); timed without it"
      env=""
    fi
  else
    note "grouped: no DeepGEMM staged (tools/fetch-deepgemm.sh); timed without it"
  fi
  # DeepGEMM's environment (PYTHONPATH, LD_PRELOAD, its JIT cache) for this benchmark only.
  (eval "$env"; cd "$OUT" && $PYTHON "$root/python/benchmarks/grouped.py" --json "$OUT/grouped.json") \
    >"$OUT/grouped.log" 2>&1 || rc=$?
  note "grouped benchmark: rc $rc"
  tail -40 "$OUT/grouped.log" | tee -a "$OUT/summary.txt"
  return $rc
}

distributed() {
  local gpus rc=0
  gpus=$($PYTHON -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$gpus" -lt 2 ]; then
    note "distributed: skipped: needs 2 CUDA devices, this machine has $gpus"
    return 0
  fi
  # NVLink multicast off, also in the processes torchrun starts.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  for mode in ${MODES:-ddp fsdp2 fsdp2-fp8 ep ep-fp8}; do
    local t0=$SECONDS r=0
    (cd "$OUT" && timeout 170 $PYTHON -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
      "$root/python/benchmarks/distributed.py" "$mode" --json "$OUT/distributed-$mode.json") \
      >"$OUT/distributed-$mode.log" 2>&1 || r=$?
    [ $r -eq 0 ] || rc=1
    note "distributed $mode on $gpus GPUs: rc $r in $((SECONDS - t0)) s"
    grep -E "^(ddp|fsdp2|fsdp2-fp8|ep|ep-fp8):" "$OUT/distributed-$mode.log" | tee -a "$OUT/summary.txt"
    [ $r -eq 0 ] || tail -25 "$OUT/distributed-$mode.log"
  done
  return $rc
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/== gpu: /' | tee -a "$OUT/summary.txt"
note "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, stage $stage, $(date -u +%FT%TZ)"
case "$stage" in
  install) install || status=1 ;;
  test) run_tests || status=1 ;;
  example) example || status=1 ;;
  bench) bench || status=1 ;;
  distributed) distributed || status=1 ;;
  grouped) grouped || status=1 ;;
  all)
    if install; then
      run_tests || status=1
      example || status=1
      bench || status=1
      distributed || status=1
    else
      status=1
    fi ;;
  *) echo "usage: $0 [all|install|test|example|bench|distributed|grouped]" >&2; exit 2 ;;
esac
note "done: status $status (logs in $OUT)"
exit $status
