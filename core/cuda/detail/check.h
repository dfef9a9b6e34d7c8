// Internal to core/cuda: error checks and the current stream as a cudaStream_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cohort/core/cuda/cuda.h>
#include <cohort/core/util/error.h>

namespace cohort::cuda::detail {

[[noreturn]] void throwCudaError(cudaError_t e, const char* what, const char* file, int line);

// Throws cohort::Error naming the call, CUDA's message and the place; an out-of-memory error is
// an Error too (the caching allocator reports its own, fuller, out-of-memory message).
#define COHORT_CUDA_CHECK(expr)                                                            \
  do {                                                                                     \
    cudaError_t cohort_cuda_err_ = (expr);                                                 \
    if (cohort_cuda_err_ != cudaSuccess)                                                   \
      ::cohort::cuda::detail::throwCudaError(cohort_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Checks the launch of the kernel just queued (bad configuration, no kernel image for this GPU).
#define COHORT_CUDA_CHECK_LAUNCH() COHORT_CUDA_CHECK(cudaGetLastError())

inline cudaStream_t currentCudaStream(int device) {
  return reinterpret_cast<cudaStream_t>(currentStream(device).handle());
}
inline cudaStream_t streamOf(const Tensor& t) { return currentCudaStream(t.device().index()); }

}  // namespace cohort::cuda::detail
