#!/usr/bin/env bash
# Builds cohort and runs the main job: examples/train_digits trained with DistributedDataParallel
# on 2 ranks (COHORT_DEMO_NPROC) started by the cohortrun launcher on this machine:
#
#   cohortrun --standalone --nproc-per-node 2 build/examples/train_digits --ddp
#
# Arguments are passed to the example (e.g. --epochs 5, --model cnn). Exits non-zero when the
# build or the job fails. Environment: COHORT_BUILD_DIR (build), COHORT_JOBS (2), and those of
# scripts/configure.sh (COHORT_WERROR, COHORT_CMAKE_ARGS).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${COHORT_BUILD_DIR:-build}
nproc=${COHORT_DEMO_NPROC:-2}

./scripts/setup.sh

# The same configuration as test.sh's (scripts/configure.sh), so test.sh reuses this build.
source scripts/configure.sh
cohort_configure "$build"

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
