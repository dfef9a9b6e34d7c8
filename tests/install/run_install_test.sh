#!/usr/bin/env bash
# Installs the current build into a fresh prefix and builds and runs tests/install/consumer, a
# project outside the source tree, against it with find_package(cohort).
#   run_install_test.sh <cohort build dir> <scratch dir> [extra compile/link flags, e.g. sanitizers]
set -euo pipefail
build=$1
scratch=$2
extra_flags=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

rm -rf "$scratch"
mkdir -p "$scratch"
prefix="$scratch/prefix"

cmake --install "$build" --prefix "$prefix"

# The installed tree must be self-contained: no header may point back into the source tree.
for f in "$prefix/include/cohort/cohort.h" "$prefix/include/cohort/config.h" \
         "$prefix/include/cohort/core/tensor/tensor.h" "$prefix/lib/cmake/cohort/cohortConfig.cmake"; do
  [[ -f "$f" ]] || { echo "install test: $f was not installed" >&2; exit 1; }
done
if find "$prefix/include" -type l | grep -q .; then
  echo "install test: the installed headers contain symlinks:" >&2
  find "$prefix/include" -type l >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here/consumer" -B "$scratch/consumer-build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags"
cmake --build "$scratch/consumer-build"
"$scratch/consumer-build/consumer"
