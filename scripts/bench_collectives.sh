#!/usr/bin/env bash
# Collectives benchmark, nccl-tests style, side by side in one run: cohort's gloo, mpi (and shm) backends
# (bench/collectives.cc), bare gloo (bench/collectives_gloo_baseline.cc), bare OpenMPI
# (bench/collectives_mpi_baseline.cc) and one core's memcpy, every op from 4 B to 64 MiB; then the mpi
# backend against bare MPI alternating in one process (bench/mpi_side_by_side.cc).
# All programs are started by mpirun (cohort's ranks find each other through initProcessGroup's
# OpenMPI detection; the bare gloo program only reads mpirun's rank variables).
#
#   ./scripts/bench_collectives.sh                  2 ranks, every op, 4 B .. 64 MiB
#   ./scripts/bench_collectives.sh --np 3 --ops allreduce --max-bytes 1048576
#   OUT=dir ./scripts/bench_collectives.sh          also keep each program's raw output in dir
#   REPEAT=3 ./scripts/bench_collectives.sh         3 interleaved runs; each row keeps its fastest
#
# Options other than --np go to every program (see `build-bench/bench/collectives --help`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
np=2
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  source "$root/scripts/configure.sh"
  cohort_configure "$build" >/dev/null
fi
cmake --build "$build" -j "${JOBS:-2}" --target cohort_bench_collectives cohort_bench_collectives_mpi \
  cohort_bench_collectives_gloo cohort_bench_mpi_side_by_side

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np "$np" --oversubscribe)
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $np ranks" | tee "$out/meta.txt"

# REPEAT=n runs the four programs n times, interleaved, and the table keeps each row's fastest
# run: on a shared machine the least-disturbed run is the one closest to what the code can do, and
# interleaving exposes cohort and its baseline to the same neighbours.
for ((rep = 1; rep <= ${REPEAT:-1}; rep++)); do
  memcpy=(); [[ $rep -gt 1 ]] && memcpy=(--no-memcpy)
  "${mpi[@]}" "$build/bench/collectives" --backend gloo "${memcpy[@]}" "${args[@]}" | tee "$out/cohort_gloo.$rep.txt"
  "${mpi[@]}" "$build/bench/collectives" --backend mpi --no-memcpy "${args[@]}" | tee "$out/cohort_mpi.$rep.txt"
  if grep -qx shm <<<"$("$build/bench/collectives" --list-backends 2>/dev/null)"; then
    "${mpi[@]}" "$build/bench/collectives" --backend shm --no-memcpy "${args[@]}" | tee "$out/cohort_shm.$rep.txt"
  fi
  "${mpi[@]}" "$build/bench/collectives_mpi_baseline" "${args[@]}" | tee "$out/mpi.$rep.txt"
  store="$(mktemp -d)"
  "${mpi[@]}" "$build/bench/collectives_gloo_baseline" --store-dir "$store" "${args[@]}" | tee "$out/gloo.$rep.txt"
  rm -rf "$store"
done

python3 "$root/scripts/bench_collectives_table.py" "$out"
# The ratio the mpi bar is judged by: cohort's mpi backend and bare MPI alternating in one process
# on the same tensors (separate programs run minutes apart drift on a shared host).
echo
echo "cohort mpi / bare MPI, alternating in one process (bench/mpi_side_by_side.cc):"
"${mpi[@]}" "$build/bench/mpi_side_by_side" "${args[@]}" | tee "$out/mpi_side_by_side.txt"
[[ -n "${OUT:-}" ]] || rm -rf "$out"
