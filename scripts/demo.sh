#!/usr/bin/env bash
# Builds cohort and runs the main job: examples/train_digits trained with DistributedDataParallel
# on 2 ranks (COHORT_DEMO_NPROC) started by the cohortrun launcher on this machine:
#
#   cohortrun --standalone --nproc-per-node 2 build/examples/train_digits --ddp
#
# Arguments are passed to the example (e.g. --epochs 5, --model cnn). Exits non-zero when the
# build or the job fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${COHORT_BUILD_DIR:-build}
nproc=${COHORT_DEMO_NPROC:-2}

./scripts/setup.sh

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DCOHORT_BUILD_EXAMPLES=ON)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  command -v ninja >/dev/null && cmake_args+=(-G Ninja)
fi
command -v ccache >/dev/null && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" "${cmake_args[@]}"

# Build only what the job needs: the launcher, the libraries and the example.
cmake --build "$build" --parallel "${COHORT_JOBS:-2}" --target cohortrun train_digits
launcher=$build/bin/cohortrun
exe=$build/examples/train_digits
for f in "$launcher" "$exe"; do
  if [[ ! -x "$f" ]]; then
    echo "demo.sh: FAILED: the build did not produce $f" >&2
    exit 1
  fi
done

cmd=("$launcher" --standalone --nproc-per-node "$nproc" "$exe" --ddp "$@")
echo "demo.sh: running ${cmd[*]}"
exec "${cmd[@]}"
