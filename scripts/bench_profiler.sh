#!/usr/bin/env bash
# What the profiler costs, on the reference GPT training step (bench/train_step.cc, one thread,
# process CPU time), all measured in this one invocation. REPEAT rounds, each running
#   - a build without the profiler (BASE_BUILD_DIR, a build of an earlier revision; optional) and
#     cohort with the profiler off, in their own processes: the cost of the profiler when off;
#   - cohort with --profiler paired: PAIRS steps without and with a profile (memory and shapes)
#     alternating in one process, the cost when on as the median of the per-pair ratios;
#   - PyTorch 1.13 the same way with torch.profiler (profile_memory=True, record_shapes=True);
# then bench/profiler_trace: 1,000 train_digits steps recorded and their Chrome trace written.
# On shared machines a step's time varies 10-15% between processes, so the "on" cost is only
# measured within a process, pair by pair. One table follows with the medians over the rounds.
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
pairs="${PAIRS:-10}"
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
  BENCH_EXTRA=', "impl": "cohort"' bench_run "$build/bench/train_step" --model gpt --steps "$steps" --profiler off
  # train_step and torch_train_step.py time steps/3 GPT steps (pairs here).
  BENCH_EXTRA=', "impl": "cohort"' bench_run "$build/bench/train_step" --model gpt --steps "$((pairs * 3))" \
    --profiler paired
  if [[ $with_torch == 1 ]]; then
    BENCH_EXTRA=', "impl": "torch"' bench_run "$py" "$root/bench/torch_train_step.py" --model gpt \
      --steps "$((pairs * 3))" --profiler paired 2>/dev/null
  fi
done
BENCH_EXTRA=', "impl": "trace"' bench_run "$build/bench/profiler_trace"

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def pick(impl, prof, paired):
    return [r for r in rows if r["impl"] == impl and r.get("profiler") == prof and bool(r.get("paired")) == paired]
def med(impl, prof, paired=False, key="ms_per_step"):
    v = [r[key] for r in pick(impl, prof, paired)]
    return statistics.median(v) if v else None

print("\nGPT training step, medians over the rounds (process CPU time, one thread); every row measured in this run.\n")
print("Off: separate processes.\n")
print("| configuration | ms/step | vs. profiler off |")
print("|---|---:|---:|")
off = med("cohort", "off")
for impl, prof, label in [("cohort without profiler", "absent", "cohort, a build without the profiler"),
                          ("cohort", "off", "cohort, profiler off")]:
    m = med(impl, prof)
    if m is not None:
        print(f"| {label} | {m:.1f} | {m / off - 1:+.1%} |")

print("\nOn: steps without and with a profile alternating in one process. Overhead: the median of every")
print("per-pair ratio of the run (all rounds pooled), with the range of the rounds' own medians.\n")
print("| configuration | pairs | ms/step off | ms/step on | overhead | rounds' medians |")
print("|---|---:|---:|---:|---:|---:|")
notes = []
for impl, label in [("cohort", "cohort, memory and shapes"),
                    ("torch", "PyTorch 1.13, profile_memory and record_shapes")]:
    on = pick(impl, "on", True)
    if not on:
        continue
    ratios = [x for r in on for x in r["ratios"]]
    rounds = sorted(r["overhead_pct"] for r in on)
    print(f"| {label} | {len(ratios)} | {med(impl, 'off', True):.1f} | {med(impl, 'on', True):.1f} | "
          f"{100 * (statistics.median(ratios) - 1):+.2f}% | {rounds[0]:+.1f}% to {rounds[-1]:+.1f}% |")
    if "spans_per_step" in on[0]:
        notes.append(f"cohort records {on[0]['spans_per_step']} spans and {on[0]['memory_events_per_step']} memory "
                     f"events per GPT step; its trace is {on[0]['trace_bytes_per_step']:,} bytes per step.")
for n in notes:
    print("\n" + n)
for r in rows:
    if r["impl"] == "trace":
        print(f"\nTrace of {r['steps']} train_digits steps: {r['events']} events, {r['trace_bytes'] / 2**20:.1f} MiB "
              f"({r['bytes_per_step']} bytes per step), written in {r['write_ms']:.0f} ms; those steps took "
              f"{r['train_ms_per_step']:.3f} ms unprofiled and {r['train_profiled_ms_per_step']:.3f} ms profiled.")
PY
