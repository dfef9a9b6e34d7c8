#!/usr/bin/env bash
# Training across RPC workers, cohort (bench/dist_autograd.cc) and PyTorch 1.13's distributed
# autograd + DistributedOptimizer (bench/dist_autograd_torch.py), the same two-stage model, both
# measured in this one invocation: REPEAT rounds, each running cohort then PyTorch, so both see
# the same machine. One table follows with each size's median step time over the rounds for
# both, side by side, and their ratio; nothing in it comes from an earlier run.
#
#   ./scripts/bench_dist_autograd.sh                 REPEAT=3 rounds, the programs' defaults inside
#   BUILD_DIR=build ./scripts/bench_dist_autograd.sh use a build configured with -DCOHORT_BUILD_BENCHMARKS=ON
#   ARGS="--steps 20 --reps 3" ./scripts/bench_dist_autograd.sh    arguments both programs take
#   NO_TORCH=1 ./scripts/bench_dist_autograd.sh      cohort alone
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
repeat="${REPEAT:-3}"
read -r -a args <<<"${ARGS:-}"
py=/usr/bin/python3  # Debian's python3-torch; the python3 first on PATH may lack torch

# shellcheck source=scripts/bench_lib.sh
source "$root/scripts/bench_lib.sh"
bench_build "$build" cohort_bench_dist_autograd
with_torch=$(bench_with_torch "$py" torch.distributed.autograd bench_dist_autograd)

results="$(mktemp)"
bench_header
for ((round = 1; round <= repeat; round++)); do
  bench_run "$build/bench/dist_autograd" "${args[@]}"
  if [[ $with_torch == 1 ]]; then bench_run "$py" "$root/bench/dist_autograd_torch.py" "${args[@]}"; fi
done

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
impls = list(dict.fromkeys(r["impl"] for r in rows))
models = list(dict.fromkeys(r["model"] for r in rows))
def med(impl, model):
    return statistics.median(r["ms_step"] for r in rows if r["impl"] == impl and r["model"] == model)
print(f"\nMedian ms per training step over {sum(1 for r in rows if r['impl'] == impls[0] and r['model'] == models[0])} "
      "rounds; every column measured in this run.\n")
print("| model | " + " | ".join(impls) + (" | cohort / torch |" if len(impls) == 2 else " |"))
print("|---|" + "---:|" * (len(impls) + (1 if len(impls) == 2 else 0)))
for m in models:
    vals = [med(i, m) for i in impls]
    line = f"| {m} | " + " | ".join(f"{v:.2f}" for v in vals)
    if len(impls) == 2:
        line += f" | {vals[0] / vals[1]:.2f}×"
    print(line + " |")
PY
rm -f "$results"
