#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the [gpu] test suite.
#
#   tools/compute-sanitizer.sh [--tools memcheck,racecheck,initcheck,synccheck] [--list]
#
# Runs the Catch2 executables of BUILD_DIR (default build-gpu, as tools/gpu-check.sh makes it) under
# each tool with --error-exitcode 1 and prints one summary line per tool: errors found, runs, test
# failures, runs cut by the time limit. Logs: $OUT/sanitizer-<tool>-<executable>.log (OUT default
# ./out). Exit status 1 unless every entry ran to its end with no error and no failing test (an
# entry cut by the time limit, a missing executable or a machine without a CUDA device is not clean).
#
# SAN_ARGS_<TOOL> adds options to one tool's command line (SAN_ARGS_RACECHECK="...").
# Each tool runs a list of "executable|Catch2 test spec" entries (SAN_<TOOL> overrides it, entries
# separated by ';') within a time budget (SAN_BUDGET_<TOOL> seconds); an entry gets an equal share of
# what is left of its tool's budget, and one cut short is reported as such, never as clean. The
# default budgets add up to 470 s (memcheck 200, synccheck 90, racecheck 90, initcheck 90): the four
# tools take at most about 8 minutes plus start-up (tools/reliability-gpu.sh passes smaller budgets to
# fit its own 9 minutes). The default lists:
#   memcheck   every [gpu] case except the exhaustive 2^32-pattern and all-code-pair sweeps of
#              test_emulation (one kernel over 4 billion inputs: minutes each even without a tool) and
#              four test_dispatch cases whose paths other cases take on smaller data (autotuning,
#              large compact scales, random-data agreement, 8 threads on the default stream)
#   synccheck  the same cases
#   racecheck  the kernels with shared memory and barriers: the CUTLASS grouped kernel and its set-up,
#              layout conversions, the reference GEMM and quantizers, the emulated backend, and the
#              device rows of the bad-input catalogue. The contiguous grouped kernel's cases (each in
#              all five tile configurations) take far beyond this budget under racecheck (about 6
#              minutes with one configuration each, H100): run them on their own,
#              SAN_RACECHECK='dispatch/test_dispatch|[contiguous]' SAN_BUDGET_RACECHECK=1800
#              tools/compute-sanitizer.sh --tools racecheck (docs/reliability.md has the result)
#   initcheck  every backend once (the CUTLASS and contiguous grouped kernels, forced backends,
#              emulated, padded M, FP8 output), graphs, the linear layer and the device rows of the
#              bad-input catalogue
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
out=${OUT:-$root/out}
tools="memcheck,synccheck,racecheck,initcheck"
list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tools) tools=$2; shift ;;
    --list) list=1 ;;
    *) echo "usage: $0 [--tools memcheck,racecheck,initcheck,synccheck] [--list]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
# compute-sanitizer: on PATH, else next to nvcc, else under $CUDA_HOME (default /usr/local/cuda).
san=$(command -v compute-sanitizer || true)
if [ -z "$san" ] && command -v nvcc > /dev/null; then san="$(dirname "$(command -v nvcc)")/compute-sanitizer"; fi
if [ -z "$san" ] || [ ! -x "$san" ]; then san="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"; fi

# Catch2 v2 needs each excluded name pattern quoted when several follow one another.
no_sweeps='[gpu]~"*2^32*"~"*every code pair*"'
dispatch_subset='[gpu]~"autotuned*"~"compact blockwise scales*"~"GEMMs on random data*"~"8 threads x 100 calls on one handle are*"'
default_memcheck="reliability/test_reliability|[gpu];dispatch/test_dispatch|$dispatch_subset;layouts/test_layouts|[gpu];emulation/test_emulation|$no_sweeps;formats/test_formats|[gpu]"
default_synccheck="$default_memcheck"
default_racecheck="dispatch/test_dispatch|[cutlass];layouts/test_layouts|[gpu];emulation/test_emulation|*GPU reference GEMM*,Host and GPU quantizers are byte-identical for every recipe*,Host and GPU dequantization agree*;dispatch/test_dispatch|the emulated backend equals the reference*,the emulated backend stays exact*;reliability/test_reliability|bad-input catalogue\\, device memory*"
default_initcheck="dispatch/test_dispatch|[cutlass],[contiguous];dispatch/test_dispatch|a forced backend runs exactly that backend*,the emulated backend equals the reference*,blockwise GEMMs with M = 1*,FP8 output with a D scale*,compact blockwise scales*;reliability/test_reliability|[graph],bad-input catalogue\\, device memory*"
declare -A budget=([memcheck]=${SAN_BUDGET_MEMCHECK:-200} [synccheck]=${SAN_BUDGET_SYNCCHECK:-90}
                   [racecheck]=${SAN_BUDGET_RACECHECK:-90} [initcheck]=${SAN_BUDGET_INITCHECK:-90})

