// Launchers of the fused optimizer steps (core/cuda/optim.cu) over raw device pointers; the glue
// is core/cuda/optim_ops.cc. All arrays are contiguous with n elements of `type` (a float type).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>
#include <cohort/core/optim/detail/update_math.h>

namespace cohort::cuda::detail {

// buf is null without momentum.
void launchSgdStep(ElemType type, void* p, const void* g, void* buf, int64_t n, const optim::detail::SgdScalars& s,
                   cudaStream_t stream);
// vmax is null without amsgrad.
void launchAdamStep(ElemType type, void* p, const void* g, void* m, void* v, void* vmax, int64_t n,
                    const optim::detail::AdamScalars& s, cudaStream_t stream);

}  // namespace cohort::cuda::detail
