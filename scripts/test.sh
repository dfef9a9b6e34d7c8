#!/usr/bin/env bash
# Builds cohort and runs the whole test suite with ctest; exits non-zero on any failure.
#
#   ./scripts/test.sh              Release build in build/, all tests
#   ./scripts/test.sh --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
#   ./scripts/test.sh --tsan       ThreadSanitizer build in build-tsan/
#   ./scripts/test.sh -- -R Future extra arguments after `--` go to ctest (here: only tests matching Future)
#
# Environment: COHORT_BUILD_DIR overrides the build directory, COHORT_JOBS the parallelism (2);
# the build is configured by scripts/configure.sh, as demo.sh's is: COHORT_WERROR=ON turns warnings
# into errors, COHORT_CMAKE_ARGS adds configure arguments (e.g. "-DCOHORT_USE_MPI=OFF").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=release
ctest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sanitize|--asan) mode=asan ;;
    --tsan) mode=tsan ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

jobs=${COHORT_JOBS:-2}
# Arguments on top of scripts/configure.sh's (the release build has none: demo.sh's build is this one).
cmake_args=()
case "$mode" in
  release) build=${COHORT_BUILD_DIR:-build} ;;
  asan)
    build=${COHORT_BUILD_DIR:-build-asan}
    # -O1 keeps sanitized builds and runs reasonably fast while keeping stacks readable.
    cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g"
                -DCOHORT_SANITIZE_ADDRESS=ON -DCOHORT_SANITIZE_THREAD=OFF)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # LeakSanitizer's exit-time scan crashes ("Tracer caught signal 11") when libgomp worker
    # threads exist (oneDNN's GEMM with more than one OpenMP thread); one thread avoids that.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    ;;
  tsan)
    build=${COHORT_BUILD_DIR:-build-tsan}
    cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g"
                -DCOHORT_SANITIZE_THREAD=ON -DCOHORT_SANITIZE_ADDRESS=OFF)
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    ;;
esac

./scripts/setup.sh

echo "test.sh: configuring $build ($mode)"
source scripts/configure.sh
cohort_configure "$build" "${cmake_args[@]}"
echo "test.sh: building with $jobs jobs"
cmake --build "$build" --parallel "$jobs"
echo "test.sh: running tests"
ctest --test-dir "$build" --output-on-failure --no-tests=error --parallel "$jobs" "${ctest_args[@]}"
echo "test.sh: all tests passed ($mode)"
