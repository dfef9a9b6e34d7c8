// CUDA kernels of the fused optimizer steps (optim.cu), registered for SGD, Adam and AdamW.
#include <cohort/core/cuda/cuda.h>
#include <cohort/core/cuda/detail/optim_kernels.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/optim/detail/fused_step.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

using optim::detail::AdamScalars;
using optim::detail::SgdScalars;

// p, g and the defined state tensors: contiguous, of p's float dtype and shape, on p's device.
void checkOperands(const char* op, const Tensor& p, std::initializer_list<const Tensor*> others) {
  COHORT_CHECK_T(ValueError, isFloating(p.dtype()), "{}: parameters must be floating point, got {}", op, p.dtype());
  COHORT_CHECK_T(ValueError, p.isContiguous(), "{}: the parameter must be contiguous", op);
  requireSameDevice(op, p.device(), others);
  for (const Tensor* t : others) {
    if (t == nullptr || !t->defined()) continue;
    COHORT_CHECK_T(ValueError, t->dtype() == p.dtype() && t->sizes() == p.sizes() && t->isContiguous(),
                   "{}: a tensor of dtype {} and shape {} (contiguous: {}) goes with a parameter of dtype {} and "
                   "shape {}",
                   op, t->dtype(), shapeStr(t->sizes()), t->isContiguous(), p.dtype(), shapeStr(p.sizes()));
  }
}

void* ptrOrNull(const Tensor& t) { return t.defined() ? devicePtr(t) : nullptr; }

// A bfloat16/float16 gradient of a float32 parameter (the step kernels' contract allows it) is
// widened here; the kernels read gradients of the parameter's dtype.
Tensor ofParamType(const Tensor& p, const Tensor& g) {
  return !g.defined() || g.dtype() == p.dtype() ? g : g.to(p.dtype()).contiguous();
}

void sgdStepCuda(Tensor& p, const Tensor& grad, Tensor& buf, const SgdScalars& s) {
  const Tensor g = ofParamType(p, grad);
  checkOperands("SGD.step", p, {&g, &buf});
  if (p.numel() == 0) return;
  DeviceGuard guard(p.device().index());
  launchSgdStep(elemType(p.dtype()), devicePtr(p), devicePtr(g), ptrOrNull(buf), p.numel(), s, streamOf(p));
  COHORT_CUDA_CHECK_LAUNCH();
}

void adamStepCuda(Tensor& p, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax, const AdamScalars& s) {
  const char* op = s.decoupled ? "AdamW.step" : "Adam.step";
  const Tensor g = ofParamType(p, grad);
  checkOperands(op, p, {&g, &m, &v, &vmax});
  COHORT_CHECK_T(ValueError, !s.amsgrad || vmax.defined(), "{}: amsgrad needs the max_exp_avg_sq state", op);
  if (p.numel() == 0) return;
  DeviceGuard guard(p.device().index());
  launchAdamStep(elemType(p.dtype()), devicePtr(p), devicePtr(g), devicePtr(m), devicePtr(v),
                 s.amsgrad ? devicePtr(vmax) : nullptr, p.numel(), s, streamOf(p));
  COHORT_CUDA_CHECK_LAUNCH();
}

using optim::detail::AdamStepKernel;
using optim::detail::SgdStepKernel;
const dispatch::Register<SgdStepKernel> kSgd{"SGD.step", DeviceType::CUDA, &sgdStepCuda};
const dispatch::Register<AdamStepKernel> kAdam{"Adam.step", DeviceType::CUDA, &adamStepCuda};
const dispatch::Register<AdamStepKernel> kAdamW{"AdamW.step", DeviceType::CUDA, &adamStepCuda};

}  // namespace
}  // namespace cohort::cuda::detail
