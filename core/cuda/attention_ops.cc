// CUDA kernels of the fused scaled-dot-product attention (core/ops/attention.cc): checks, scratch
// space and launches around core/cuda/attention.cu, registered with the op dispatch.
#include <cstdint>
#include <initializer_list>

#include <cohort/core/cuda/detail/attention_kernels.h>
#include <cohort/core/cuda/detail/check.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/detail/attention.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

constexpr const char* kOp = "scaledDotProductAttention";

bool supportsCuda(DType dtype, int64_t e) {
  return (dtype == DType::Float16 || dtype == DType::BFloat16) && attentionHeadDimSupported(e);
}

void requireOperands(std::initializer_list<const Tensor*> ts, const Tensor& q) {
  for (const Tensor* t : ts) {
    COHORT_CHECK(t->device() == q.device(), "{}: operands on {} and {}", kOp, t->device(), q.device());
    COHORT_CHECK(t->isContiguous() && t->dim() == 3, "{}: the CUDA kernel expects dense [nb, t, e] operands, got {}",
                 kOp, shapeStr(t->sizes()));
  }
}

// The kernels read rows with 16-byte loads: an operand that starts elsewhere (a view at an odd
// offset) is copied first.
Tensor aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(devicePtr(t)) % 16 == 0 ? t : t.clone(); }

void forwardCuda(Tensor& out, Tensor& lse, const Tensor& qIn, const Tensor& kIn, const Tensor& vIn, double scale,
                 bool causal) {
  const Tensor q = aligned(qIn), k = aligned(kIn), v = aligned(vIn);
  requireOperands({&out, &q, &k, &v}, q);
  COHORT_CHECK(supportsCuda(q.dtype(), q.size(2)) && k.dtype() == q.dtype() && v.dtype() == q.dtype() &&
                   out.dtype() == q.dtype() && lse.dtype() == DType::Float32 && lse.isContiguous(),
               "{}: unsupported operands for the CUDA kernel", kOp);
  const int64_t nb = q.size(0), tq = q.size(1), tk = k.size(1), e = q.size(2);
  COHORT_CHECK(k.size(0) == nb && v.size(0) == nb && v.size(1) == tk && k.size(2) == e && v.size(2) == e &&
                   out.sizes() == q.sizes() && lse.numel() == nb * tq,
               "{}: mismatched operand shapes", kOp);
  if (nb == 0 || tq == 0) return;
  DeviceGuard guard(q.device().index());
  COHORT_CUDA_CHECK(launchAttentionForward(elemType(q.dtype()), devicePtr(q), devicePtr(k), devicePtr(v),
                                           devicePtr(out), static_cast<float*>(devicePtr(lse)), nb, tq, tk, e, scale,
                                           causal, streamOf(q)));
}

void backwardCuda(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& qIn, const Tensor& kIn, const Tensor& vIn,
                  const Tensor& outIn, const Tensor& lse, const Tensor& doutIn, double scale, bool causal) {
  const Tensor q = aligned(qIn), k = aligned(kIn), v = aligned(vIn), out = aligned(outIn), dout = aligned(doutIn);
  requireOperands({&dq, &dk, &dv, &q, &k, &v, &out, &dout}, q);
  const int64_t nb = q.size(0), tq = q.size(1), tk = k.size(1), e = q.size(2);
  COHORT_CHECK(dq.sizes() == q.sizes() && dk.sizes() == k.sizes() && dv.sizes() == v.sizes() &&
                   out.sizes() == q.sizes() && dout.sizes() == q.sizes() && dout.dtype() == q.dtype() &&
                   dq.dtype() == q.dtype() && dk.dtype() == q.dtype() && dv.dtype() == q.dtype(),
               "{}: mismatched gradient operands", kOp);
  if (nb == 0 || tq == 0 || tk == 0) return;
  DeviceGuard guard(q.device().index());
  const cudaStream_t stream = streamOf(q);
  Tensor delta = empty({nb, tq}, {.dtype = DType::Float32, .device = q.device()});
  // Key blocks add their share of dq with atomics: a float buffer, zeroed, then cast.
  Tensor dqAcc = empty({nb, tq, e}, {.dtype = DType::Float32, .device = q.device()});
  COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(dqAcc), 0, dqAcc.nbytes(), stream));
  COHORT_CUDA_CHECK(launchAttentionDelta(elemType(q.dtype()), devicePtr(out), devicePtr(dout),
                                         static_cast<float*>(devicePtr(delta)), nb * tq, e, stream));
  COHORT_CUDA_CHECK(launchAttentionBackward(elemType(q.dtype()), devicePtr(q), devicePtr(k), devicePtr(v),
                                            devicePtr(dout), static_cast<const float*>(devicePtr(lse)),
                                            static_cast<const float*>(devicePtr(delta)),
                                            static_cast<float*>(devicePtr(dqAcc)), devicePtr(dk), devicePtr(dv), nb, tq,
                                            tk, e, scale, causal, stream));
  dq.copy_(dqAcc);
}

constexpr DeviceType kCuda = DeviceType::CUDA;
const dispatch::Register<cohort::detail::SdpaSupportsKernel> kRegSupports{kOp, kCuda, &supportsCuda};
const dispatch::Register<cohort::detail::SdpaForwardKernel> kRegForward{kOp, kCuda, &forwardCuda};
const dispatch::Register<cohort::detail::SdpaBackwardKernel> kRegBackward{kOp, kCuda, &backwardCuda};

}  // namespace
}  // namespace cohort::cuda::detail
