// In-place elementwise Tensor members (add_, mul_, addcmul_, lerp_, clamp_, ...): the updates
// optimizers run on every parameter each step.
//
// Every op checks everything before writing a byte (the other operands must broadcast to self's
// shape without changing it; integer tensors cannot take a floating result; a leaf that requires
// grad is refused while grad mode is on), then writes, then calls autograd::recordInplace, which
// bumps the version counter (so a saved copy of self is detected in backward) and records the
// op's backward when history is needed.
//
// The update runs the kernel registered for self's device under the out-of-place op of the same
// formula ("add" for add_), with self as both output and first input when every operand already
// has self's dtype (on the CPU, mapKernel's contiguous inner loop is then a plain vectorized loop).
// Mixed dtypes (a float32 update to a bfloat16 tensor) compute in the promoted dtype and round once
// into self.
#include <array>
#include <cmath>

#include <cohort/core/autograd/function.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/detail/elementwise_impl.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

namespace {

// All checks that must fail before self is modified.
void precheck(const char* op, const Tensor& self, std::initializer_list<const Tensor*> others) {
  if (!self.defined()) throw ValueError(fmt::format("{}: the tensor modified in place is undefined", op));
  std::vector<Tensor> all{self};
  for (const Tensor* o : others) {
    if (!o->defined()) throw ValueError(fmt::format("{}: an operand tensor is undefined", op));
    if (o->device() != self.device())
      throw ValueError(
          fmt::format("{}: operands are on different devices ({} and {})", op, self.device(), o->device()));
    if (broadcastShapes(o->sizes(), self.sizes(), op) != self.sizes())
      throw ValueError(fmt::format("{}: an operand of shape {} would broadcast the tensor of shape {} modified in "
                                   "place to shape {}",
                                   op, shapeStr(o->sizes()), shapeStr(self.sizes()),
                                   shapeStr(broadcastShapes(o->sizes(), self.sizes(), op))));
    all.push_back(*o);
  }
  for (int64_t d = 0; d < self.dim(); ++d)
    if (self.sizes()[d] > 1 && self.strides()[d] == 0)
      throw ValueError(fmt::format("{}: the tensor of shape {} with strides {} has several elements in one memory "
                                   "location (an expanded view); clone it before modifying it in place",
                                   op, shapeStr(self.sizes()), shapeStr(self.strides())));
  autograd::checkInplace(op, self);
  if (autograd::needsGrad(all) && self.impl()->isView)
    throw NotSupportedError(fmt::format("{}: writing a tensor that requires grad into a view (shape {}) is not "
                                        "supported under autograd; use the out-of-place form",
                                        op, shapeStr(self.sizes())));
}

// The result dtype `result` must be storable in self (torch's "can't cast" rule).
void checkCast(const char* op, DType result, const Tensor& self) {
  bool ok = true;
  if (isFloating(result) && !isFloating(self.dtype())) ok = false;
  if (self.dtype() == DType::Bool && result != DType::Bool) ok = false;
  if (!ok)
    throw ValueError(fmt::format("{}: result type {} can't be cast to the dtype {} of the tensor (shape {}) modified "
                                 "in place",
                                 op, result, self.dtype(), shapeStr(self.sizes())));
}

// The kernels of the updates, by the names of the out-of-place ops with the same formula (the
// scalar, a double, converts to the compute type in the kernel).
auto binaryOn(const char* name) {
  return [name](Tensor& out, const std::array<Tensor, 2>& in) {
    dispatch::kernel<dispatch::BinaryKernel>(name, out.device())(out, in[0], in[1]);
  };
}
auto binaryScalarOn(const char* name, double s) {
  return [name, s](Tensor& out, const std::array<Tensor, 2>& in) {
    dispatch::kernel<dispatch::BinaryScalarKernel>(name, out.device())(out, in[0], in[1], Scalar(s));
  };
}
auto scalarOn(const char* name, double s) {
  return [name, s](Tensor& out, const std::array<Tensor, 1>& in) {
    dispatch::kernel<dispatch::ScalarKernel>(name, out.device())(out, in[0], Scalar(s));
  };
}
auto ternaryScalarOn(const char* name, double s) {
  return [name, s](Tensor& out, const std::array<Tensor, 3>& in) {
    dispatch::kernel<dispatch::TernaryScalarKernel>(name, out.device())(out, in[0], in[1], in[2], Scalar(s));
  };
}

DType withScalar(DType t, Scalar s) {
  if (!isFloating(t) && !s.isIntegral()) return DType::Float32;
  if (t == DType::Bool && !s.isBool()) return DType::Int64;
  return t;
}

// self = f(self, others...) computed in `compute`: `kernel(out, {x, others...})` runs the kernel
// registered for self's device under the out-of-place op of the same formula, with out = x. When
// self has the compute dtype that writes self directly; otherwise it writes a converted copy of
// self, which is rounded once into self.
template <size_t N, typename Kernel>
void applyInplace(Tensor& self, const std::array<Tensor, N>& others, DType compute, const char* op, Kernel&& kernel) {
  checkCast(op, compute, self);
  autograd::NoGradGuard ng;
  std::array<Tensor, N + 1> ins;
  ins[0] = self.dtype() == compute ? self : self.to(compute);  // else a converted copy
  for (size_t i = 0; i < N; ++i) ins[i + 1] = others[i].dtype() == compute ? others[i] : others[i].to(compute);
  kernel(ins[0], ins);
  if (!ins[0].isSameAs(self)) self.copy_(ins[0]);
}

}  // namespace

