#!/usr/bin/env bash
# The host test suite under sanitizers, one command each:
#   tools/sanitize.sh asan    AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   tools/sanitize.sh tsan    ThreadSanitizer (build-tsan/)
# Configures a separate build directory, builds the host test targets and runs `ctest -L host` (the
# Catch2 host cases, the CLI tests, the C ABI tests, the installed-package consumer; test_layouts_emu
# as said below). Prints the wall
# time of each stage and a final line "sanitize <kind>: PASS|FAIL ...". Exit status: ctest's.
#
# Compilers: GCC (the toolchain nvcc uses as its host compiler), so that one sanitizer runtime serves
# every object file. The flags reach
#   - every C and C++ TU (CMAKE_C_FLAGS, CMAKE_CXX_FLAGS);
#   - the host half of every .cu TU through nvcc's -Xcompiler (CMAKE_CUDA_FLAGS): the host code nvcc
#     generates (kernel launch stubs, the host functions of emulated.cu, epilogue.cu, verify.cu, the
#     layouts_cuda and emulation device.cu wrappers) is instrumented like any other C++; device code
#     is untouched (sanitizers do not apply to it, compute-sanitizer does);
#   - every link (CMAKE_EXE_LINKER_FLAGS, CMAKE_SHARED_LINKER_FLAGS), and, through LDFLAGS/CXXFLAGS in
#     the test environment, the consumer project that the packaging test configures from scratch.
# Nothing is excluded. The CUDA runtime (libcudart) and the driver are not instrumented: with no GPU
# they only answer "no device", and the [gpu] cases are skipped (label gpu, not run here).
#
# Environment: JOBS (default 2), BUILD_DIR (default build-<kind>), CTEST_JOBS (default JOBS).
# Suppressions: tools/sanitize/ (each entry says why it is there; third-party code only).
set -euo pipefail
kind=${1:-}
case "$kind" in
  asan) flags="-fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
  tsan) flags="-fsanitize=thread" ;;
  *) echo "usage: $0 asan|tsan" >&2; exit 2 ;;
esac
# nvcc splits -Xcompiler values at commas: one -Xcompiler per flag, and no commas inside a flag.
cuda_flags=""
for f in $flags; do cuda_flags+=" -Xcompiler=$f"; done
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-$kind}
jobs=${JOBS:-2}
supp=$root/tools/sanitize
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# Host-side targets only: the benchmarks are GPU programs and have no host tests.
targets=(test_core test_c_api test_c_api_shared test_formats test_layouts test_layouts_emu test_emulation test_reliability
         test_dispatch scalemm_cli scalemm_c scalemm_fuzz)

t0=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ -DCMAKE_CUDA_HOST_COMPILER=g++ \
  -DSCALEMM_CUDA_ARCHITECTURES="${SCALEMM_CUDA_ARCHITECTURES:-90}" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_CUDA_FLAGS="$cuda_flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
t1=$(date +%s)
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
t2=$(date +%s)

# Sanitizer runtime settings: stop at the first report, with a symbolized stack.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
# The consumer test configures a new project against the installed (instrumented) archives.
export CFLAGS="$flags" CXXFLAGS="$flags" LDFLAGS="$flags" CUDAFLAGS="$cuda_flags"

# test_layouts_emu runs the GPU kernels on ucontext coroutines (one OS thread, thousands of stack
# switches): its 300 s CTest limit is too short under ASan's instrumentation, so it runs on its own
# below without that limit (and without ASan's fake stacks, which every switch would multiply).
# TSan does not follow swapcontext stack switches, and a single-threaded emulator has no race to find:
# it is not run under tsan.
emu="test_layouts_emu"
set +e
ctest --test-dir "$build" -L host -E "$emu" -j "${CTEST_JOBS:-$jobs}" --output-on-failure --timeout 900
rc=$?
if [ "$kind" = asan ]; then
  te=$(date +%s)
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_stack_use_after_return=0" "$build/tests/layouts/$emu"
  erc=$?
  echo "sanitize $kind: $emu exit $erc in $(( $(date +%s) - te )) s"
  [ $erc -eq 0 ] || rc=1
fi
set -e
t3=$(date +%s)
echo "sanitize $kind: $([ $rc -eq 0 ] && echo PASS || echo FAIL) (configure $((t1 - t0)) s, build $((t2 - t1)) s, ctest -L host $((t3 - t2)) s, total $((t3 - t0)) s; commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
exit $rc
