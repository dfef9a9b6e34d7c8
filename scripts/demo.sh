#!/usr/bin/env bash
# Builds cohort and runs the main job: the training example examples/train_digits.
# Arguments are passed to the example. Exits non-zero when the build or the job fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${COHORT_BUILD_DIR:-build}
main_job=train_digits

./scripts/setup.sh

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DCOHORT_BUILD_EXAMPLES=ON)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  command -v ninja >/dev/null && cmake_args+=(-G Ninja)
fi
command -v ccache >/dev/null && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" "${cmake_args[@]}"

# Build only what the job needs: the library and the example. Until the main job exists, run
# another example program, saying so; with none at all, fail.
targets=$(cmake --build "$build" --target help 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.-]*\):.*/\1/p' | sort -u)
has_target() { grep -qx "$1" <<<"$targets"; }
job=$main_job
if ! has_target "$job"; then
  echo "demo.sh: the main job '$main_job' (examples/$main_job) does not exist yet" >&2
  job=""
  for src in examples/*.cc examples/*/; do
    [[ -e "$src" ]] || continue
    name=$(basename "${src%.cc}")
    if has_target "$name"; then job=$name; break; fi
  done
  if [[ -z "$job" ]]; then
    echo "demo.sh: FAILED: there is no example program in examples/ to run" >&2
    exit 1
  fi
  echo "demo.sh: running the example '$job' instead" >&2
fi
cmake --build "$build" --parallel "${COHORT_JOBS:-2}" --target "$job"
exe=$(find "$build/examples" -type f -name "$job" -perm -u+x | head -n 1)

if [[ -z "$exe" || ! -x "$exe" ]]; then
  echo "demo.sh: FAILED: the build did not produce an executable $job under $build/examples" >&2
  exit 1
fi
echo "demo.sh: running $exe $*"
exec "$exe" "$@"
