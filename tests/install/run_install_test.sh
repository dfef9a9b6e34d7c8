#!/usr/bin/env bash
# The installed package, used the way a user uses it (ctest runs this as install.find_package_consumer):
#  1. installs the build into a scratch prefix, then moves the whole tree to another folder: an
#     installed cohort must not depend on where it was installed;
#  2. checks the tree: the expected files are there, no installed header is a link or includes a
#     cohort header that was not installed or one under a detail/ folder, no header under a
#     detail/ folder is installed, no text file names the source or build tree, and the programs
#     and libraries find cohort's libraries relative to themselves;
#  3. builds tests/install/consumer, a project outside the source tree, against the moved tree
#     with find_package(cohort) and -Wall -Wextra -Wpedantic -Werror, plus one translation unit
#     that includes every installed header;
#  4. runs the consumer as a 2-rank job under the moved tree's bin/cohortrun, with COHORT_DATA_DIR
#     unset: DDP training on the shipped digits data, an RPC between the ranks and FSDP. It must
#     succeed, read the data from the moved tree, and both ranks must end with the same parameters;
#  5. removes the moved tree's data folder: the program must then fail with an error naming the
#     folder it looked in.
#
#   run_install_test.sh <cohort build dir> <scratch dir> [extra compile/link flags, e.g. sanitizers]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
scratch=$2
extra_flags=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)

fail() {
  echo "install test: FAILED: $*" >&2
  exit 1
}

rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd -P)  # physical: the library finds the data through its real path

# 1. Install, then move.
cmake --install "$build" --prefix "$scratch/installed" >"$scratch/install.log" ||
  { cat "$scratch/install.log" >&2; fail "cmake --install"; }
mkdir -p "$scratch/moved"
mv "$scratch/installed" "$scratch/moved/cohort"
prefix=$scratch/moved/cohort
echo "install test: installed, then moved to $prefix"

# 2. The tree.
config=$(find "$prefix" -name cohortConfig.cmake -print -quit)
[[ -n "$config" ]] || fail "no cohortConfig.cmake was installed"
libdir=$(cd "$(dirname "$config")/../.." && pwd)
for f in include/cohort/cohort.h include/cohort/distributed.h include/cohort/config.h \
  include/cohort/core/tensor/tensor.h include/cohort/fsdp/fully_sharded_data_parallel.h include/cohort/rpc/rpc.h \
  include/cohort/pipeline/pipeline.h \
  bin/cohortrun share/cohort/data/digits.csv share/cohort/data/kjv.txt share/cohort/data/README.md; do
  [[ -f "$prefix/$f" ]] || fail "$f was not installed"
done
for lib in core distributed fsdp rpc pipeline launcher; do
  [[ -f "$libdir/libcohort_$lib.so" ]] || fail "libcohort_$lib.so was not installed in $libdir"
done
if [[ -n "$(find "$prefix/include" -type l)" ]]; then
  find "$prefix/include" -type l >&2
  fail "the installed headers contain links"
fi
# Every cohort header an installed header includes is installed too.
missing=0
while IFS= read -r -d '' h; do
  while IFS= read -r inc; do
    case "$inc" in
      '<cohort/'*) target=$prefix/include/${inc:1:-1} ;;
      '"'*) target=$(dirname "$h")/${inc:1:-1} ;;
      *) continue ;;
    esac
    if [[ ! -f "$target" ]]; then
      echo "install test: ${h#"$prefix"/} includes $inc, which was not installed" >&2
      missing=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\([<"][^>"]*[>"]\).*/\1/p' "$h")
done < <(find "$prefix/include" -name '*.h' -print0)
[[ $missing -eq 0 ]] || fail "installed headers include headers that were not installed"
# Headers under a detail/ folder are internal: none is installed, and no installed header names one
# (even one that happens to exist at the include path).
if [[ -n "$(find "$prefix/include" -path '*/detail/*')" ]]; then
  find "$prefix/include" -path '*/detail/*' >&2
  fail "internal headers (under a detail/ folder) were installed"
fi
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]*/)?detail/' "$prefix/include" >"$scratch/detail_includes.txt"; then
  cat "$scratch/detail_includes.txt" >&2
  fail "installed headers include internal headers (under a detail/ folder)"
fi
# Nothing points back into the source or build tree (text files: headers, CMake package files).
if grep -rIl -e "$source_dir" -e "$build" "$prefix" >"$scratch/leaks.txt"; then
  cat "$scratch/leaks.txt" >&2
  fail "installed files name the source or build tree"
