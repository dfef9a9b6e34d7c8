#!/usr/bin/env bash
# ctest's launcher for the MPI test binary (the CROSSCOMPILING_EMULATOR of mpi_test, set in
# tests/CMakeLists.txt), so that every case gets its own ctest entry per world size:
#   mpirun_case.sh MPIEXEC NP ENV BINARY --gtest_list_tests
#       lists the cases as an NP-rank job names them (parameterised names carry the world size,
#       which the binary reads from OMPI_COMM_WORLD_SIZE), in one process without mpirun;
#   mpirun_case.sh MPIEXEC NP ENV BINARY ARGS...
#       runs BINARY ARGS (one case: --gtest_filter=...) as NP ranks under mpirun.
# ENV is VAR=VALUE exported to every rank, or "-" for none.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 MPIEXEC NP ENV BINARY [ARGS...]" >&2
  exit 2
fi
mpiexec=$1 np=$2 env=$3 bin=$4
shift 4
for a in "$@"; do
  if [[ $a == --gtest_list_tests ]]; then
    OMPI_COMM_WORLD_SIZE=$np exec "$bin" "$@"
  fi
done
x=()
[[ $env != - ]] && x=(-x "$env")
# As root mpirun needs --allow-run-as-root; more ranks than cores need --oversubscribe.
exec "$mpiexec" -np "$np" --allow-run-as-root --oversubscribe "${x[@]}" "$bin" "$@"
