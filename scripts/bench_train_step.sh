#!/usr/bin/env bash
# Training step of the reference models, cohort (bench/train_step.cc) and PyTorch 1.13
# (bench/torch_train_step.py), float32 and under bfloat16 autocast, all measured in this one
# invocation: REPEAT rounds, each running cohort float32, PyTorch float32, cohort bf16 and PyTorch
# bf16, so all see the same machine. One table follows with each configuration's median step time
# (process CPU time, one thread) and peak step memory over the rounds, and cohort's ratio to
# PyTorch; nothing in it comes from an earlier run.
#
#   ./scripts/bench_train_step.sh                      REPEAT=2 rounds, the GPT (MODEL=mlp|gpt|all)
#   BUILD_DIR=build ./scripts/bench_train_step.sh      an existing build with benchmarks
#   STEPS=18 ./scripts/bench_train_step.sh             --steps for both programs (the GPT runs STEPS/3)
#   NO_TORCH=1 ./scripts/bench_train_step.sh           cohort alone
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
repeat="${REPEAT:-2}"
model="${MODEL:-gpt}"
steps="${STEPS:-18}"
py=/usr/bin/python3  # Debian's python3-torch; the python3 first on PATH may lack torch

# shellcheck source=scripts/bench_lib.sh
source "$root/scripts/bench_lib.sh"
bench_build "$build" cohort_bench_train_step
with_torch=$(bench_with_torch "$py" torch bench_train_step)

results="$(mktemp)"
bench_header
for ((round = 1; round <= repeat; round++)); do
  for amp in none bf16; do
    BENCH_EXTRA=', "impl": "cohort"' bench_run "$build/bench/train_step" --model "$model" --steps "$steps" --amp "$amp"
    if [[ $with_torch == 1 ]]; then
      BENCH_EXTRA=', "impl": "torch"' bench_run "$py" "$root/bench/torch_train_step.py" --model "$model" \
        --steps "$steps" --amp "$amp" 2>/dev/null
    fi
  done
done

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = list(dict.fromkeys((r["model"], r["amp"]) for r in rows))
def med(impl, key, field):
    v = [r[field] for r in rows if r["impl"] == impl and (r["model"], r["amp"]) == key]
    return statistics.median(v) if v else None
print("\nMedian over the rounds; every column measured in this run. Step peak: the most a step "
      "allocated above what was live when it began (cohort's allocator; PyTorch's profiler).\n")
print("| model | amp | cohort ms/step | PyTorch ms/step | cohort / PyTorch | cohort step peak MiB | PyTorch step peak MiB |")
print("|---|---|---:|---:|---:|---:|---:|")
for key in keys:
    c, t = med("cohort", key, "ms_per_step"), med("torch", key, "ms_per_step")
    cp, tp = med("cohort", key, "step_peak_mb"), med("torch", key, "step_peak_mb")
    ratio = f"{c / t:.2f}×" if c and t else "-"
    fmt = lambda v, d: "-" if v is None else f"{v:.{d}f}"
    print(f"| {key[0]} | {key[1]} | {fmt(c, 1)} | {fmt(t, 1)} | {ratio} | {fmt(cp, 1)} | {fmt(tp, 1)} |")
PY
