// Internal to core/ops/attention.cc and its tests.
#pragma once

#include <cohort/core/ops/functional.h>

namespace cohort::detail {

// Kernel signatures of the fused attention on devices other than the CPU (internal to core/ops),
// registered under "scaledDotProductAttention" (all three, each its own signature). q [nb, tq, e],
// k and v [nb, tk, e] are dense, of one 16-bit dtype, tq and tk > 0.
// Whether the device's kernel computes this dtype and head size (else the op runs the unfused formula,
// scaledDotProductAttentionMath).
using SdpaSupportsKernel = bool(DType dtype, int64_t e);
// out [nb, tq, e] (q's dtype) and lse [nb, tq] (float32, the rows' log-sum-exp of the scaled
// scores), both allocated by the caller.
using SdpaForwardKernel = void(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               double scale, bool causal);
// dq, dk, dv (q's dtype, allocated by the caller) from the forward's inputs, output and lse and
// the output's gradient dout (dense, q's dtype).
using SdpaBackwardKernel = void(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, bool causal);

}  // namespace cohort::detail
