// In-place elementwise Tensor members (add_, mul_, addcmul_, lerp_, clamp_, ...): the updates
// optimizers run on every parameter each step.
//
// Every op checks everything before writing a byte (the other operands must broadcast to self's
// shape without changing it; integer tensors cannot take a floating result; a leaf that requires
// grad is refused while grad mode is on), then writes, then calls autograd::recordInplace, which
// bumps the version counter (so a saved copy of self is detected in backward) and records the
// op's backward when history is needed.
//
// Fast path: when every operand already has self's dtype the update runs through mapKernel with
// self as both output and input, whose contiguous inner loop is a plain vectorized loop. Mixed
// dtypes (a float32 update to a bfloat16 tensor) compute in the promoted dtype and round once
// into self.
#include <array>

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

// The device kernels of the updates, by the names of the out-of-place ops with the same formula
// (a scalar converts to the compute type as the CPU lambdas' static_cast does).
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

// self = f(self, others...) computed in `compute`. On other devices `onDevice(out, {x, others...})`
// runs the device's kernel of the same formula (out may be x).
template <size_t N, typename F, typename OnDevice>
void applyInplace(Tensor& self, const std::array<Tensor, N>& others, DType compute, const char* op, F&& f,
                  OnDevice&& onDevice) {
  checkCast(op, compute, self);
  bool same = compute == self.dtype();
  for (const Tensor& o : others) same = same && o.dtype() == self.dtype();
  autograd::NoGradGuard ng;
  if (!self.device().isCpu()) {
    std::array<Tensor, N + 1> ins;
    ins[0] = same ? self : self.to(compute);
    for (size_t i = 0; i < N; ++i) ins[i + 1] = others[i].dtype() == compute ? others[i] : others[i].to(compute);
    if (same) {
      onDevice(self, ins);
    } else {
      Tensor tmp = empty(self.sizes(), {.dtype = compute, .device = self.device()});
      onDevice(tmp, ins);
      self.copy_(tmp);
    }
    return;
  }
  if (same) {
    COHORT_DISPATCH(self.dtype(), op, [&]<typename T>() {
      if constexpr (N == 0) detail::mapKernel<T, T, 1>(self, {self}, f);
      else if constexpr (N == 1) detail::mapKernel<T, T, 2>(self, {self, others[0]}, f);
      else detail::mapKernel<T, T, 3>(self, {self, others[0], others[1]}, f);
    });
    return;
  }
  Tensor tmp = empty(self.sizes(), {.dtype = compute, .device = self.device()});
  Tensor s = self.to(compute);
  std::array<Tensor, N> oc;
  for (size_t i = 0; i < N; ++i) oc[i] = others[i].dtype() == compute ? others[i] : others[i].to(compute);
  COHORT_DISPATCH(compute, op, [&]<typename T>() {
    if constexpr (N == 0) detail::mapKernel<T, T, 1>(tmp, {s}, f);
    else if constexpr (N == 1) detail::mapKernel<T, T, 2>(tmp, {s, oc[0]}, f);
    else detail::mapKernel<T, T, 3>(tmp, {s, oc[0], oc[1]}, f);
  });
  self.copy_(tmp);
}

}  // namespace

// ---- add_ / sub_ ---------------------------------------------------------------------------------

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) {
  COHORT_RECORD_OP("add_", *this, o, alpha);
  precheck("add_", *this, {&o});
  DType dt = withScalar(promoteTypes(dtype(), o.dtype()), alpha);
  double al = alpha.toDouble();
  if (al == 1.0)
    applyInplace<1>(
        *this, {o}, dt, "add_", [](auto x, auto y) COHORT_KERNEL_FN { return x + y; }, binaryOn("add"));
  else
    applyInplace<1>(
        *this, {o}, dt, "add_", [al](auto x, auto y) COHORT_KERNEL_FN { return x + static_cast<decltype(x)>(al) * y; },
        binaryScalarOn("add", al));
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
  applyInplace<0>(
      *this, {}, dt, "add_", [s](auto x) COHORT_KERNEL_FN { return x + static_cast<decltype(x)>(s); },
      scalarOn("add", s));
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
  if (al == 1.0)
    applyInplace<1>(
        *this, {o}, dt, "sub_", [](auto x, auto y) COHORT_KERNEL_FN { return x - y; }, binaryOn("sub"));
  else
    applyInplace<1>(
        *this, {o}, dt, "sub_", [al](auto x, auto y) COHORT_KERNEL_FN { return x - static_cast<decltype(x)>(al) * y; },
        binaryScalarOn("sub", al));
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
  applyInplace<1>(
      *this, {o}, dt, "mul_", [](auto x, auto y) COHORT_KERNEL_FN { return x * y; }, binaryOn("mul"));
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
  applyInplace<0>(
      *this, {}, dt, "mul_", [sv](auto x) COHORT_KERNEL_FN { return x * static_cast<decltype(x)>(sv); },
      scalarOn("mul", sv));
  autograd::recordInplace("mul_", *this, {}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] * sv}; });
  return *this;
}

