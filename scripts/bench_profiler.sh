#!/usr/bin/env bash
# What the profiler costs, side by side in this one invocation, on the reference GPT training step
# (bench/train_step.cc, one thread, process CPU time): REPEAT rounds, each running
#   - a build without the profiler (BASE_BUILD_DIR, a build of an earlier revision; optional),
#   - cohort with the profiler off, and on with memory and shapes recorded,
#   - PyTorch 1.13 without and with torch.profiler (profile_memory=True, record_shapes=True),
# then bench/profiler_trace: 1,000 train_digits steps recorded and their Chrome trace written.
# One table follows with the medians and each profiler's cost relative to its own "off" run.
#
#   BUILD_DIR=build ./scripts/bench_profiler.sh
#   BASE_BUILD_DIR=/tmp/base/build BUILD_DIR=build REPEAT=3 ./scripts/bench_profiler.sh
#   (a base build: git worktree add /tmp/base <rev>; ./scripts/configure.sh /tmp/base/build;
#    ninja -C /tmp/base/build cohort_bench_train_step)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
base="${BASE_BUILD_DIR:-}"
repeat="${REPEAT:-2}"
steps="${STEPS:-18}"
py=/usr/bin/python3

# shellcheck source=scripts/bench_lib.sh
source "$root/scripts/bench_lib.sh"
bench_build "$build" cohort_bench_train_step
bench_build "$build" cohort_bench_profiler_trace
with_torch=$(bench_with_torch "$py" torch bench_profiler)
if [[ -n "$base" && ! -x "$base/bench/train_step" ]]; then
  echo "bench_profiler: BASE_BUILD_DIR=$base has no bench/train_step; build it first" >&2
  exit 1
fi

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
bench_header
for ((round = 1; round <= repeat; round++)); do
  if [[ -n "$base" ]]; then
    BENCH_EXTRA=', "impl": "cohort without profiler", "profiler": "absent"' bench_run "$base/bench/train_step" \
      --model gpt --steps "$steps"
  fi
  for mode in off on; do
    BENCH_EXTRA=', "impl": "cohort"' bench_run "$build/bench/train_step" --model gpt --steps "$steps" --profiler "$mode"
    if [[ $with_torch == 1 ]]; then
      BENCH_EXTRA=', "impl": "torch"' bench_run "$py" "$root/bench/torch_train_step.py" --model gpt --steps "$steps" \
        --profiler "$mode" 2>/dev/null
    fi
  done
done
BENCH_EXTRA=', "impl": "trace"' bench_run "$build/bench/profiler_trace"

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(impl, prof):
    v = [r["ms_per_step"] for r in rows if r["impl"] == impl and r.get("profiler") == prof]
    return statistics.median(v) if v else None
print("\nGPT training step, median over the rounds (process CPU time, one thread); every row measured in this run.\n")
print("| configuration | ms/step | vs. profiler off |")
print("|---|---:|---:|")
off = {"cohort": med("cohort", "off"), "torch": med("torch", "off")}
for impl, prof, label in [("cohort without profiler", "absent", "cohort, a build without the profiler"),
                          ("cohort", "off", "cohort, profiler off"), ("cohort", "on", "cohort, profiler on (memory, shapes)"),
                          ("torch", "off", "PyTorch 1.13"), ("torch", "on", "PyTorch 1.13, profiler on (profile_memory, record_shapes)")]:
    m = med(impl, prof)
    if m is None:
        continue
    ref = off["torch" if impl == "torch" else "cohort"]
    print(f"| {label} | {m:.1f} | {m / ref - 1:+.1%} |" if ref else f"| {label} | {m:.1f} | - |")
for r in rows:
    if r["impl"] == "trace":
        print(f"\nTrace of {r['steps']} train_digits steps: {r['events']} events, {r['trace_bytes'] / 2**20:.1f} MiB "
              f"({r['bytes_per_step']} bytes per step), written in {r['write_ms']:.0f} ms.")
PY
