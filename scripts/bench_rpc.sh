#!/usr/bin/env bash
# RPC between two processes on this host, cohort (bench/rpc.cc) and PyTorch 1.13's RPC over
# TensorPipe (bench/rpc_torch.py), both measured in this one invocation: REPEAT rounds, each
# running cohort then PyTorch, so both see the same machine. One table follows with each
# figure's median over the rounds for both, side by side, and their ratio; nothing in it comes
# from an earlier run.
#
#   ./scripts/bench_rpc.sh                       REPEAT=3 rounds, 3 repetitions inside each program
#   REPEAT=5 REPS=3 ITERS=2000 CONCURRENT=10000 ./scripts/bench_rpc.sh   (the defaults but REPEAT)
#   BUILD_DIR=build ./scripts/bench_rpc.sh       use a build configured with -DCOHORT_BUILD_BENCHMARKS=ON
#   OUT=dir ./scripts/bench_rpc.sh               keep the raw JSON lines (results.jsonl) in dir
#   NO_TORCH=1 ./scripts/bench_rpc.sh            cohort alone (no PyTorch column)
# Both programs make the same calls: ITERS tiny calls, 20 sends and 20 echoes of 16 MiB, and
# CONCURRENT async calls per repetition. cohort-only options go through COHORT_ARGS (e.g.
# COHORT_ARGS="--copy-threads 1" or "--no-shm").
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
repeat="${REPEAT:-3}"
reps="${REPS:-3}"
common=(--reps "$reps" --iters "${ITERS:-2000}" --concurrent "${CONCURRENT:-10000}" --json)
py=/usr/bin/python3  # Debian's python3-torch; the python3 first on PATH may lack torch
read -r -a cohort_args <<<"${COHORT_ARGS:-}"

# shellcheck source=scripts/bench_lib.sh
source "$root/scripts/bench_lib.sh"
bench_build "$build" cohort_bench_rpc
with_torch=$(bench_with_torch "$py" torch.distributed.rpc bench_rpc)

out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"
bench_header | tee "$out/meta.txt"

# Runs one program; its JSON line gets the round and the 1-minute load.
run() {
  local round="$1"; shift
  BENCH_EXTRA=", \"round\": $round, \"load\": $(cut -d' ' -f1 /proc/loadavg)" bench_run "$@"
}

for ((round = 1; round <= repeat; round++)); do
  run "$round" "$build/bench/rpc" "${common[@]}" "${cohort_args[@]}"
  if [[ $with_torch == 1 ]]; then
    run "$round" "$py" "$root/bench/rpc_torch.py" "${common[@]}"
  fi
done

python3 - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
impls = []
for r in rows:
    if r["impl"] not in impls:
        impls.append(r["impl"])
label = {r["impl"]: r["label"] for r in rows}
runs = {i: [r for r in rows if r["impl"] == i] for i in impls}

def med(impl, key):
    return statistics.median(r[key] for r in runs[impl])

figures = [  # key, what, unit, format, higher is better
    ("tiny_us", "tiny rpcSync round trip", "µs", "{:.1f}", False),
    ("tiny_p50_us", "  its p50 over all calls", "µs", "{:.1f}", False),
    ("tiny_p99_us", "  its p99 over all calls", "µs", "{:.1f}", False),
    ("send16_ms", "16 MiB tensor sent, callee returns its size", "ms", "{:.2f}", False),
    ("send16_gbs", "  as bandwidth", "GB/s", "{:.2f}", True),
    ("echo16_ms", "16 MiB tensor echoed back", "ms", "{:.2f}", False),
    ("concurrent_calls_s", f"{rows[0]['concurrent']} concurrent async calls", "calls/s", "{:,.0f}", True),
]
loads = [r["load"] for r in rows]
print(f"\nMedians over {len(runs[impls[0]])} rounds (each program's own median of {rows[0]['reps']} repetitions "
      f"per round), load {min(loads):.1f}-{max(loads):.1f}; every column measured in this run.\n")
head = "| figure | unit | " + " | ".join(label[i] for i in impls)
if len(impls) == 2:
    head += " | cohort vs PyTorch"
print(head + " |")
print("|---|---|" + "---:|" * (len(impls) + (1 if len(impls) == 2 else 0)))
for key, what, unit, fmt, higher in figures:
    vals = [med(i, key) for i in impls]
    line = f"| {what} | {unit} | " + " | ".join(fmt.format(v) for v in vals)
    if len(impls) == 2:
        c, t = vals
        ratio = c / t if higher else t / c
        line += f" | {ratio:.2f}x {'faster' if ratio >= 1 else 'slower'}"
    print(line + " |")
wrong = sum(r["wrong"] for r in rows)
if wrong:
    print(f"\nERROR: {wrong} concurrent calls returned wrong values")
    sys.exit(1)
PY
[[ -n "${OUT:-}" ]] || rm -rf "$out"
