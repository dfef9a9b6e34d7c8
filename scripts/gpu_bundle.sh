#!/usr/bin/env bash
# Packs the GPU test and benchmark programs of a build, cohort's libraries, every shared library
# they need that a GPU machine may lack (gloo, OpenMPI, the BLAS libraries cohort loads at run time,
# ...) and the example datasets (share/cohort/data, found beside lib/) into one tarball, for a GPU
# machine that has the NVIDIA driver and CUDA's libraries but not this machine's packages:
#
#   ./scripts/gpu_bundle.sh [--build DIR] [--out FILE]     (default build/, gpu-bundle.tar.gz)
#
# then, on the GPU machine, in a checkout of the same commit:
#
#   mkdir -p /tmp/g && tar -xzf gpu-bundle.tar.gz -C /tmp/g && source /tmp/g/env.sh
#   ./scripts/gpu_tests.sh --bin /tmp/g/bin
#
# env.sh puts the bundle's libraries first on LD_LIBRARY_PATH, followed by the folders where it
# finds that machine's CUDA runtime, cuBLAS and NCCL (those, like glibc and the C++ runtime, come
# from the machine: they must match its driver). gpu_tests.sh runs python3 (PyTorch's side of the
# benchmark) with the library path it had before env.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build
out=gpu-bundle.tar.gz
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
missing=0
for src in tests/core/cuda/*_test.cc tests/distributed/nccl/*_test.cc; do
  name=$(basename "$src" .cc)
  if [[ -x $build/tests/$name ]]; then cp "$build/tests/$name" "$stage/bin/"; else echo "not built: $build/tests/$name" >&2; missing=1; fi
done
for name in cuda_gemm cuda_train_step comm_overhead; do
  if [[ -x $build/bench/$name ]]; then cp "$build/bench/$name" "$stage/bin/"; else echo "not built: $build/bench/$name" >&2; missing=1; fi
done
if [[ -x $build/examples/train_gpt ]]; then cp "$build/examples/train_gpt" "$stage/bin/"; else echo "not built: $build/examples/train_gpt" >&2; missing=1; fi
[[ $missing -eq 0 ]] || { echo "gpu_bundle.sh: build the tree with CUDA first (./scripts/test.sh)" >&2; exit 1; }
# The example datasets, where the library looks for them: ../share/cohort/data beside lib/.
mkdir -p "$stage/share/cohort"
cp -rL "$build/share/cohort/data" "$stage/share/cohort/"

# The libraries the programs need, and those cohort's BLAS layer loads with dlopen, with theirs;
# not the ones the GPU machine must supply itself.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.'
resolve() { ldconfig -p | awk -v l="$1" '$1 == l && /x86-64/ && !d { print $NF; d = 1 }'; }
declare -A seen=()
queue=("$stage"/bin/*)
for l in libopenblas.so.0 libdnnl.so.2; do
  p=$(resolve "$l")
  [[ -n $p ]] && queue+=("$p")
done
while [[ ${#queue[@]} -gt 0 ]]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  while read -r name path; do
    [[ $name =~ $skip || -n ${seen[$name]:-} ]] && continue
    seen[$name]=1
    if [[ -z $path || ! -e $path ]]; then echo "gpu_bundle.sh: $name (needed by $f) not found" >&2; exit 1; fi
    cp -L "$path" "$stage/lib/$name"
    queue+=("$path")
  done < <(ldd "$f" | awk '/=>/ { print $1, $3 }')
  case $f in */libopenblas.so.0 | */libdnnl.so.2) cp -L "$f" "$stage/lib/$(basename "$f")" ;; esac
done
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/libcohort_* 2>/dev/null || true

cat >"$stage/env.sh" <<'EOF'
# Sourced on the GPU machine: the bundle's libraries, then the machine's CUDA libraries.
_g=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_cuda=$(for n in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcublasLt.so.12 libcudart.so.12; do
  find /usr/local /usr/lib /opt -name "$n*" 2>/dev/null | head -1 | xargs -r dirname
done | sort -u | tr '\n' ':')
export COHORT_BUNDLE_LIB="$_g/lib" COHORT_PREV_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$_g/lib:$_cuda${LD_LIBRARY_PATH:-}"
unset _g _cuda
EOF
tar -C "$stage" -czf "$out" bin lib share env.sh
programs=("$stage"/bin/*)
libraries=("$stage"/lib/*)
echo "gpu_bundle.sh: $out ($(du -h "$out" | cut -f1)): ${#programs[@]} programs, ${#libraries[@]} libraries"