// ---- add_ / sub_ ---------------------------------------------------------------------------------

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) {
  COHORT_RECORD_OP("add_", *this, o, alpha);
  precheck("add_", *this, {&o});
  DType dt = withScalar(promoteTypes(dtype(), o.dtype()), alpha);
  double al = alpha.toDouble();
  if (al == 1.0) applyInplace<1>(*this, {o}, dt, "add_", binaryOn("add"));
  else applyInplace<1>(*this, {o}, dt, "add_", binaryScalarOn("add", al));
  autograd::recordInplace("add_", *this, {o}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], al == 1.0 ? g[0] : g[0] * al};
  });
  return *this;
}

Tensor& Tensor::add_(Scalar v) {
  COHORT_RECORD_OP("add_", *this, v);
  precheck("add_", *this, {});
  DType dt = withScalar(dtype(), v);
  const double s = v.toDouble();
  applyInplace<0>(*this, {}, dt, "add_", scalarOn("add", s));
  autograd::recordInplace("add_", *this, {}, {}, [](Ctx&, const GradList& g) -> GradList { return {g[0]}; });
  return *this;
}

Tensor& Tensor::sub_(const Tensor& o, Scalar alpha) {
  COHORT_RECORD_OP("sub_", *this, o, alpha);
  if (defined() && o.defined() && dtype() == DType::Bool && o.dtype() == DType::Bool)
    throw ValueError("sub_: subtraction of two bool tensors is not supported; use logical operations");
  precheck("sub_", *this, {&o});
  DType dt = withScalar(promoteTypes(dtype(), o.dtype()), alpha);
  double al = alpha.toDouble();
  if (al == 1.0) applyInplace<1>(*this, {o}, dt, "sub_", binaryOn("sub"));
  else applyInplace<1>(*this, {o}, dt, "sub_", binaryScalarOn("sub", al));
  autograd::recordInplace("sub_", *this, {o}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], g[0] * (-al)};
  });
  return *this;
}

// ---- mul_ / div_ ---------------------------------------------------------------------------------

Tensor& Tensor::mul_(const Tensor& o) {
  COHORT_RECORD_OP("mul_", *this, o);
  precheck("mul_", *this, {&o});
  DType dt = promoteTypes(dtype(), o.dtype());
  checkCast("mul_", dt, *this);
  // d/d other needs self's value before the update.
  Tensor before;
  if (autograd::needsGrad({&o})) before = detach().clone();
  applyInplace<1>(*this, {o}, dt, "mul_", binaryOn("mul"));
  autograd::recordInplace("mul_", *this, {o}, {o, before}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    if (ctx.needsInputGrad(0)) r[0] = g[0] * ctx.saved(0);
    if (ctx.needsInputGrad(1)) r[1] = g[0] * ctx.saved(1);
    return r;
  });
  return *this;
}

Tensor& Tensor::mul_(Scalar v) {
  COHORT_RECORD_OP("mul_", *this, v);
  precheck("mul_", *this, {});
  DType dt = withScalar(dtype(), v);
  double sv = v.toDouble();
  applyInplace<0>(*this, {}, dt, "mul_", scalarOn("mul", sv));
  autograd::recordInplace("mul_", *this, {}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] * sv}; });
  return *this;
}

