#!/usr/bin/env bash
# Build scalemm on a machine with a CUDA GPU and run, in one command: every test (host and [gpu]) and
# every benchmark. Logs go to $OUT (default ./out): ctest.log, bench_<name>.log, summary.txt.
#   tools/gpu-check.sh [--quick] [--no-bench] [--only REGEX]
# Environment: BUILD_DIR (default build-gpu), ARCH (default 90), JOBS (default nproc).
# Header-only dependencies can be staged beside the tree with tools/stage-deps.sh (.deps/).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
out=${OUT:-$root/out}
jobs=${JOBS:-$(nproc)}
quick=0; bench=1; only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-bench) bench=0 ;;
    --only) only=$2; shift ;;
    *) echo "usage: $0 [--quick] [--no-bench] [--only REGEX]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
prefix=()
[ -d "$root/.deps/usr" ] && prefix=(-DCMAKE_PREFIX_PATH="$root/.deps/usr")
{
  # COMMIT may be passed in where the tree travels without its .git (a copied work tree).
  echo "commit: ${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  nvcc --version | tail -1 | sed 's/^/nvcc: /'
} | tee "$out/summary.txt"

t0=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCALEMM_CUDA_ARCHITECTURES="${ARCH:-90}" \
  "${prefix[@]}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" > "$out/build.log" 2>&1 || { grep -E 'error|Error' "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"

# [gpu][multi-gpu] cases run when the machine has two or more GPUs and say "needs 2 CUDA devices" otherwise.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "gpus: $gpus$([ "$gpus" -ge 2 ] && echo " (the multi-GPU cases run)" || echo " (multi-GPU cases skip)")" | tee -a "$out/summary.txt"
ctest_args=(--test-dir "$build" -j 4 --output-on-failure --timeout 600)
[ -n "$only" ] && ctest_args+=(-R "$only")
ctest "${ctest_args[@]}" > "$out/ctest.log" 2>&1
rc=$?
grep -E 'tests passed|tests failed|Skipped|\*\*\*Failed|Failed  ' "$out/ctest.log" | tail -25 | tee -a "$out/summary.txt"

if [ "$bench" -eq 1 ]; then
  for b in "$build"/tools/bench/bench_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    echo "== $name" | tee -a "$out/summary.txt"
    args=(); [ "$quick" -eq 1 ] && args+=(--quick)
    timeout 240 "$b" "${args[@]}" > "$out/$name.log" 2>&1 || echo "$name: exit $?" | tee -a "$out/summary.txt"
    tail -40 "$out/$name.log" >> "$out/summary.txt"
  done
fi
echo "logs in $out"
exit $rc