fi
# Programs and libraries find cohort's libraries relative to themselves.
for f in "$prefix/bin/cohortrun" "$libdir"/libcohort_*.so; do
  runpath=$(readelf -d "$f" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  [[ "$runpath" == *'$ORIGIN'* ]] || fail "${f#"$prefix"/} has no \$ORIGIN-relative RUNPATH (it has '$runpath')"
  [[ "$runpath" != *"$build"* && "$runpath" != *"$source_dir"* ]] ||
    fail "${f#"$prefix"/}'s RUNPATH names the build or source tree: $runpath"
done
"$prefix/bin/cohortrun" --help >/dev/null || fail "the installed bin/cohortrun does not start"

# 3. A user's project against the moved tree. The headers that include MPI's (a backend's
# internals) need MPI's include path, which the package does not hand on; the rest go into one
# translation unit compiled with the strict flags.
all_headers=$scratch/all_headers.cc
{
  echo "// Every installed cohort header (written by run_install_test.sh)."
  while IFS= read -r h; do
    rel=${h#"$prefix"/include/}
    if grep -q '^[[:space:]]*#[[:space:]]*include[[:space:]]*<mpi\.h>' "$h"; then
      echo "// skipped (includes <mpi.h>): $rel"
      continue
    fi
    echo "#include <$rel>"
  done < <(find "$prefix/include/cohort" -name '*.h' | LC_ALL=C sort)
} >"$all_headers"
echo "install test: $(grep -c '^#include' "$all_headers") installed headers in one translation unit," \
  "$(grep -c '^// skipped' "$all_headers") skipped (they include <mpi.h>)"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here/consumer" -B "$scratch/consumer-build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCOHORT_ALL_HEADERS_SOURCE="$all_headers" \
  -DCMAKE_CXX_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" >"$scratch/consumer-configure.log" ||
  { cat "$scratch/consumer-configure.log" >&2; fail "configuring the consumer against the installed package"; }
cmake --build "$scratch/consumer-build" --parallel 2 || fail "building the consumer (strict flags)"
consumer=$scratch/consumer-build/consumer
# (Not `ldd | grep -q`: under pipefail, grep's early exit can fail the pipeline with SIGPIPE.)
consumer_libs=$(ldd "$consumer")
if ! grep -qF "$libdir/libcohort_core.so" <<<"$consumer_libs"; then
  echo "$consumer_libs" >&2
  fail "the consumer does not load libcohort_core from the moved tree"
fi

# 4. The job: 2 ranks under the installed launcher, the data from the installed tree.
run=("$prefix/bin/cohortrun" --standalone --nproc-per-node 2 "$consumer")
echo "install test: + ${run[*]}"
out=$scratch/run.log
status=0
# The launcher has its own timeouts; this one only turns a hang into a failure.
(cd "$scratch" && env -u COHORT_DATA_DIR timeout 300 "${run[@]}") >"$out" 2>&1 || status=$?
cat "$out"
[[ $status -eq 0 ]] || fail "the 2-rank job exited with status $status"
grep -qF "data folder: $prefix/share/cohort/data" "$out" || fail "the job did not read the data from $prefix/share/cohort/data"
sums=$(sed -n 's/.*rank \([01]\) parameter checksum \([0-9a-f]*\).*/\1 \2/p' "$out" | sort)
[[ $(wc -l <<<"$sums") -eq 2 ]] || fail "expected a checksum from ranks 0 and 1, got: $sums"
[[ $(awk '{print $2}' <<<"$sums" | sort -u | wc -l) -eq 1 ]] || fail "the ranks' parameters differ: $sums"
grep -q ': ok$' "$out" || fail "rank 0 did not report success"

# 5. No data folder: a clear error naming where it looked.
mv "$prefix/share/cohort/data" "$scratch/data-moved-away"
status=0
(cd "$scratch" && env -u COHORT_DATA_DIR timeout 300 "$prefix/bin/cohortrun" --standalone --nproc-per-node 1 \
  "$consumer") >"$scratch/no-data.log" 2>&1 || status=$?
mv "$scratch/data-moved-away" "$prefix/share/cohort/data"
if [[ $status -eq 0 ]] || ! grep -qF "the data folder '$prefix/share/cohort/data' does not exist" "$scratch/no-data.log"; then
  cat "$scratch/no-data.log" >&2
  fail "without its data folder the program did not fail with an error naming $prefix/share/cohort/data"
fi
echo "install test: without the data folder the program fails naming it, as it should"
echo "install test: OK: the moved package builds a strict project, and its 2-rank job trained (checksum $(head -1 <<<"$sums" | awk '{print $2}'))"