Tensor& Tensor::div_(const Tensor& o) {
  COHORT_RECORD_OP("div_", *this, o);
  precheck("div_", *this, {&o});
  DType dt = promoteTypes(dtype(), o.dtype());
  if (!isFloating(dt)) dt = DType::Float32;  // true division
  applyInplace<1>(*this, {o}, dt, "div_", binaryOn("div"));
  // self is saved after the update: d/d other = -g * self_before / other^2 = -g * self_after / other.
  autograd::recordInplace("div_", *this, {o}, {o, *this}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    Tensor other = ctx.saved(0);
    if (ctx.needsInputGrad(0)) r[0] = g[0] / other;
    if (ctx.needsInputGrad(1)) r[1] = -(g[0] * ctx.saved(1)) / other;
    return r;
  });
  return *this;
}

Tensor& Tensor::div_(Scalar v) {
  COHORT_RECORD_OP("div_", *this, v);
  precheck("div_", *this, {});
  DType dt = isFloating(dtype()) ? dtype() : DType::Float32;
  double sv = v.toDouble();
  applyInplace<0>(*this, {}, dt, "div_", scalarOn("div", sv));
  autograd::recordInplace("div_", *this, {}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] / sv}; });
  return *this;
}

// ---- addcmul_ / addcdiv_ / lerp_ -----------------------------------------------------------------

Tensor& Tensor::addcmul_(const Tensor& t1, const Tensor& t2, Scalar value) {
  COHORT_RECORD_OP("addcmul_", *this, t1, t2, value);
  precheck("addcmul_", *this, {&t1, &t2});
  DType dt = withScalar(promoteTypes(promoteTypes(dtype(), t1.dtype()), t2.dtype()), value);
  double v = value.toDouble();
  applyInplace<2>(*this, {t1, t2}, dt, "addcmul_", ternaryScalarOn("addcmul_", v));
  autograd::recordInplace("addcmul_", *this, {t1, t2}, {t1, t2}, [v](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(3);
    r[0] = g[0];
    if (ctx.needsInputGrad(1)) r[1] = g[0] * ctx.saved(1) * v;
    if (ctx.needsInputGrad(2)) r[2] = g[0] * ctx.saved(0) * v;
    return r;
  });
  return *this;
}

Tensor& Tensor::addcdiv_(const Tensor& t1, const Tensor& t2, Scalar value) {
  COHORT_RECORD_OP("addcdiv_", *this, t1, t2, value);
  precheck("addcdiv_", *this, {&t1, &t2});
  DType dt = withScalar(promoteTypes(promoteTypes(dtype(), t1.dtype()), t2.dtype()), value);
  if (!isFloating(dt))
    throw ValueError(fmt::format("addcdiv_: integer division is not supported (dtypes {}, {} and {}); use floating "
                                 "tensors",
                                 dtype(), t1.dtype(), t2.dtype()));
  double v = value.toDouble();
  applyInplace<2>(*this, {t1, t2}, dt, "addcdiv_", ternaryScalarOn("addcdiv_", v));
  autograd::recordInplace("addcdiv_", *this, {t1, t2}, {t1, t2}, [v](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(3);
    r[0] = g[0];
    Tensor b = ctx.saved(1);
    if (ctx.needsInputGrad(1)) r[1] = g[0] * v / b;
    if (ctx.needsInputGrad(2)) r[2] = -(g[0] * ctx.saved(0) * v) / (b * b);
    return r;
  });
  return *this;
}

Tensor& Tensor::lerp_(const Tensor& end, Scalar weight) {
  COHORT_RECORD_OP("lerp_", *this, end, weight);
  precheck("lerp_", *this, {&end});
  DType dt = promoteTypes(dtype(), end.dtype());
  if (!isFloating(dt))
    throw ValueError(fmt::format("lerp_: expected floating tensors, got {} and {}", dtype(), end.dtype()));
  double w = weight.toDouble();
  // torch's formula, from the nearer end so that weight 1 gives exactly `end`, is the kernel's.
  applyInplace<1>(*this, {end}, dt, "lerp_", binaryScalarOn("lerp_", w));
  autograd::recordInplace("lerp_", *this, {end}, {}, [w](Ctx&, const GradList& g) -> GradList {
    return {g[0] * (1.0 - w), g[0] * w};
  });
  return *this;
}

