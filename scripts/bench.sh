#!/usr/bin/env bash
# Builds the benchmark programs (bench/) and runs them: GEMM against every BLAS on this machine,
# then elementwise/reduction kernels against memcpy. Figures go to stdout and, with --out DIR,
# to DIR/gemm.txt and DIR/elementwise.txt. See docs/benchmarks.md for the recorded results.
#
#   ./scripts/bench.sh                      build (build-bench/) and run both
#   ./scripts/bench.sh gemm --sizes 1024    run one program with its own arguments
#   BUILD_DIR=... JOBS=2 ./scripts/bench.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
jobs="${JOBS:-1}"
out=""
if [[ "${1:-}" == "--out" ]]; then
  out="$2"
  shift 2
  mkdir -p "$out"
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  source "$root/scripts/configure.sh"
  cohort_configure "$build" >/dev/null
fi
cmake --build "$build" -j "$jobs" --target cohort_bench_gemm cohort_bench_elementwise

# The benchmarks measure one thread; cohort sets its own BLAS kernels, so nothing else is set here.
unset OPENBLAS_CORETYPE
run() {
  local name="$1"
  shift
  echo "== $name $* ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
  if [[ -n "$out" ]]; then
    "$build/bench/$name" "$@" | tee "$out/$name.txt"
  else
    "$build/bench/$name" "$@"
  fi
}

if [[ $# -gt 0 ]]; then
  prog="$1"
  shift
  run "$prog" "$@"
else
  run gemm
  echo
  run elementwise
fi
