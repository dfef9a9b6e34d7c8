#!/usr/bin/env bash
# cohortrun --profile on a real job: train_digits --ddp on 2 ranks must leave one merged Chrome
# trace DIR/trace.json with one process per rank, each rank's DDP buckets and the collectives
# matched across ranks, plus each rank's own trace and memory page.
#   run_profile_job.sh <cohortrun> <train_digits>
set -euo pipefail
cohortrun=$1 exe=$2
dir=$(mktemp -d)
out=$(mktemp)
trap 'rm -rf "$dir" "$out"' EXIT
cmd=("$cohortrun" --nproc-per-node 2 --profile "$dir" "$exe" --ddp --epochs 1)
echo "+ ${cmd[*]}"
status=0
timeout 180 "${cmd[@]}" >"$out" 2>&1 || status=$?
cat "$out"
if [[ $status -ne 0 ]]; then echo "FAILED: exit status $status" >&2; exit 1; fi
for f in trace.json rank0.json rank1.json memory_rank0.html memory_rank1.html; do
  [[ -s "$dir/$f" ]] || { echo "FAILED: $dir/$f was not written" >&2; ls -la "$dir" >&2; exit 1; }
done
grep -q -- "--profile: job trace $dir/trace.json" "$out" || { echo "FAILED: cohortrun did not report the trace" >&2; exit 1; }
/usr/bin/python3 - "$dir/trace.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert procs == {0: "rank 0", 1: "rank 1"}, procs
for e in events:
    assert "ph" in e and "pid" in e, e
    if e["ph"] == "X":
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and isinstance(e["tid"], int), e
ddp = {pid: sum(1 for e in events if e.get("cat") == "ddp" and e["pid"] == pid) for pid in (0, 1)}
assert ddp[0] > 0 and ddp[0] == ddp[1], ddp
coll = {}
for e in events:
    if e["ph"] == "X" and e.get("cat") == "collective":
        coll.setdefault(e["pid"], set()).add((e["args"]["group"], e["args"]["seq"]))
        assert e["args"]["wait_us"] >= 0 and e["args"]["move_us"] >= 0, e
assert coll[0] and coll[0] == coll[1], coll
assert trace["cohort"]["matchedCollectives"] == len(coll[0]), trace["cohort"]
print(f"OK: 2 ranks, {ddp[0]} DDP bucket events each, {len(coll[0])} collectives matched across ranks")
PY
