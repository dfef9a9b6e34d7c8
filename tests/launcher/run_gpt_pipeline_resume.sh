#!/usr/bin/env bash
# examples/train_gpt --pipeline 2 under cohortrun: one run trains uninterrupted; a second, under
# --max-restarts 1, has its stage-1 rank killed (SIGKILL) once its first checkpoint is committed:
# the job restarts, resumes from the committed step and must end with the same parameters
# (checksum) as the uninterrupted run.
#   run_gpt_pipeline_resume.sh <cohortrun> <train_gpt>
set -euo pipefail
launcher=$1 exe=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--pipeline 2 --micro-batches 4 --layers 2 --heads 2 --embd 64 --block-size 32 --batch-size 16 --warmup 2
      --steps 60 --log-interval 10 --checkpoint-every 5 --sample-tokens 0)
checksum() { grep -o 'parameter checksum [0-9a-f]*' "$1" | tail -1; }

echo "+ uninterrupted run"
timeout 300 "$launcher" --standalone --nproc-per-node 2 "$exe" "${args[@]}" --checkpoint "$dir/a" >"$dir/a.out" 2>&1 ||
  { cat "$dir/a.out"; echo "FAILED: the uninterrupted run" >&2; exit 1; }
want=$(checksum "$dir/a.out")
[[ -n $want ]] || { cat "$dir/a.out"; echo "FAILED: no checksum" >&2; exit 1; }

echo "+ run killed after its first checkpoint"
timeout 300 "$launcher" --standalone --nproc-per-node 2 --max-restarts 1 "$exe" "${args[@]}" --checkpoint "$dir/b" \
  --resume >"$dir/b.out" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 600); do
  if [[ -f $dir/b/latest ]]; then
    for pid in $(pgrep -f -- "--checkpoint $dir/b" || true); do
      if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1'; then victim=$pid; fi
    done
    [[ -n $victim ]] && break
  fi
  sleep 0.05
done
[[ -n $victim ]] || { wait "$job" || true; cat "$dir/b.out"; echo "FAILED: found no stage-1 rank to kill" >&2; exit 1; }
echo "killing rank 1 (pid $victim) after step $(cat "$dir/b/latest")"
kill -9 "$victim"
status=0
wait "$job" || status=$?
cat "$dir/b.out"
[[ $status -eq 0 ]] || { echo "FAILED: the restarted job exited with $status" >&2; exit 1; }
grep -q "resumed from $dir/b at step" "$dir/b.out" || { echo "FAILED: the restarted job did not resume" >&2; exit 1; }
got=$(checksum "$dir/b.out")
[[ $got == "$want" ]] || { echo "FAILED: $got after the restart, $want uninterrupted" >&2; exit 1; }
echo "OK: killed, restarted, resumed: $got (as uninterrupted)"
