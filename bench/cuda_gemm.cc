// GEMM on a GPU: cohort's matmul on CUDA tensors against cuBLAS called directly (cublasGemmEx, same
// shapes, types and compute mode), alternating in one process, each the median of --repeat timed
// batches of --iters products measured with CUDA events, in four rounds that alternate which goes first. Prints one
// JSON line per dtype with both TFLOP/s and the ratio cohort/cuBLAS (time), and the fraction of --peak-tflops when
// given.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>

using namespace cohort;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("{}: cuBLAS status {}", what, static_cast<int>(s)));
}

template <typename F>
double medianMs(F&& f, int iters, int repeat) {
  std::vector<double> ms;
  cuda::Event a(true), b(true);
  for (int r = 0; r < repeat; ++r) {
    a.record();
    for (int i = 0; i < iters; ++i) f();
    b.record();
    b.synchronize();
    ms.push_back(a.elapsedMs(b) / iters);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GEMM on CUDA: cohort matmul vs cuBLAS called directly"};
  int64_t m = 8192, n = 8192, k = 8192;
  int iters = 10, repeat = 5;
  double peak = 0;
  std::vector<std::string> dtypes{"bfloat16", "float16", "tf32", "float32"};
  app.add_option("-m", m);
  app.add_option("-n", n);
  app.add_option("-k", k);
  app.add_option("--iters", iters);
  app.add_option("--repeat", repeat);
  app.add_option("--peak-tflops", peak, "the GPU's dense peak for the bf16/fp16 rows (H100 SXM: 989)");
  app.add_option("--dtypes", dtypes);
  CLI11_PARSE(app, argc, argv);
  if (!cuda::isAvailable()) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s, %lld x %lld x %lld, median of %d x %d products\n", prop.name, static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(n), repeat, iters);
  cublasHandle_t h;
  check(cublasCreate(&h), "cublasCreate");
  check(cublasSetStream(h, static_cast<cudaStream_t>(cuda::currentStream().handle())), "cublasSetStream");
  for (const std::string& name : dtypes) {
    DType dt = name == "bfloat16" ? DType::BFloat16 : name == "float16" ? DType::Float16 : DType::Float32;
    cudaDataType_t cdt = dt == DType::BFloat16 ? CUDA_R_16BF : dt == DType::Float16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t compute = name == "tf32" ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cuda::setAllowTf32(name == "tf32");
    Tensor a = randn({m, k}).to(dt).to(Device::cuda()), b = randn({k, n}).to(dt).to(Device::cuda());
    Tensor c = empty({m, n}, {.dtype = dt, .device = Device::cuda()});
    const float one = 1, zero = 0;
    auto direct = [&] {
      // Row-major C = A B is column-major C^T = B^T A^T.
      check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                         &one, b.storage()->data(), cdt, static_cast<int>(n), a.storage()->data(), cdt,
                         static_cast<int>(k), &zero, c.storage()->data(), cdt, static_cast<int>(n), compute,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    };
    Tensor keep;
    auto ours = [&] { keep = matmul(a, b); };
    direct();
    ours();  // warm up both (handles, workspaces, the allocator's block)
    check(cudaDeviceSynchronize(), "sync");
    double tDirect = 0, tOurs = 0;
    // Alternate which goes first, so that clock and power drift (a GPU at full bf16 load slows as
    // it heats) hits both equally.
    for (int round = 0; round < 4; ++round) {
      if (round % 2 == 0) {
        tDirect += medianMs(direct, iters, repeat);
        tOurs += medianMs(ours, iters, repeat);
      } else {
        tOurs += medianMs(ours, iters, repeat);
        tDirect += medianMs(direct, iters, repeat);
      }
    }
    tDirect /= 4;
    tOurs /= 4;
    double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    double tfOurs = flop / (tOurs * 1e-3) / 1e12, tfDirect = flop / (tDirect * 1e-3) / 1e12;
    std::printf("{\"bench\": \"cuda_gemm\", \"gpu\": \"%s\", \"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
                "\"cohort_ms\": %.4f, \"cublas_ms\": %.4f, \"cohort_tflops\": %.1f, \"cublas_tflops\": %.1f, "
                "\"time_ratio\": %.3f%s}\n",
                prop.name, name.c_str(), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k), tOurs, tDirect, tfOurs, tfDirect, tOurs / tDirect,
                peak > 0 && name != "tf32" && name != "float32"
                    ? fmt::format(", \"fraction_of_peak\": {:.3f}", tfOurs / peak).c_str()
                    : "");
  }
  cuda::setAllowTf32(false);
  cublasDestroy(h);
  return 0;
}
