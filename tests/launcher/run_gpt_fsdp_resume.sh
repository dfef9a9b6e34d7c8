#!/usr/bin/env bash
# examples/train_gpt --fsdp under cohortrun: 2 ranks train a tiny GPT and write an FSDP training
# checkpoint (a folder committed by its manifest); 3 ranks then resume from it (resharding
# 2 -> 3) and finish. Checks both runs exit 0,
# that the second resumed at the checkpoint's step, and that it reached the end.
#   run_gpt_fsdp_resume.sh <cohortrun> <train_gpt>
set -euo pipefail
launcher=$1 exe=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tiny=(--fsdp --layers 1 --heads 2 --embd 32 --block-size 16 --batch-size 4 --warmup 1 --log-interval 2
      --checkpoint-every 3 --sample-tokens 0 --checkpoint "$dir/run.ckpt")
run() {
  local n=$1; shift
  local cmd=("$launcher" --standalone --nproc-per-node "$n" "$exe" "${tiny[@]}" "$@")
  echo "+ ${cmd[*]}"
  local status=0
  timeout 120 "${cmd[@]}" >"$dir/out" 2>&1 || status=$?
  cat "$dir/out"
  if [[ $status -ne 0 ]]; then echo "FAILED: exit status $status" >&2; exit 1; fi
}
run 2 --steps 6 --stop-after 3
[[ -f "$dir/run.ckpt/manifest.json" ]] || { echo "FAILED: no training checkpoint committed" >&2; exit 1; }
run 3 --steps 6 --resume
grep -q "resumed from $dir/run.ckpt at step 3" "$dir/out" || { echo "FAILED: the 3-rank run did not resume at step 3" >&2; exit 1; }
grep -q "step 6/6" "$dir/out" || { echo "FAILED: the 3-rank run did not reach step 6" >&2; exit 1; }
grep -q "validation loss:" "$dir/out" || { echo "FAILED: no validation loss line" >&2; exit 1; }
echo "OK: trained on 2 ranks, resumed on 3 from the training checkpoint"
