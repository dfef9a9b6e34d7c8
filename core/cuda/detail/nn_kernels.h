/*
 * Launchers of the normalisation and loss kernels (core/cuda/nn.cu), over raw device pointers.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail {

// y = softmax (log: log_softmax) of x over r of a dense [outer, n, inner] buffer; outer * n * inner > 0.
void launchSoftmax(ElemType type, bool log, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                   cudaStream_t stream);
void launchSoftmaxBackward(ElemType type, bool log, const void* y, const void* g, void* dx, int64_t outer, int64_t n,
                           int64_t inner, cudaStream_t stream);

// stats[0] += positions not ignored (unsigned 64-bit, zeroed by the caller); stats[1] = min over
// positions with a label outside [0, c) (set to all ones by the caller). valid may be null.
void launchNllForward(ElemType type, ElemType targetType, const void* x, const void* target, void* perPos, void* valid,
                      unsigned long long* stats, int64_t n, int64_t c, int64_t d, int64_t ignoreIndex,
                      cudaStream_t stream);
// dx already zero.
void launchNllBackward(ElemType type, ElemType targetType, const void* target, const void* grad, void* dx, int64_t n,
                       int64_t c, int64_t d, int64_t ignoreIndex, double scale, bool perPosition, cudaStream_t stream);

// mean / rstd are float (double for float64 x). w, b may be null. m * n > 0.
void launchLayerNorm(ElemType type, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t m, int64_t n, double eps, cudaStream_t stream);
// dx, dw, db may be null (not wanted); w may be null. `workspace` holds layerNormBackwardWorkspaceBytes.
int64_t layerNormBackwardWorkspaceBytes(int64_t m, int64_t n);
void launchLayerNormBackward(ElemType type, const void* x, const void* w, const void* g, const void* mean,
                             const void* rstd, void* dx, void* dw, void* db, int64_t m, int64_t n, void* workspace,
                             cudaStream_t stream);

}  // namespace cohort::cuda::detail
