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

# Build only what the job needs: the library and the examples.
if [[ -f "examples/$main_job.cc" || -d "examples/$main_job" ]]; then
  cmake --build "$build" --parallel "${COHORT_JOBS:-2}" --target "$main_job"
  exe="$build/examples/$main_job"
else
  echo "demo.sh: the main job examples/$main_job does not exist yet; looking for another example" >&2
  mapfile -t sources < <(find examples -maxdepth 1 -name '*.cc' | sort)
  if [[ ${#sources[@]} -eq 0 ]]; then
    echo "demo.sh: FAILED: there is no example program in examples/ to run" >&2
    exit 1
  fi
  name=$(basename "${sources[0]}" .cc)
  cmake --build "$build" --parallel "${COHORT_JOBS:-2}" --target "$name"
  exe="$build/examples/$name"
fi

if [[ ! -x "$exe" ]]; then
  echo "demo.sh: FAILED: the build did not produce $exe" >&2
  exit 1
fi
echo "demo.sh: running $exe $*"
exec "$exe" "$@"
