#!/usr/bin/env bash
# Launcher start-up: wall time from starting the launcher until every worker has returned from
# initProcessGroup, for 2, 4 and 8 workers on this node, cohortrun next to torchrun (PyTorch 1.13,
# Debian's python3-torch; it needs --redirects 1 --tee 1 on this Python).
#   cohortrun                 cohortrun --standalone, C++ worker bench/launcher_init.cc
#   torchrun, same worker     torchrun --standalone --no_python, the same C++ worker (launcher cost alone)
#   torchrun, Python worker   torchrun --standalone, bench/launcher_init_torch.py (what PyTorch users pay)
# Each figure is the median of REPS runs, the three launchers interleaved. Prints a markdown table.
#   scripts/bench_launcher.sh [BUILD_DIR (build)] [REPS (5)]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
reps=${2:-5}
cohortrun=$build/bin/cohortrun
worker=$build/bench/launcher_init
for f in "$cohortrun" "$worker"; do
  [[ -x $f ]] || { echo "bench_launcher.sh: $f is missing: ninja -C $build cohortrun cohort_bench_launcher_init" >&2; exit 1; }
done
torchrun=(/usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --standalone)
export OMP_NUM_THREADS=1  # set, so neither launcher prints its one-thread notice

# ms from launch until the last of n workers printed init_done_ns; fails unless all n did.
measure() {
  local n=$1
  shift
  local t0 out last count
  t0=$(date +%s%N)
  out=$(timeout 120 "$@" 2>&1) || { echo "bench_launcher.sh: failed: $*" >&2; echo "$out" >&2; exit 1; }
  count=$(grep -c 'init_done_ns' <<<"$out" || true)
  [[ $count -eq $n ]] || { echo "bench_launcher.sh: $count of $n workers initialised: $*" >&2; echo "$out" >&2; exit 1; }
  last=$(grep -o 'init_done_ns [0-9]*' <<<"$out" | awk '{print $2}' | sort -n | tail -1)
  awk -v a="$last" -v b="$t0" 'BEGIN { printf "%.0f\n", (a - b) / 1e6 }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load before: $(uptime)"
echo
echo "| workers | cohortrun | torchrun, same C++ worker | torchrun, Python worker |"
echo "|---|---|---|---|"
for n in 2 4 8; do
  a=() b=() c=()
  for ((i = 0; i < reps; ++i)); do
    a+=("$(measure "$n" "$cohortrun" --standalone --nproc-per-node "$n" "$worker")")
    b+=("$(measure "$n" "${torchrun[@]}" --nproc_per_node "$n" --no_python "$worker")")
    c+=("$(measure "$n" "${torchrun[@]}" --nproc_per_node "$n" bench/launcher_init_torch.py)")
  done
  printf '| %d | %s ms | %s ms | %s ms |\n' "$n" "$(printf '%s\n' "${a[@]}" | median)" \
    "$(printf '%s\n' "${b[@]}" | median)" "$(printf '%s\n' "${c[@]}" | median)"
  echo "  (runs, ms: cohortrun ${a[*]}; torchrun C++ ${b[*]}; torchrun Python ${c[*]})" >&2
done
echo
echo "load after: $(uptime)"
