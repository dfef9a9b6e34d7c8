#!/usr/bin/env bash
# Runs cohort's GPU tests and GPU benchmarks, on a machine with an NVIDIA GPU, from a build tree
# configured with CUDA (./scripts/test.sh makes one; without a GPU these tests skip and say why).
#
#   ./scripts/gpu_tests.sh [--bin DIR] [--out DIR] [--no-bench] [-- gtest args]
#
#   --bin DIR   folder holding the test and bench programs (default build/tests and build/bench)
#   --out DIR   where logs and the benchmark JSON go (default gpu-results/)
#
# Every test binary of tests/core/cuda/ and tests/distributed/nccl/ runs with its own log; then
# examples/train_gpt trains on the GPU and on the CPU (checkpointed and resumed half way, float32
# and bf16 autocast) and the two validation losses must agree within 2%; then bench/cuda_gemm
# (cohort's matmul against cuBLAS called directly) and bench/cuda_train_step (a GPT-2 small
# training step under bf16 autocast), next to bench/torch_cuda_train_step.py (the same model in
# PyTorch) when python3 has PyTorch with CUDA. The exit status is non-zero when any test fails; a
# binary running past COHORT_GPU_TEST_TIMEOUT seconds (300) is stopped and counts as failed.
# docs/benchmarks.md records the figures of such runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

tests_dir=build/tests
bench_dir=build/bench
examples_dir=build/examples
out=gpu-results
bench=1
gtest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) tests_dir=$2; bench_dir=$2; examples_dir=$2; shift ;;
    --out) out=$2; shift ;;
    --no-bench) bench=0 ;;
    --) shift; gtest_args=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_tests.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"

status=0
for src in tests/core/cuda/*_test.cc tests/distributed/nccl/*_test.cc; do
  [[ -e $src ]] || continue
  name=$(basename "$src" .cc)
  bin=$tests_dir/$name
  if [[ ! -x $bin ]]; then
    echo "== $name: not built ($bin missing)" | tee -a "$out/summary.txt"
    status=1
    continue
  fi
  start=$SECONDS
  timeout "${COHORT_GPU_TEST_TIMEOUT:-300}" "$bin" --gtest_brief=1 "${gtest_args[@]}" >"$out/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/$name.log" | tr '\n' ' ')
  echo "== $name: rc=$rc (${secs} s) $summary" | tee -a "$out/summary.txt"
  grep -E "^\[  FAILED  \]|Failure|error" "$out/$name.log" | head -40
  [[ $rc -ne 0 ]] && status=1
done

# The GPT example on the GPU (float32, then bf16 autocast), stopped half way with a checkpoint and
# resumed: its validation loss must come within 2% of the same run on the CPU.
example=$examples_dir/train_gpt
if [[ -x $example ]]; then
  run_gpt() {  # <device> <log> [args...]: trains 60 steps in two halves, prints the validation loss
    local device=$1 log=$2 dir
    shift 2
    dir=$(mktemp -d)
    timeout 600 "$example" --device "$device" --steps 60 --stop-after 30 --checkpoint "$dir/run.ckpt" \
      --sample-tokens 0 "$@" >"$log" 2>&1 &&
      timeout 600 "$example" --device "$device" --steps 60 --checkpoint "$dir/run.ckpt" --resume --sample-tokens 40 \
        "$@" >>"$log" 2>&1
    local rc=$?
    rm -rf "$dir"
    [[ $rc -eq 0 ]] && sed -n 's/^validation loss: //p' "$log" | tail -1
  }
  for amp in none bf16; do
    gpu=$(run_gpt cuda "$out/train_gpt_cuda_$amp.log" --amp "$amp")
    cpu=$(run_gpt cpu "$out/train_gpt_cpu_$amp.log" --amp "$amp")
    if [[ -n $gpu && -n $cpu ]] && awk -v g="$gpu" -v c="$cpu" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(d <= 0.02 * c) }'; then
      echo "== train_gpt --device cuda --amp $amp: validation loss $gpu (cpu $cpu)" | tee -a "$out/summary.txt"
    else
      echo "== train_gpt --device cuda --amp $amp: FAILED (validation loss gpu '$gpu', cpu '$cpu'; logs in $out)" |
        tee -a "$out/summary.txt"
      status=1
    fi
  done
else
  echo "== train_gpt: not built ($example missing)" | tee -a "$out/summary.txt"
fi

peak=${COHORT_GPU_PEAK_TFLOPS:-989}
# python3 (PyTorch, with its own CUDA libraries) without the libraries of a bundle's env.sh
# (scripts/gpu_bundle.sh), which are for cohort's programs.
py=(python3)
[[ -n ${COHORT_BUNDLE_LIB:-} ]] && py=(env "LD_LIBRARY_PATH=${COHORT_PREV_LD_LIBRARY_PATH:-}" python3)
if [[ $bench -eq 1 && -x $bench_dir/cuda_gemm ]]; then
  "$bench_dir/cuda_gemm" --peak-tflops "$peak" 2>&1 | tee "$out/cuda_gemm.json"
fi
if [[ $bench -eq 1 && -x $bench_dir/cuda_train_step ]]; then
  "$bench_dir/cuda_train_step" --peak-tflops "$peak" 2>&1 | tee "$out/cuda_train_step.json"
  if "${py[@]}" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "${py[@]}" bench/torch_cuda_train_step.py --peak-tflops "$peak" 2>&1 | tee -a "$out/cuda_train_step.json"
  fi
fi
exit $status
