#!/usr/bin/env bash
# The GPU reliability run of docs/reliability.md, in one command, on a build that already exists
# (tools/gpu-check.sh makes BUILD_DIR, default build-gpu):
#   1. scalemm_fuzz: FUZZ_CONFIGS (default 6000) differential configurations, seed FUZZ_SEED (default 1),
#      then GROUPED_CONFIGS (default 1000) grouped ones (--grouped, same seed)
#   2. test_reliability: the bad-input catalogue (host and device rows), CUDA graphs, threads
#   3. tools/compute-sanitizer.sh: memcheck, synccheck, racecheck, initcheck over the [gpu] suite
# Logs go to $OUT (default ./out/reliability): fuzz.log, test_reliability.log, sanitizer-*.log and
# summary.txt (commit, device, one line per step). At most about 10 minutes whatever happens: the
# fuzzer stops drawing after FUZZ_SECONDS (default 120; expected to finish 6000 well before), the
# grouped run after GROUPED_SECONDS (default 60),
# test_reliability is cut at TEST_TIMEOUT (default 90 s; expected well under a minute), and
# compute-sanitizer has a budget per tool (300 s in all by default).
#   tools/reliability-gpu.sh [--no-sanitizer]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
out=${OUT:-$root/out/reliability}
sanitizer=1
[ "${1:-}" = "--no-sanitizer" ] && sanitizer=0
mkdir -p "$out"
summary="$out/summary.txt"
{
  echo "commit: ${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
} | tee "$summary"
status=0

t0=$(date +%s)
fuzz_limit=${FUZZ_SECONDS:-120}
timeout -k 10 $((fuzz_limit + 20)) "$build/tools/reliability/scalemm_fuzz" --configs "${FUZZ_CONFIGS:-6000}" \
  --seed "${FUZZ_SEED:-1}" --max-seconds "$fuzz_limit" > "$out/fuzz.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
{ grep -E '^(backends that ran|regimes|outputs|agreement|checks|skipped|scalemm_fuzz)' "$out/fuzz.log"
  grep -c '^FAIL' "$out/fuzz.log" | sed 's/^/fuzz failures printed: /'
  echo "fuzz: exit $rc, $(( $(date +%s) - t0 )) s"; } | tee -a "$summary"

t0=$(date +%s)
grouped_limit=${GROUPED_SECONDS:-60}
timeout -k 10 $((grouped_limit + 20)) "$build/tools/reliability/scalemm_fuzz" --grouped \
  --configs "${GROUPED_CONFIGS:-1000}" --seed "${FUZZ_SEED:-1}" --max-seconds "$grouped_limit" > "$out/fuzz-grouped.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
{ grep -E '^(grouped paths|regimes|outputs|agreement|checks|skipped|scalemm_fuzz)' "$out/fuzz-grouped.log"
  grep -c '^FAIL' "$out/fuzz-grouped.log" | sed 's/^/grouped fuzz failures printed: /'
  echo "fuzz --grouped: exit $rc, $(( $(date +%s) - t0 )) s"; } | tee -a "$summary"

t0=$(date +%s)
SCALEMM_VERIFY=off timeout -k 10 "${TEST_TIMEOUT:-90}" "$build/tests/reliability/test_reliability" \
  > "$out/test_reliability.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
{ grep -E 'rows pass|^test cases|^All tests passed|assertions' "$out/test_reliability.log"
  echo "test_reliability: exit $rc, $(( $(date +%s) - t0 )) s"; } | tee -a "$summary"

if [ "$sanitizer" -eq 1 ]; then
  t0=$(date +%s)
  # Budgets that keep the whole run under 9 minutes; tools/compute-sanitizer.sh alone has larger ones.
  SAN_BUDGET_MEMCHECK=${SAN_BUDGET_MEMCHECK:-130} SAN_BUDGET_SYNCCHECK=${SAN_BUDGET_SYNCCHECK:-50} \
  SAN_BUDGET_RACECHECK=${SAN_BUDGET_RACECHECK:-60} SAN_BUDGET_INITCHECK=${SAN_BUDGET_INITCHECK:-60} \
    BUILD_DIR="$build" OUT="$out" "$root/tools/compute-sanitizer.sh" | tee -a "$summary"
  rc=${PIPESTATUS[0]}
  [ $rc -ne 0 ] && status=1
  echo "compute-sanitizer: exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$summary"
fi
echo "logs in $out"
exit $status
