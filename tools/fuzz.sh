#!/usr/bin/env bash
# libFuzzer targets of tests/fuzz/, built with clang and run, in one command:
#   tools/fuzz.sh [--runs N] [--only TARGET] [--build-only]
# Targets: fuzz_layout_validate, fuzz_npy, fuzz_call_json, fuzz_cli_args (see each file's header).
# Each runs N executions (default 10^6) from its seed corpus tests/fuzz/corpus/<target>/ (read only;
# new inputs go to build-fuzz/corpus/<target>/), under AddressSanitizer and UndefinedBehaviorSanitizer.
# A crash stops that target and leaves its reproducer in build-fuzz/artifacts/; rerun one input with
#   build-fuzz/<target> <file>
# Prints one line per target (executions, seconds, result) and exits non-zero if any target failed.
#
# Why a script and not the CMake build: the targets need only host code (scalemm_core,
# scalemm_layouts, lib/io and the CLI's layout subcommands), all plain C++, while the CMake project
# needs nvcc for the rest. The script compiles exactly those sources with clang's
# -fsanitize=fuzzer-no-link (coverage) plus ASan/UBSan, and links each target with -fsanitize=fuzzer.
# Needs clang with libFuzzer (Debian: clang, which brings libclang-rt-dev), CLI11 and nlohmann-json.
# Environment: BUILD_DIR (default build-fuzz), CXX (default clang++), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
cxx=${CXX:-clang++}
runs=1000000
only=""
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --only) only=$2; shift ;;
    --build-only) build_only=1 ;;
    *) echo "usage: $0 [--runs N] [--only TARGET] [--build-only]" >&2; exit 2 ;;
  esac
  shift
done
targets=(fuzz_layout_validate fuzz_npy fuzz_call_json fuzz_cli_args)
[ -n "$only" ] && targets=("$only")

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: installing clang"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq clang >/dev/null
fi

mkdir -p "$build/obj" "$build/include/scalemm" "$build/artifacts"
sed -e 's/@PROJECT_VERSION_MAJOR@/0/' -e 's/@PROJECT_VERSION_MINOR@/0/' -e 's/@PROJECT_VERSION_PATCH@/0/' \
    -e 's/@PROJECT_VERSION@/0.0.0-fuzz/' "$root/cmake/version.hpp.in" > "$build/include/scalemm/version.hpp"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cxxflags=(-std=c++17 -O1 -g $san -I"$root/include" -I"$build/include" -I"$root/tools/cli")
lib_sources=(core/status.cpp core/types.cpp layouts/scale_layout.cpp layouts/validate.cpp layouts/convert.cpp
             lib/io/npy.cpp lib/io/call_record.cpp lib/base/grouped_layout.cpp tools/cli/layout_commands.cpp
             tools/cli/cli_io.cpp)

# Library objects: coverage instrumentation without libFuzzer's main. Rebuilt when the source is newer.
objs=()
for src in "${lib_sources[@]}"; do
  obj="$build/obj/$(echo "$src" | tr '/' '_').o"
  objs+=("$obj")
  if [ ! -f "$obj" ] || [ "$root/$src" -nt "$obj" ] || [ -n "$(find "$root/include" -newer "$obj" -name '*.hpp' | head -1)" ]; then
    echo "fuzz: compiling $src"
    "$cxx" "${cxxflags[@]}" -fsanitize=fuzzer-no-link -c "$root/$src" -o "$obj"
  fi
done
for t in "${targets[@]}"; do
  echo "fuzz: linking $t"
  "$cxx" "${cxxflags[@]}" -fsanitize=fuzzer "$root/tests/fuzz/$t.cpp" "${objs[@]}" -o "$build/$t"
done
[ $build_only -eq 1 ] && exit 0

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/$t.log"
  t0=$(date +%s)
  set +e
  # The CLI target prints `layout explain` output and usage errors: close its stdout and stderr
  # (libFuzzer keeps its own copy of stderr for reports).
  mask=0; [ "$t" = fuzz_cli_args ] && mask=3
  (cd "$build" && "./$t" -runs="$runs" -max_len=4096 -timeout=30 -rss_limit_mb=4096 -close_fd_mask=$mask \
     -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" ${FUZZ_ARGS:-} \
     "$build/corpus/$t" "$root/tests/fuzz/corpus/$t") > "$log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - t0 ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if [ $rc -eq 0 ]; then result="no crash"; else result="FAILED (rc $rc, see $log)"; status=1; fi
  line="$t: ${execs:-?} executions in $secs s, $result"
  summary+=("$line")
  echo "fuzz: $line"
done
echo "fuzz summary (commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)):"
printf '  %s\n' "${summary[@]}"
exit $status
