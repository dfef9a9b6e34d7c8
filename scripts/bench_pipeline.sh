#!/usr/bin/env bash
# Pipeline-parallel GPT training, cohort (bench/pipeline.cc: every schedule, two one-thread ranks)
# and PyTorch 1.13's Pipe (bench/pipeline_torch.py: GPipe, a worker thread per device as shipped and
# one per partition), the same model, batches and micro-batches, both measured in this one
# invocation: REPEAT rounds, each running cohort then PyTorch, so a drift in the machine's speed
# falls on both. A table follows with each configuration's median samples/s over the rounds (and
# the median of the one-thread, no-pipeline run each program measures alongside), then cohort's
# best schedule over PyTorch Pipe's best configuration; nothing in it comes from an earlier run.
#
#   ./scripts/bench_pipeline.sh                   REPEAT=2 rounds, the programs' defaults inside
#   BUILD_DIR=build-bench ./scripts/bench_pipeline.sh    another build (benchmarks on)
#   ARGS="--steps 10 --microbatches 4" ./scripts/bench_pipeline.sh   arguments both programs take
#   COHORT_ARGS="--transport rpc" TORCH_ARGS="--checkpoint except_last" ./scripts/bench_pipeline.sh
#   COHORT_ARGS="--cpu-bind cores,none" ./scripts/bench_pipeline.sh   bound and unbound ranks, side by side
#   NO_TORCH=1 ./scripts/bench_pipeline.sh        cohort alone
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
repeat="${REPEAT:-2}"
read -r -a args <<<"${ARGS:-}"
read -r -a cohort_args <<<"${COHORT_ARGS:-}"
read -r -a torch_args <<<"${TORCH_ARGS:-}"
py=/usr/bin/python3  # Debian's python3-torch; the python3 first on PATH may lack torch
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# shellcheck source=scripts/bench_lib.sh
source "$root/scripts/bench_lib.sh"
JOBS="${JOBS:-2}" bench_build "$build" cohort_bench_pipeline
with_torch=$(bench_with_torch "$py" torch.distributed.pipeline.sync bench_pipeline)

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
bench_header
for ((round = 1; round <= repeat; round++)); do
  bench_run "$build/bench/pipeline" "${args[@]}" "${cohort_args[@]}"
  if [[ $with_torch == 1 ]]; then bench_run "$py" "$root/bench/pipeline_torch.py" "${args[@]}" "${torch_args[@]}"; fi
done
echo "# done, load $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def key(r):
    if r.get("impl", "cohort") == "cohort":  # bound ranks (--cpu-bind cores) get a row of their own
        return ("cohort", r["schedule"] + (", bound" if r.get("cpu_bind") == "cores" else ""))
    return (r["impl"], f'{r["schedule"]}, {r.get("workers", "")} workers')
configs = list(dict.fromkeys(key(r) for r in rows))
def med(k, field):
    return statistics.median(r[field] for r in rows if key(r) == k)
rounds = sum(1 for r in rows if key(r) == configs[0])
print(f"\nMedians over {rounds} rounds, every row measured in this run. single = the same model trained "
      "without a pipeline on one thread by the same program (cohort: alternating with the pipeline's steps, "
      "so the speedup is the median of each round's own ratio).\n")
print("| impl | schedule | samples/s | single samples/s | speedup over single |")
print("|---|---|---:|---:|---:|")
for k in configs:
    s, one = med(k, "samples_s"), med(k, "single_samples_s")
    print(f"| {k[0]} | {k[1]} | {s:.2f} | {one:.2f} | {med(k, 'speedup'):.2f}× |")
cohort = [k for k in configs if k[0] == "cohort"]
torch = [k for k in configs if k[0] != "cohort"]
if cohort and torch:
    best_c = max(cohort, key=lambda k: med(k, "samples_s"))
    best_t = max(torch, key=lambda k: med(k, "samples_s"))
    c, t = med(best_c, "samples_s"), med(best_t, "samples_s")
    print(f"\ncohort best ({best_c[1]}) / torch Pipe best ({best_t[1]}): {c:.2f} / {t:.2f} = {c / t:.2f}× "
          f"(goal >= 1.3×: {'met' if c / t >= 1.3 else 'NOT met'})")
PY
