#!/usr/bin/env bash
# Runs examples/train_digits --ddp on 2 ranks through one launch path and checks that it
# finished, that both ranks printed a parameter checksum, and that the checksums are equal.
#   run_example_ranks.sh mpirun <mpiexec> <train_digits>
#   run_example_ranks.sh cohortrun <cohortrun> <train_digits>
set -euo pipefail
mode=$1 launcher=$2 exe=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case $mode in
  mpirun) cmd=("$launcher" -np 2 --allow-run-as-root --oversubscribe "$exe" --ddp --epochs 2) ;;
  cohortrun) cmd=("$launcher" --standalone --nproc-per-node 2 "$exe" --ddp --epochs 2) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
echo "+ ${cmd[*]}"
# The launcher has its own timeouts; this one only turns a hang into a failure.
status=0
timeout 120 "${cmd[@]}" >"$out" 2>&1 || status=$?
cat "$out"
if [[ $status -ne 0 ]]; then echo "FAILED: exit status $status" >&2; exit 1; fi
sums=$(sed -n 's/.*rank \([01]\) parameter checksum \([0-9a-f]*\).*/\1 \2/p' "$out" | sort)
if [[ $(wc -l <<<"$sums") -ne 2 ]]; then echo "FAILED: expected a checksum from ranks 0 and 1, got: $sums" >&2; exit 1; fi
if [[ $(awk '{print $2}' <<<"$sums" | sort -u | wc -l) -ne 1 ]]; then
  echo "FAILED: the ranks' parameters differ: $sums" >&2; exit 1
fi
grep -q "test accuracy:" "$out" || { echo "FAILED: no test accuracy line" >&2; exit 1; }
echo "OK: both ranks hold the same parameters ($(head -1 <<<"$sums" | awk '{print $2}'))"
