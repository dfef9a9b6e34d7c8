// Internal to core/ops/attention.cc and its tests.
#pragma once

#include <cohort/core/ops/functional.h>

namespace cohort::detail {

// scaledDotProductAttention computed with matmul, softmax and where on whole [..., Tq, Tk]
// matrices: the path of devices without the fused kernel. Same checks, mask semantics and dropout
// keep mask (it draws from opts.generator the same way), so the two agree on any device.
Tensor sdpaUnfused(const Tensor& q, const Tensor& k, const Tensor& v, const nn::functional::SdpaOptions& opts);

}  // namespace cohort::detail