Tensor& Tensor::div_(const Tensor& o) {
  COHORT_RECORD_OP("div_", *this, o);
  precheck("div_", *this, {&o});
  DType dt = promoteTypes(dtype(), o.dtype());
  if (!isFloating(dt)) dt = DType::Float32;  // true division
  applyInplace<1>(
      *this, {o}, dt, "div_", [](auto x, auto y) COHORT_KERNEL_FN { return x / y; }, binaryOn("div"));
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
  applyInplace<0>(
      *this, {}, dt, "div_", [sv](auto x) COHORT_KERNEL_FN { return x / static_cast<decltype(x)>(sv); },
      scalarOn("div", sv));
  autograd::recordInplace("div_", *this, {}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] / sv}; });
  return *this;
}

// ---- addcmul_ / addcdiv_ / lerp_ -----------------------------------------------------------------

Tensor& Tensor::addcmul_(const Tensor& t1, const Tensor& t2, Scalar value) {
  COHORT_RECORD_OP("addcmul_", *this, t1, t2, value);
  precheck("addcmul_", *this, {&t1, &t2});
  DType dt = withScalar(promoteTypes(promoteTypes(dtype(), t1.dtype()), t2.dtype()), value);
  double v = value.toDouble();
  applyInplace<2>(
      *this, {t1, t2}, dt, "addcmul_",
      [v](auto x, auto a, auto b) COHORT_KERNEL_FN { return x + static_cast<decltype(x)>(v) * a * b; },
      ternaryScalarOn("addcmul_", v));
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
  applyInplace<2>(
      *this, {t1, t2}, dt, "addcdiv_",
      [v](auto x, auto a, auto b) COHORT_KERNEL_FN { return x + static_cast<decltype(x)>(v) * a / b; },
      ternaryScalarOn("addcdiv_", v));
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
  // torch's formula: from the nearer end, so weight 1 gives exactly `end`.
  if (std::abs(w) < 0.5)
    applyInplace<1>(
        *this, {end}, dt, "lerp_",
        [w](auto x, auto e) COHORT_KERNEL_FN { return x + static_cast<decltype(x)>(w) * (e - x); },
        binaryScalarOn("lerp_", w));
  else
    applyInplace<1>(
        *this, {end}, dt, "lerp_",
        [w](auto x, auto e) COHORT_KERNEL_FN {
          using A = decltype(x);
          return e - (e - x) * (A(1) - static_cast<A>(w));
        },
        binaryScalarOn("lerp_", w));
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
  applyInplace<0>(
      *this, {}, dtype(), "sqrt_",
      [](auto x) COHORT_KERNEL_FN {
        if constexpr (std::is_floating_point_v<decltype(x)>) return std::sqrt(x);
        else return x;  // unreachable: checkCast refused non-floating tensors
      },
      [](Tensor& out, const std::array<Tensor, 1>& in) {
        dispatch::kernel<dispatch::UnaryKernel>("sqrt", out.device())(out, in[0]);
      });
  autograd::recordInplace("sqrt_", *this, {}, {*this}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "sqrt_ backward",
                                  [](auto gv, auto y) COHORT_KERNEL_FN { return gv / (y + y); })};
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
    if (!device().isCpu()) {
      // where(mask, value, self) into self; the value converts as fill_ converts it.
      Tensor v = full({}, value, {.dtype = dtype(), .device = device()});
      dispatch::kernel<dispatch::WhereKernel>("where", device())(*this, mask, v, *this);
    } else {
      COHORT_DISPATCH(dtype(), "maskedFill_", [&]<typename T>() {
        const T v = static_cast<T>(value.to<Acc<T>>());
        const Shape& shape = sizes();
        if (numel() == 0) return;
        std::array<char*, 2> ptrs{static_cast<char*>(dataPtr()), static_cast<char*>(mask.dataPtr())};
        std::array<Shape, 2> strides{detail::broadcastByteStrides(*this, shape),
                                     detail::broadcastByteStrides(mask, shape)};
        detail::forEachStrided<2>(shape, ptrs, strides,
                                  [v](std::array<char*, 2> p, const std::array<int64_t, 2>& s, int64_t n) {
                                    if (s[0] == sizeof(T) && s[1] == 1) {
                                      T* o = reinterpret_cast<T*>(p[0]);
                                      const uint8_t* m =
                                          reinterpret_cast<const uint8_t*>(p[1]);  // bool storage; uint8 vectorizes
                                      for (int64_t i = 0; i < n; ++i) o[i] = m[i] != 0 ? v : o[i];
                                    } else {
                                      for (int64_t i = 0; i < n; ++i)
                                        if (*reinterpret_cast<const bool*>(p[1] + i * s[1]))
                                          *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
                                    }
                                  });
      });
    }
  }
  autograd::recordInplace("maskedFill_", *this, {mask}, {mask}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {where(ctx.saved(0), zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()}), g[0]), Tensor()};
  });
  return *this;
}

}  // namespace cohort
