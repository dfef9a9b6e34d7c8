#!/usr/bin/env bash
# The one way cohort's scripts configure a build directory (demo.sh, test.sh and lint.sh source it):
#
#   source scripts/configure.sh && cohort_configure <build dir> [extra cmake arguments...]
#   ./scripts/configure.sh [<build dir> [extra cmake arguments...]]     (the checkout's build/ by default)
#
# Every call gives CMake the same generator (Ninja when it is installed; an existing build keeps
# its own), the same cache variables (Release; tests, examples and benchmarks on) and the same
# compiler launcher (ccache, with CCACHE_BASEDIR at the checkout so that checkouts share cache
# entries), so the build that one script configured is the build the next one reuses. Extra
# arguments come last and win (test.sh's sanitizer builds change the build type that way).
#
# Environment: COHORT_WERROR=ON turns compiler warnings into errors (.ci/run sets it; OFF by
# default); COHORT_CMAKE_ARGS adds configure arguments (e.g. "-DCOHORT_USE_MPI=OFF").

cohort_configure() {
  if [[ $# -lt 1 ]]; then
    echo "cohort_configure: usage: cohort_configure <build dir> [extra cmake arguments...]" >&2
    return 2
  fi
  local build=$1
  shift
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

  local werror=${COHORT_WERROR:-OFF}
  case "${werror^^}" in
    ON | 1 | TRUE | YES) werror=ON ;;
    OFF | 0 | FALSE | NO | "") werror=OFF ;;
    *)
      echo "cohort_configure: COHORT_WERROR='$werror' is not ON or OFF" >&2
      return 2
      ;;
  esac

  local args=(-DCMAKE_BUILD_TYPE=Release -DCOHORT_BUILD_TESTS=ON -DCOHORT_BUILD_EXAMPLES=ON
    -DCOHORT_BUILD_BENCHMARKS=ON -DCOHORT_WERROR="$werror")
  if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
  if command -v ccache >/dev/null; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    # Exported, so the builds this shell runs next see it too. ccache then hands the compiler paths
    # relative to the build folder; the build maps both forms away in __FILE__ (CMakeLists.txt).
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  else
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER=)
  fi
  # shellcheck disable=SC2206
  args+=("$@" ${COHORT_CMAKE_ARGS:-})

  echo "configure.sh: configuring $build (COHORT_WERROR=$werror)"
  cmake -S "$root" -B "$build" "${args[@]}"
}

# Run directly rather than sourced: configure one build directory.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case "${1:-}" in
    -h | --help)
      sed -n '2,14p' "$0"
      exit 0
      ;;
  esac
  build=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
  [[ $# -gt 0 ]] && shift
  cohort_configure "$build" "$@"
fi
