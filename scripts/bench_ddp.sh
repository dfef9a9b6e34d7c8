#!/usr/bin/env bash
# DDP training step, cohort against PyTorch 1.13, side by side in one run (the goals: gloo at most
# PyTorch's DDP step; shm at most half of it and at least 1.6x one process's samples/s):
# MLP 784-1024-1024-10, batch 64 per rank, SGD, 2 ranks with one thread each, and one process
# without DDP. Each repetition runs, in turn:
#   cohort one process (bench/ddp --world 1)      PyTorch one process (bench/torch_ddp.py --world 1)
#   cohort DDP gloo                               PyTorch DDP gloo
#   cohort DDP shm                                cohort DDP shm with COHORT_COLLECTIVE_THREAD=worker
#   cohort DDP mpi (under mpirun, when built)
# every DDP program over each bucket cap in CAPS. The table keeps the median over repetitions of
# each program's medians, and prints those goals as ratios.
#
#   ./scripts/bench_ddp.sh                        REPEAT=3, CAPS=1,4,25, 50 timed steps
#   REPEAT=5 CAPS=25 STEPS=100 ./scripts/bench_ddp.sh
#   OUT=dir ./scripts/bench_ddp.sh                keep the raw JSON lines (results.jsonl) in dir
#   NO_MPI=1 / NO_SHM_WORKER=1                    skip those rows
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
repeat="${REPEAT:-3}"
caps="${CAPS:-1,4,25}"
steps="${STEPS:-50}"
warmup="${WARMUP:-10}"
py=/usr/bin/python3  # Debian's python3-torch; the python3 first on PATH may lack torch

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  source "$root/scripts/configure.sh"
  cohort_configure "$build" >/dev/null
fi
nice -n 19 cmake --build "$build" -j "${JOBS:-1}" --target cohort_bench_ddp

ddp="$build/bench/ddp"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
backends="$("$ddp" --list-backends)"
common=(--steps "$steps" --warmup "$warmup")
echo "# $(date -u '+%F %T UTC'), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$root" rev-parse --short HEAD)" |
  tee "$out/meta.txt"

# Runs one program; each JSON line it prints gets the repetition and the 1-minute load.
run() {
  local rep="$1"; shift
  local load; load="$(cut -d' ' -f1 /proc/loadavg)"
  "$@" | while IFS= read -r line; do
    [[ "$line" == \{* ]] || { echo "$line" >&2; continue; }
    echo "${line%\}}, \"rep\": $rep, \"load\": $load}" | tee -a "$results"
  done
}

for ((rep = 1; rep <= repeat; rep++)); do
  run "$rep" "$ddp" --world 1 "${common[@]}"
  run "$rep" "$py" "$root/bench/torch_ddp.py" --world 1 "${common[@]}"
  run "$rep" "$ddp" --backend gloo --bucket-cap-mb "$caps" "${common[@]}"
  run "$rep" "$py" "$root/bench/torch_ddp.py" --bucket-cap-mb "$caps" "${common[@]}"
  if grep -qx shm <<<"$backends"; then
    run "$rep" "$ddp" --backend shm --bucket-cap-mb "$caps" "${common[@]}"
    if [[ -z "${NO_SHM_WORKER:-}" ]]; then
      COHORT_COLLECTIVE_THREAD=worker run "$rep" "$ddp" --backend shm --label shm-worker --bucket-cap-mb "$caps" "${common[@]}"
    fi
  fi
  if [[ -z "${NO_MPI:-}" ]] && grep -qx mpi <<<"$backends" && command -v mpirun >/dev/null 2>&1; then
    run "$rep" mpirun -np 2 --oversubscribe --bind-to none "$ddp" --backend mpi --bucket-cap-mb "$caps" "${common[@]}"
  fi
done

"$py" - "$results" <<'EOF'
import collections, json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = collections.OrderedDict()
for r in rows:
    groups.setdefault((r["impl"], r["backend"], r["mode"], r["bucket_mb"]), []).append(r)

def med(rs, k):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(v) if v else None

def f(v, fmt="{:.2f}"):
    return "–" if v is None else fmt.format(v)

print("\n| impl | backend | bucket cap MiB | buckets | ms/step | samples/s | fwd / bwd / opt ms | CPU ms/step | "
      "exposed ms (hook + wait) | bare all-reduce ms | overlap | no-sync ms/step | exposed est. ms | overlap est. | load |")
print("|" + "---|" * 15)
summary = {}
for (impl, backend, mode, cap), rs in groups.items():
    m = {k: med(rs, k) for k in ("ms_step", "samples_s", "fwd_ms", "bwd_ms", "opt_ms", "cpu_ms", "hook_ms", "wait_ms",
                                  "exposed_ms", "bare_ms", "overlap", "ms_step_nocomm", "exposed_est_ms", "overlap_est",
                                  "buckets")}
    summary[(impl, backend, cap)] = m
    exposed = None if m["exposed_ms"] is None else f"{m['exposed_ms']:.2f} ({m['hook_ms']:.2f} + {m['wait_ms']:.2f})"
    loads = [r["load"] for r in rs]
    print(f"| {impl} | {backend} | {f(cap, '{:g}')} | {f(m['buckets'], '{:g}')} | **{f(m['ms_step'])}** | "
          f"{f(m['samples_s'], '{:.0f}')} | {f(m['fwd_ms'])} / {f(m['bwd_ms'])} / {f(m['opt_ms'])} | {f(m['cpu_ms'])} | "
          f"{exposed or '–'} | {f(m['bare_ms'])} | {f(m['overlap'])} | {f(m['ms_step_nocomm'])} | "
          f"{f(m['exposed_est_ms'])} | {f(m['overlap_est'])} | {min(loads):.1f}–{max(loads):.1f} ({len(rs)} runs) |")

torch_single = summary.get(("torch", "none", None), {}).get("ms_step")
single = summary.get(("cohort", "none", None), {}).get("samples_s")
caps = sorted({k[2] for k in summary if k[2] is not None})
print("\nGoals (medians over repetitions; PyTorch DDP gloo at the same bucket cap):")
for cap in caps:
    t = summary.get(("torch", "gloo", cap), {}).get("ms_step")
    for backend, goal in (("gloo", 1.0), ("shm", 0.5), ("shm-worker", 0.5), ("mpi", None)):
        c = summary.get(("cohort", backend, cap))
        if not c or not t:
            continue
        line = f"  cap {cap:g} MiB, cohort {backend}: {c['ms_step'] / t:.2f}x PyTorch's step time"
        if goal is not None:
            line += f" (goal <= {goal}x: {'met' if c['ms_step'] / t <= goal else 'MISSED'})"
        if backend.startswith("shm") and single:
            ratio = c["samples_s"] / single
            line += f"; {ratio:.2f}x the samples/s of one cohort process (goal >= 1.6x: {'met' if ratio >= 1.6 else 'MISSED'})"
        print(line)
if torch_single and single:
    print(f"  one process: cohort {64 / single * 1e3:.2f} ms/step, PyTorch {torch_single:.2f} ms/step")
EOF
[[ -n "${OUT:-}" ]] || rm -rf "$out"
