#!/usr/bin/env bash
# Runs an example with --ddp on 2 ranks through one launch path and checks that it finished,
# printed `expected` (rank 0's result line), and that both ranks printed a parameter checksum and
# the checksums are equal.
#   run_example_ranks.sh mpirun <mpiexec> <example> <expected> <example args...>
#   run_example_ranks.sh cohortrun <cohortrun> <example> <expected> <example args...>
# e.g. run_example_ranks.sh cohortrun build/bin/cohortrun build/examples/train_digits "test accuracy:" --ddp --epochs 2
set -euo pipefail
mode=$1 launcher=$2 exe=$3 expected=$4
shift 4
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case $mode in
  mpirun) cmd=("$launcher" -np 2 --allow-run-as-root --oversubscribe "$exe" "$@") ;;
  cohortrun) cmd=("$launcher" --standalone --nproc-per-node 2 "$exe" "$@") ;;
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
grep -qF "$expected" "$out" || { echo "FAILED: no '$expected' line" >&2; exit 1; }
echo "OK: both ranks hold the same parameters ($(head -1 <<<"$sums" | awk '{print $2}'))"
