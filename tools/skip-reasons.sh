#!/usr/bin/env bash
# Prints why CTest's Skipped tests did not run, one line per reason with its count. CTest lists
# skipped tests without a reason; the Catch2 test main prints one ("SKIPPED [gpu] "<case>": <why>")
# into the test log, which this reads after a run.
#   bash tools/skip-reasons.sh BUILD_DIR
set -euo pipefail
log=${1:?usage: skip-reasons.sh BUILD_DIR}/Testing/Temporary/LastTest.log
[ -f "$log" ] || exit 0
reasons=$(sed -n 's/^SKIPPED \[gpu\] ".*": //p' "$log" | sort | uniq -c)
[ -n "$reasons" ] || exit 0
echo "Why the skipped tests did not run:"
while read -r count reason; do echo "  $count [gpu] test(s): $reason"; done <<<"$reasons"
