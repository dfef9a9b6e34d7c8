/*
 * Launchers of the fused attention kernels (core/cuda/attention.cu), over raw device pointers.
 *
 * Shapes: q, out, dout, dq [nb, tq, d]; k, v, dk, dv [nb, tk, d]; lse, delta [nb, tq]; all dense.
 * 16-bit q/k/v/out (float16 or bfloat16, `type`), float lse/delta/dq. d is 32, 64 or 128
 * (attentionHeadDimSupported), tq and tk any positive size.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail {

bool attentionHeadDimSupported(int64_t d);

// out = softmax(scale * q k^T, causal: keys j <= i only) v, and lse = the rows' log-sum-exp of the
// scaled scores (natural log). Returns the first CUDA error (a kernel attribute or the launch).
cudaError_t launchAttentionForward(ElemType type, const void* q, const void* k, const void* v, void* out, float* lse,
                                   int64_t nb, int64_t tq, int64_t tk, int64_t d, double scale, bool causal,
                                   cudaStream_t stream);

// delta = rowsum(dout * out) (float, [nb * tq]).
cudaError_t launchAttentionDelta(ElemType type, const void* out, const void* dout, float* delta, int64_t rows,
                                 int64_t d, cudaStream_t stream);

// dq (float, zeroed by the caller: key blocks add into it), dk, dv (16-bit) from the forward's
// inputs, lse and delta.
cudaError_t launchAttentionBackward(ElemType type, const void* q, const void* k, const void* v, const void* dout,
                                    const float* lse, const float* delta, float* dq, void* dk, void* dv, int64_t nb,
                                    int64_t tq, int64_t tk, int64_t d, double scale, bool causal, cudaStream_t stream);

}  // namespace cohort::cuda::detail