entries_for() {
  case "$1" in
    memcheck) echo "${SAN_MEMCHECK:-$default_memcheck}" ;;
    synccheck) echo "${SAN_SYNCCHECK:-$default_synccheck}" ;;
    racecheck) echo "${SAN_RACECHECK:-$default_racecheck}" ;;
    initcheck) echo "${SAN_INITCHECK:-$default_initcheck}" ;;
    *) echo "unknown tool $1" >&2; exit 2 ;;
  esac
}

if [ "$list" -eq 1 ]; then
  for tool in ${tools//,/ }; do
    echo "$tool (budget ${budget[$tool]} s):"
    IFS=';' read -ra entries <<< "$(entries_for "$tool")"
    for e in "${entries[@]}"; do echo "  ${e%%|*}  ${e#*|}"; done
  done
  exit 0
fi
if [ ! -x "$san" ]; then
  echo "compute-sanitizer not found (PATH or \$CUDA_HOME/bin)" >&2
  exit 2
fi

status=0
summary=()
for tool in ${tools//,/ }; do
  IFS=';' read -ra entries <<< "$(entries_for "$tool")"
  start=$(date +%s)
  errors=0; runs=0; failed=0; cut=0; missing=0; nodevice=0; index=-1
  for e in "${entries[@]}"; do
    index=$((index + 1))
    exe="$build/tests/${e%%|*}"
    spec="${e#*|}"
    name=$(basename "${e%%|*}")
    log="$out/sanitizer-$tool-$index-$name.log"  # an executable may appear in several entries
    if [ ! -x "$exe" ]; then
      echo "missing $exe" >> "$out/sanitizer-$tool.missing"; missing=$((missing + 1)); continue
    fi
    # An equal share of what is left (at least 10 s while that much is left), so that a slow entry
    # cannot starve the ones after it.
    remaining=$(( budget[$tool] - ($(date +%s) - start) ))
    left=$(( remaining / (${#entries[@]} - index) ))
    [ "$left" -lt 10 ] && left=$(( remaining < 10 ? remaining : 10 ))
    if [ "$left" -le 2 ]; then
      echo "$tool: no time left for $name ($spec)" >> "$out/sanitizer-$tool.cut"; cut=$((cut + 1)); continue
    fi
    runs=$((runs + 1))
    extra=()
    [ "$tool" = "racecheck" ] && extra+=(--racecheck-report hazard)
    more_var="SAN_ARGS_${tool^^}"  # e.g. SAN_ARGS_RACECHECK="--racecheck-indirect-barrier-dependency yes"
    [ -n "${!more_var:-}" ] && read -r -a more <<< "${!more_var}" && extra+=("${more[@]}")
    SCALEMM_VERIFY=off timeout -k 10 "$left" "$san" --tool "$tool" --error-exitcode 1 --print-limit 50 "${extra[@]}" \
      "$exe" "$spec" > "$log" 2>&1
    rc=$?
    # memcheck, initcheck, synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards
    # displayed (N errors, W warnings)".
    found=$( (grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | awk '{print $3}'
              grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards displayed \([0-9]+ errors' "$log" | awk '{print $6}' | tr -d '(') |
            awk '{s += $1} END {print s + 0}')
    errors=$((errors + found))
    if [ $rc -eq 77 ]; then
      nodevice=$((nodevice + 1))  # the test main found no usable CUDA device: nothing ran
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      cut=$((cut + 1)); echo "$tool: $name cut at the time limit ($spec)" >> "$out/sanitizer-$tool.cut"
    elif [ $rc -ne 0 ] && [ "$found" -eq 0 ]; then
      failed=$((failed + 1))  # a test assertion failed under the tool (or the tool itself failed)
    fi
  done
  secs=$(( $(date +%s) - start ))
  line="compute-sanitizer $tool: $errors errors, $runs runs, $failed with failing tests, $cut cut at the time limit, $missing executables missing, $nodevice without a CUDA device, ${secs} s"
  summary+=("$line")
  echo "$line"
  # Anything short of every entry run to the end with no error is not a clean result.
  if [ "$errors" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$nodevice" -ne 0 ] || [ "$cut" -ne 0 ] || [ "$missing" -ne 0 ]; then
    status=1
  fi
done
printf '%s\n' "${summary[@]}" > "$out/sanitizer-summary.txt"
exit $status
