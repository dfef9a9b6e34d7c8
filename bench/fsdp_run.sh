#!/bin/bash
# Runs bench/fsdp for docs/benchmarks.md: memory per rank for 4 ranks (every mode) and step time
# of FULL_SHARD against DDP for 2 ranks, `REPEATS` times interleaved, with the load before each run.
# Usage: bench/fsdp_run.sh <path to the fsdp binary> [repeats]
set -euo pipefail
BIN=${1:?path to the fsdp bench binary}
REPEATS=${2:-3}
for i in $(seq 1 "$REPEATS"); do
  echo "# run $i, load: $(uptime | sed 's/.*load average: //')"
  "$BIN" --world 4 --mode ddp,full_shard,shard_grad_op,no_shard --steps 2
  echo "# run $i (2 ranks), load: $(uptime | sed 's/.*load average: //')"
  # One mode per process for step times: a mode that runs after another in the same process
  # inherits its freed memory and measured 25-35% slower.
  "$BIN" --world 2 --mode ddp --steps 5
  "$BIN" --world 2 --mode full_shard --steps 5
  "$BIN" --world 2 --mode full_shard --steps 5 --no-backward-prefetch
done