// ---- clamp_ / sqrt_ / maskedFill_ ----------------------------------------------------------------

Tensor& Tensor::clamp_(std::optional<Scalar> lo, std::optional<Scalar> hi) {
  COHORT_RECORD_OP("clamp_", *this, lo, hi);
  precheck("clamp_", *this, {});
  if (!lo && !hi) throw ValueError("clamp_: at least one of min and max must be given");
  if (((lo && !lo->isIntegral()) || (hi && !hi->isIntegral())) && !isFloating(dtype()))
    checkCast("clamp_", DType::Float32, *this);
  if (dtype() == DType::Bool)
    throw ValueError(fmt::format("clamp_: not supported for bool tensors (shape {})", shapeStr(sizes())));
  Tensor before;
  if (autograd::needsGrad({this})) before = detach().clone();
  {
    autograd::NoGradGuard ng;
    detail::clampKernel(*this, *this, lo, hi, "clamp_");
  }
  autograd::recordInplace("clamp_", *this, {}, {before}, [lo, hi](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::clampGrad(g[0], ctx.saved(0), lo, hi)};
  });
  return *this;
}

Tensor& Tensor::sqrt_() {
  COHORT_RECORD_OP("sqrt_", *this);
  precheck("sqrt_", *this, {});
  checkCast("sqrt_", DType::Float32, *this);
  applyInplace<0>(*this, {}, dtype(), "sqrt_", [](Tensor& out, const std::array<Tensor, 1>& in) {
    dispatch::kernel<dispatch::UnaryKernel>("sqrt", out.device())(out, in[0]);
  });
  autograd::recordInplace("sqrt_", *this, {}, {*this}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "sqrt_ backward")};
  });
  return *this;
}

Tensor& Tensor::maskedFill_(const Tensor& mask, Scalar value) {
  COHORT_RECORD_OP("maskedFill_", *this, mask, value);
  precheck("maskedFill_", *this, {&mask});
  if (mask.dtype() != DType::Bool)
    throw ValueError(fmt::format("maskedFill_: the mask must be a bool tensor, got {} (shape {})", mask.dtype(),
                                 shapeStr(mask.sizes())));
  {
    autograd::NoGradGuard ng;
    dispatch::kernel<dispatch::BinaryScalarKernel>("maskedFill", device())(*this, *this, mask, value);
  }
  autograd::recordInplace("maskedFill_", *this, {mask}, {mask}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {where(ctx.saved(0), zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()}), g[0]), Tensor()};
  });
  return *this;
}

// ---- CPU kernels ---------------------------------------------------------------------------------
// The updates without an out-of-place op of the same formula (add_, mul_, ... use add's, mul's).

namespace {

constexpr auto kAddcmul = [](auto x, auto a, auto b, auto v) COHORT_KERNEL_FN { return x + v * a * b; };
constexpr auto kAddcdiv = [](auto x, auto a, auto b, auto v) COHORT_KERNEL_FN { return x + v * a / b; };

// torch's formula: from the nearer end, so weight 1 gives exactly `end`.
void lerpCpu(Tensor& out, const Tensor& x, const Tensor& end, Scalar weight) {
  const double w = weight.toDouble();
  COHORT_DISPATCH_FLOAT(out.dtype(), "lerp_", [&]<typename T>() {
    using A = Acc<T>;
    const A wv = static_cast<A>(w);
    if (std::abs(w) < 0.5)
      detail::mapKernel<T, T, 2>(out, {x, end}, [wv](A xv, A ev) COHORT_KERNEL_FN { return xv + wv * (ev - xv); });
    else
      detail::mapKernel<T, T, 2>(out, {x, end},
                                 [wv](A xv, A ev) COHORT_KERNEL_FN { return ev - (ev - xv) * (A(1) - wv); });
  });
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<TernaryScalarKernel>("addcmul_", kCpu, &detail::cpuTernaryScalar<decltype(kAddcmul)>);
  Register<TernaryScalarKernel>("addcdiv_", kCpu, &detail::cpuTernaryScalar<decltype(kAddcdiv)>);
  Register<BinaryScalarKernel>("lerp_", kCpu, &lerpCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
