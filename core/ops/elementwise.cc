// Elementwise arithmetic and unary math with broadcasting. Kernels run through detail::mapKernel
// (tensor/iter.h), whose contiguous inner loops the compiler vectorizes; half types compute in
// float32. Transcendental functions come from vec_math.h (vectorizable), not per-element libm
// calls. Comparisons, where, maximum/minimum live in compare.cc; activations in activation.cc;
// the in-place Tensor members in inplace.cc.
#include <cmath>
#include <limits>
#include <utility>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/elementwise_impl.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

namespace detail {

DType resultType(const Tensor& a, const Tensor& b) { return promoteTypes(a.dtype(), b.dtype()); }

DType scalarResultType(const Tensor& a, Scalar s) {
  if (!isFloating(a.dtype()) && !s.isIntegral()) return DType::Float32;
  if (a.dtype() == DType::Bool && s.isIntegral() && !s.isBool()) return DType::Int64;
  return a.dtype();
}

Shape broadcastShapes3(const Shape& a, const Shape& b, const Shape& c, const char* op) {
  auto broadcastable = [](const Shape& x, const Shape& y) {
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      int64_t dx = x[x.size() - 1 - i], dy = y[y.size() - 1 - i];
      if (dx != dy && dx != 1 && dy != 1) return false;
    }
    return true;
  };
  if (!broadcastable(a, b) || !broadcastable(a, c) || !broadcastable(b, c))
    throw ValueError(
        fmt::format("{}: shapes {}, {} and {} do not broadcast together", op, shapeStr(a), shapeStr(b), shapeStr(c)));
  return broadcastShapes(broadcastShapes(a, b, op), c, op);
}

void checkBinary(const Tensor& a, const Tensor& b, const char* op) {
  if (!a.defined() || !b.defined()) throw ValueError(fmt::format("{}: an input tensor is undefined", op));
  if (a.device() != b.device())
    throw ValueError(fmt::format("{}: inputs are on different devices ({} and {})", op, a.device(), b.device()));
}

namespace {

Tensor as(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.detach().to(dt); }

void checkDefined(const Tensor& a, const char* op) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
}

// f(a, b) with result dtype `dt` computed in `compute` (out's dtype unless a comparison).
Tensor binaryIn(const Tensor& a, const Tensor& b, const char* op, DType compute, DType dt) {
  Tensor out = empty(broadcastShapes(a.sizes(), b.sizes(), op), {.dtype = dt, .device = a.device()});
  dispatch::kernel<dispatch::BinaryKernel>(op, out.device())(out, as(a, compute), as(b, compute));
  return out;
}

Tensor ternaryIn(const Tensor& a, const Tensor& b, const Tensor& c, const char* op, DType dt) {
  Tensor out = empty(broadcastShapes3(a.sizes(), b.sizes(), c.sizes(), op), {.dtype = dt, .device = a.device()});
  dispatch::kernel<dispatch::TernaryKernel>(op, out.device())(out, as(a, dt), as(b, dt), as(c, dt));
  return out;
}

DType floating(DType dt) { return isFloating(dt) ? dt : DType::Float32; }

}  // namespace

Tensor binaryOp(const Tensor& a, const Tensor& b, const char* op) {
  checkBinary(a, b, op);
  const DType dt = resultType(a, b);
  return binaryIn(a, b, op, dt, dt);
}

Tensor binaryFloatOp(const Tensor& a, const Tensor& b, const char* op) {
  checkBinary(a, b, op);
  const DType dt = floating(resultType(a, b));
  return binaryIn(a, b, op, dt, dt);
}

Tensor compareOp(const Tensor& a, const Tensor& b, const char* op) {
  checkBinary(a, b, op);
  return binaryIn(a, b, op, resultType(a, b), DType::Bool);
}

Tensor binaryOpWithScalar(const Tensor& a, const Tensor& b, Scalar s, const char* op) {
  checkBinary(a, b, op);
  DType dt = resultType(a, b);
  if (!isFloating(dt) && !s.isIntegral()) dt = DType::Float32;
  Tensor out = empty(broadcastShapes(a.sizes(), b.sizes(), op), {.dtype = dt, .device = a.device()});
  dispatch::kernel<dispatch::BinaryScalarKernel>(op, out.device())(out, as(a, dt), as(b, dt), s);
  return out;
}

Tensor scalarOp(const Tensor& a, Scalar s, const char* op) {
  checkDefined(a, op);
  const DType dt = scalarResultType(a, s);
  Tensor out = empty(a.sizes(), {.dtype = dt, .device = a.device()});
  dispatch::kernel<dispatch::ScalarKernel>(op, out.device())(out, as(a, dt), s);
  return out;
}

Tensor unaryOp(const Tensor& a, const char* op) {
  checkDefined(a, op);
  Tensor out = empty(a.sizes(), {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<dispatch::UnaryKernel>(op, out.device())(out, a);
  return out;
}

Tensor unaryFloatOp(const Tensor& a, const char* op) {
  checkDefined(a, op);
  const DType dt = floating(a.dtype());
  Tensor out = empty(a.sizes(), {.dtype = dt, .device = a.device()});
  dispatch::kernel<dispatch::UnaryKernel>(op, out.device())(out, as(a, dt));
  return out;
}

Tensor ternaryFloatOp(const Tensor& a, const Tensor& b, const Tensor& c, const char* op) {
  checkBinary(a, b, op);
  checkBinary(a, c, op);
  return ternaryIn(a, b, c, op, floating(promoteTypes(resultType(a, b), c.dtype())));
}

}  // namespace detail

// ---- add / sub / mul / div ----------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  COHORT_RECORD_OP("add", a, b, alpha);
  Tensor out;
  bool unitAlpha = alpha.toDouble() == 1.0;
  if (unitAlpha) {
    out = detail::binaryOp(a, b, "add");
  } else {
    out = detail::binaryOpWithScalar(a, b, alpha, "add");
  }
  double al = alpha.toDouble();
  autograd::record("add", {a, b}, {out}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], al == 1.0 ? g[0] : g[0] * al};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  COHORT_RECORD_OP("sub", a, b, alpha);
  if (a.defined() && a.dtype() == DType::Bool && b.defined() && b.dtype() == DType::Bool)
    throw ValueError("sub: subtraction of two bool tensors is not supported; use logical operations");
  Tensor out;
  if (alpha.toDouble() == 1.0) {
    out = detail::binaryOp(a, b, "sub");
  } else {
    out = detail::binaryOpWithScalar(a, b, alpha, "sub");
  }
  double al = alpha.toDouble();
  autograd::record("sub", {a, b}, {out}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], g[0] * (-al)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("mul", a, b);
  Tensor out = detail::binaryOp(a, b, "mul");
  autograd::record("mul", {a, b}, {out}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    if (ctx.needsInputGrad(0)) r[0] = g[0] * ctx.saved(1);
    if (ctx.needsInputGrad(1)) r[1] = g[0] * ctx.saved(0);
    return r;
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("div", a, b);
  // True division: integer inputs give float32, as in PyTorch.
  Tensor af = a, bf = b;
  if (a.defined() && b.defined() && !isFloating(promoteTypes(a.dtype(), b.dtype()))) {
    af = a.to(DType::Float32);
    bf = b.to(DType::Float32);
  }
  Tensor out = detail::binaryOp(af, bf, "div");
  autograd::record("div", {a, b}, {out}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    Tensor bb = ctx.saved(1);
    if (ctx.needsInputGrad(0)) r[0] = g[0] / bb;
    if (ctx.needsInputGrad(1)) r[1] = -(g[0] * ctx.saved(0)) / (bb * bb);
    return r;
  });
  return out;
}

Tensor add(const Tensor& a, Scalar s) {
  COHORT_RECORD_OP("add", a, s);
  Tensor out = detail::scalarOp(a, s, "add");
  autograd::record("add", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, Scalar s) {
  COHORT_RECORD_OP("mul", a, s);
  Tensor out = detail::scalarOp(a, s, "mul");
  double sv = s.toDouble();
  autograd::record("mul", {a}, {out}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] * sv}; });
  return out;
}

Tensor div(const Tensor& a, Scalar s) {
  COHORT_RECORD_OP("div", a, s);
  Tensor af = a.defined() && !isFloating(a.dtype()) ? a.to(DType::Float32) : a;
  double sv = s.toDouble();
  Tensor out = detail::scalarOp(af, Scalar(sv), "div");
  autograd::record("div", {a}, {out}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] / sv}; });
  return out;
}

Tensor rsub(const Tensor& a, Scalar s) {
  COHORT_RECORD_OP("rsub", a, s);
  Tensor out = detail::scalarOp(a, s, "rsub");
  autograd::record("rsub", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {-g[0]}; });
  return out;
}

Tensor neg(const Tensor& a) {
  COHORT_RECORD_OP("neg", a);
  if (a.defined() && a.dtype() == DType::Bool) throw ValueError("neg: negation of a bool tensor is not supported");
  Tensor out = detail::unaryOp(a, "neg");
  autograd::record("neg", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {-g[0]}; });
  return out;
}

// ---- pow ---------------------------------------------------------------------------------------

namespace {

namespace vm = vecmath;

// Integer power by squaring; negative exponents follow torch (only 1 and -1 survive).
template <typename T>
T intPow(T base, T e) {
  if constexpr (std::is_same_v<T, bool>) {
    return e ? base : true;
  } else {
    if constexpr (std::is_signed_v<T>) {
      if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e & 1) ? T(-1) : T(1);
        return 0;
      }
    }
    T r = 1;
    while (e) {
      if (e & 1) r = static_cast<T>(r * base);
      e = static_cast<T>(e >> 1);
      base = static_cast<T>(base * base);
    }
    return r;
  }
}

// v^K for an integer K >= 0 by repeated squaring, unrolled at compile time.
template <int K>
inline __attribute__((always_inline)) double intPowD(double v) {
  if constexpr (K == 0) return 1.0;
  else if constexpr (K == 1) return v;
  else if constexpr (K % 2 == 0) {
    const double h = intPowD<K / 2>(v);
    return h * h;
  } else {
    return v * intPowD<K - 1>(v);
  }
}

// float (and half) x^e for a small integer e, |e| <= 8: products in double (at most 4, relative
// error < 2^-50), one reciprocal for e < 0, rounded once to float: the correctly rounded result
// but for double-rounding ties (error <= 0.5 ulp + 2^-26 ulp). Signs, zeros, infinities and NaN
// follow from IEEE products (x^-3 at -0 is -inf, as std::pow); a float's 8th power stays inside
// the double range (what underflows there underflows in float too). Returns false when e is not
// such an exponent.
constexpr int kMax = 8;

template <typename T>
bool smallIntPowKernel(const Tensor& out, const Tensor& x, double e) {
  if (!(std::abs(e) <= kMax) || std::trunc(e) != e) return false;
  bool done = false;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (((e == static_cast<double>(I - kMax)) && !done
          ? (detail::mapKernel<T, T, 1>(out, {x},
                                        [](float v) COHORT_KERNEL_FN {
                                          constexpr int kExp = I - kMax;
                                          const double p = intPowD<(kExp < 0 ? -kExp : kExp)>(static_cast<double>(v));
                                          return static_cast<float>(kExp < 0 ? 1.0 / p : p);
                                        }),
             done = true)
          : false),
     ...);
  }
  (std::make_integer_sequence<int, 2 * kMax + 1>{});
  return done;
}

// The CPU's "pow" with a constant exponent, no autograd. Floating tensors: common exponents get
// exact short forms (torch does the same), float small integer exponents repeated products in
// double, the rest go through vecmath::pow (AVX-512 where the CPU has it). Integer tensors: by
// squaring (the op refuses negative exponents).
void powScalarCpu(Tensor& out, const Tensor& x, Scalar s) {
  if (!isFloating(out.dtype())) {
    const int64_t e = s.toInt();
    COHORT_DISPATCH_NUMERIC(out.dtype(), "pow", [&]<typename T>() {
      if constexpr (std::is_integral_v<T>) {
        const T ev = static_cast<T>(e);
        detail::mapKernel<T, T, 1>(out, {x}, [ev](T v) COHORT_KERNEL_FN { return intPow<T>(v, ev); });
      }
    });
    return;
  }
  const double e = s.toDouble();
  const bool shortForm = e == 0 || e == 1 || e == 2 || e == 3 || e == 0.5 || e == -0.5 || e == -1 || e == -2 ||
                         (std::abs(e) <= kMax && std::trunc(e) == e);
  if (!shortForm && detail::simd::powScalar(out, x, vm::PowExponent(e))) return;
  COHORT_DISPATCH_FLOAT(x.dtype(), "pow", [&]<typename T>() {
    using A = Acc<T>;
    if (e == 0) detail::mapKernel<T, T, 1>(out, {x}, [](A) COHORT_KERNEL_FN { return A(1); });
    else if (e == 1) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return v; });
    else if (e == 2) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return v * v; });
    else if (e == 3) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return v * v * v; });
    else if (e == 0.5) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return std::sqrt(v); });
    else if (e == -0.5) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return A(1) / std::sqrt(v); });
    else if (e == -1) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return A(1) / v; });
    else if (e == -2) detail::mapKernel<T, T, 1>(out, {x}, [](A v) COHORT_KERNEL_FN { return A(1) / (v * v); });
    else if constexpr (std::is_same_v<A, float>) {
      if (smallIntPowKernel<T>(out, x, e)) return;
      // The exponent's special-case flags and its float-pair split are computed once, not per
      // element; the double exponent's low part is kept (x^1.7 is not x^1.7f).
      const vm::PowExponent pe(e);
      detail::mapKernel<T, T, 1>(
          out, {x}, [pe](A v) COHORT_KERNEL_FN { return vm::pow(v, pe); }, detail::kComputeBoundGrain);
    } else {
      detail::mapKernel<T, T, 1>(
          out, {x}, [e](A v) COHORT_KERNEL_FN { return vm::pow(v, e); }, detail::kComputeBoundGrain);
    }
  });
}

// x^e in x's dtype on x's device, no autograd.
Tensor powScalarKernel(const Tensor& x, Scalar e) {
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  dispatch::kernel<dispatch::ScalarKernel>("pow", x.device())(out, x, e);
  return out;
}

}  // namespace

Tensor pow(const Tensor& a, Scalar exponent) {
  COHORT_RECORD_OP("pow", a, exponent);
  COHORT_AUTOCAST("pow", pow, a, exponent);
  if (!a.defined()) throw ValueError("pow: the input tensor is undefined");
  DType dt = detail::scalarResultType(a, exponent);
  Tensor x = a.dtype() == dt ? a : a.detach().to(dt);
  if (!isFloating(dt) && exponent.toInt() < 0)
    throw ValueError(fmt::format("pow: integers to negative integer powers are not allowed (tensor of dtype {} "
                                 "and shape {}, exponent {})",
                                 a.dtype(), shapeStr(a.sizes()), exponent.toInt()));
  Tensor out = powScalarKernel(x, isFloating(dt) ? Scalar(exponent.toDouble()) : Scalar(exponent.toInt()));
  double e = exponent.toDouble();
  autograd::record("pow", {a}, {out}, {a}, [e](Ctx& ctx, const GradList& g) -> GradList {
    if (e == 0) return {zerosLike(g[0])};
    Tensor x = ctx.saved(0);
    if (!isFloating(x.dtype())) x = x.to(g[0].dtype());
    return {g[0] * (powScalarKernel(x, Scalar(e - 1)) * e)};
  });
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("pow", a, b);
  COHORT_AUTOCAST("pow", pow, a, b);
  detail::checkBinary(a, b, "pow");
  DType dt = detail::resultType(a, b);
  if (dt == DType::Bool)
    throw ValueError(fmt::format("pow: not supported for two bool tensors (shapes {} and {})", shapeStr(a.sizes()),
                                 shapeStr(b.sizes())));
  Tensor out = detail::binaryOp(a, b, "pow");
  autograd::record("pow", {a, b}, {out}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    Tensor x = ctx.saved(0), y = ctx.saved(1);
    // d/da = b a^(b-1) (0 where b == 0); d/db = a^b log(a) (0 where a == 0 and b >= 0), as torch.
    if (ctx.needsInputGrad(0)) r[0] = detail::ternaryFloatOp(g[0], x, y, "pow backward (base)");
    if (ctx.needsInputGrad(1)) r[1] = detail::ternaryFloatOp(g[0], x, y, "pow backward (exponent)");
    return r;
  });
  return out;
}

// ---- unary math ----------------------------------------------------------------------------------

Tensor exp(const Tensor& a) {
  COHORT_RECORD_OP("exp", a);
  COHORT_AUTOCAST("exp", exp, a);
  Tensor out = detail::unaryFloatOp(a, "exp");
  autograd::record("exp", {a}, {out}, {out},
                   [](Ctx& ctx, const GradList& g) -> GradList { return {g[0] * ctx.saved(0)}; });
  return out;
}

Tensor log(const Tensor& a) {
  COHORT_RECORD_OP("log", a);
  COHORT_AUTOCAST("log", log, a);
  Tensor out = detail::unaryFloatOp(a, "log");
  autograd::record("log", {a}, {out}, {a},
                   [](Ctx& ctx, const GradList& g) -> GradList { return {g[0] / ctx.saved(0)}; });
  return out;
}

Tensor sqrt(const Tensor& a) {
  COHORT_RECORD_OP("sqrt", a);
  Tensor out = detail::unaryFloatOp(a, "sqrt");
  autograd::record("sqrt", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "sqrt backward")};
  });
  return out;
}

Tensor rsqrt(const Tensor& a) {
  COHORT_RECORD_OP("rsqrt", a);
  COHORT_AUTOCAST("rsqrt", rsqrt, a);
  Tensor out = detail::unaryFloatOp(a, "rsqrt");
  autograd::record("rsqrt", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    // d/dx x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "rsqrt backward")};
  });
  return out;
}

Tensor abs(const Tensor& a) {
  COHORT_RECORD_OP("abs", a);
  if (a.defined() && a.dtype() == DType::Bool)
    throw ValueError(fmt::format("abs: not supported for bool tensors (shape {})", shapeStr(a.sizes())));
  Tensor out = detail::unaryOp(a, "abs");
  autograd::record("abs", {a}, {out}, {a}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "abs backward")};
  });
  return out;
}

// ---- clamp ---------------------------------------------------------------------------------------

namespace detail {

// x clamped to [lo, hi]; NaN stays NaN; when lo > hi every element becomes hi (as torch).
template <typename A>
inline A clampValue(A x, A lo, A hi, bool hasLo, bool hasHi) {
  A r = hasLo && x < lo ? lo : x;
  return hasHi && r > hi ? hi : r;
}

void clampKernel(const Tensor& out, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi,
                 const char* op) {
  Tensor o = out;
  dispatch::kernel<dispatch::ClampKernel>(op, out.device())(o, x, lo, hi);
}

// g where lo <= x <= hi (the gradient mask of clamp, as torch), else 0.
Tensor clampGrad(const Tensor& g, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi) {
  const double l = lo ? lo->toDouble() : -std::numeric_limits<double>::infinity();
  const double h = hi ? hi->toDouble() : std::numeric_limits<double>::infinity();
  checkBinary(g, x, "clamp backward");
  DType dt = resultType(g, x);
  if (!isFloating(dt)) dt = DType::Float32;
  Tensor out = empty(broadcastShapes(g.sizes(), x.sizes(), "clamp backward"), {.dtype = dt, .device = g.device()});
  Tensor gc = g.dtype() == dt ? g : g.detach().to(dt);
  Tensor xc = x.dtype() == dt ? x : x.detach().to(dt);
  dispatch::kernel<dispatch::ClampGradKernel>("clamp backward", g.device())(out, gc, xc, l, h);
  return out;
}

namespace {

void clampCpu(Tensor& out, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi) {
  COHORT_DISPATCH_NUMERIC(out.dtype(), "clamp", [&]<typename T>() {
    using A = Acc<T>;
    const A l = lo ? lo->to<A>() : A(0), h = hi ? hi->to<A>() : A(0);
    if (lo && hi)
      mapKernel<T, T, 1>(out, {x}, [l, h](A v) COHORT_KERNEL_FN { return clampValue(v, l, h, true, true); });
    else if (lo) mapKernel<T, T, 1>(out, {x}, [l](A v) COHORT_KERNEL_FN { return v < l ? l : v; });
    else mapKernel<T, T, 1>(out, {x}, [h](A v) COHORT_KERNEL_FN { return v > h ? h : v; });
  });
}

void clampGradCpu(Tensor& out, const Tensor& g, const Tensor& x, double l, double h) {
  COHORT_DISPATCH_FLOAT(out.dtype(), "clamp backward", [&]<typename T>() {
    using A = Acc<T>;
    mapKernel<T, T, 2>(out, {g, x}, [l, h](A gv, A xv) COHORT_KERNEL_FN {
      return (xv >= static_cast<A>(l)) & (xv <= static_cast<A>(h)) ? gv : A(0);
    });
  });
}

}  // namespace

}  // namespace detail

Tensor clamp(const Tensor& a, std::optional<Scalar> lo, std::optional<Scalar> hi) {
  COHORT_RECORD_OP("clamp", a, lo, hi);
  if (!a.defined()) throw ValueError("clamp: the input tensor is undefined");
  if (!lo && !hi) throw ValueError("clamp: at least one of min and max must be given");
  DType dt = a.dtype();
  if ((lo && !lo->isIntegral()) || (hi && !hi->isIntegral()))
    if (!isFloating(dt)) dt = DType::Float32;
  if (dt == DType::Bool)
    throw ValueError(fmt::format("clamp: not supported for bool tensors (shape {})", shapeStr(a.sizes())));
  Tensor x = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor out = empty(a.sizes(), {.dtype = dt, .device = a.device()});
  detail::clampKernel(out, x, lo, hi, "clamp");
  autograd::record("clamp", {a}, {out}, {a}, [lo, hi](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::clampGrad(g[0], ctx.saved(0), lo, hi)};
  });
  return out;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

using detail::kComputeBoundGrain;

constexpr auto kAdd = [](auto x, auto y) COHORT_KERNEL_FN { return x + y; };
constexpr auto kSub = [](auto x, auto y) COHORT_KERNEL_FN { return x - y; };
constexpr auto kMul = [](auto x, auto y) COHORT_KERNEL_FN { return x * y; };
constexpr auto kDiv = [](auto x, auto y) COHORT_KERNEL_FN { return x / y; };
constexpr auto kAddScaled = [](auto x, auto y, auto s) COHORT_KERNEL_FN { return x + s * y; };
constexpr auto kSubScaled = [](auto x, auto y, auto s) COHORT_KERNEL_FN { return x - s * y; };
constexpr auto kAddScalar = [](auto x, auto v) COHORT_KERNEL_FN { return x + v; };
constexpr auto kMulScalar = [](auto x, auto v) COHORT_KERNEL_FN { return x * v; };
constexpr auto kDivScalar = [](auto x, auto v) COHORT_KERNEL_FN { return x / v; };
constexpr auto kRsubScalar = [](auto x, auto v) COHORT_KERNEL_FN { return v - x; };
constexpr auto kNeg = [](auto x) COHORT_KERNEL_FN { return -x; };
constexpr auto kPow = [](auto x, auto y) COHORT_KERNEL_FN {
  if constexpr (std::is_floating_point_v<decltype(x)>) return vm::pow(x, y);
  else return intPow(x, y);
};
constexpr auto kPowBackwardBase = [](auto gv, auto xv, auto yv) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return yv == A(0) ? A(0) : gv * yv * vm::pow(xv, yv - A(1));
};
constexpr auto kPowBackwardExponent = [](auto gv, auto xv, auto yv) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return (xv == A(0)) & (yv >= A(0)) ? A(0) : gv * vm::pow(xv, yv) * vm::log(xv);
};
constexpr auto kExp = [](auto x) COHORT_KERNEL_FN { return vm::exp(x); };
constexpr auto kLog = [](auto x) COHORT_KERNEL_FN { return vm::log(x); };
constexpr auto kSqrt = [](auto x) COHORT_KERNEL_FN { return std::sqrt(x); };
constexpr auto kSqrtBackward = [](auto gv, auto y) COHORT_KERNEL_FN { return gv / (y + y); };
constexpr auto kRsqrt = [](auto x) COHORT_KERNEL_FN { return vm::rsqrt(x); };
// d/dx x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2
constexpr auto kRsqrtBackward = [](auto gv, auto y) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return A(-0.5) * gv * y * y * y;
};
constexpr auto kAbs = [](auto x) COHORT_KERNEL_FN {
  using A = decltype(x);
  if constexpr (std::is_floating_point_v<A>) return std::fabs(x);
  else if constexpr (std::is_unsigned_v<A>) return x;
  else return x < 0 ? A(-x) : x;
};
constexpr auto kAbsBackward = [](auto gv, auto x) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return x > A(0) ? gv : (x < A(0) ? -gv : A(0));
};

// a^b: the AVX-512 loop for two float32 operands of one shape, else the portable one.
void powCpu(Tensor& out, const Tensor& a, const Tensor& b) {
  if (!detail::simd::powTensor(out, a, b)) detail::cpuBinary<decltype(kPow), kComputeBoundGrain>(out, a, b);
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  using detail::simd::Unary;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<BinaryKernel>("add", kCpu, &detail::cpuBinary<decltype(kAdd)>);
  Register<BinaryKernel>("sub", kCpu, &detail::cpuBinary<decltype(kSub)>);
  Register<BinaryKernel>("mul", kCpu, &detail::cpuBinary<decltype(kMul)>);
  Register<BinaryKernel>("div", kCpu, &detail::cpuBinary<decltype(kDiv)>);
  Register<BinaryKernel>("pow", kCpu, &powCpu);
  Register<BinaryScalarKernel>("add", kCpu, &detail::cpuBinaryScalar<decltype(kAddScaled)>);
  Register<BinaryScalarKernel>("sub", kCpu, &detail::cpuBinaryScalar<decltype(kSubScaled)>);
  Register<ScalarKernel>("add", kCpu, &detail::cpuScalar<decltype(kAddScalar)>);
  Register<ScalarKernel>("mul", kCpu, &detail::cpuScalar<decltype(kMulScalar)>);
  Register<ScalarKernel>("div", kCpu, &detail::cpuScalar<decltype(kDivScalar)>);
  Register<ScalarKernel>("rsub", kCpu, &detail::cpuScalar<decltype(kRsubScalar)>);
  Register<ScalarKernel>("pow", kCpu, &powScalarCpu);
  Register<UnaryKernel>("neg", kCpu, &detail::cpuUnary<decltype(kNeg)>);
  Register<UnaryKernel>("abs", kCpu, &detail::cpuUnary<decltype(kAbs)>);
  Register<UnaryKernel>("exp", kCpu, &detail::cpuUnaryFloatSimd<Unary::Exp, decltype(kExp)>);
  Register<UnaryKernel>("log", kCpu, &detail::cpuUnaryFloatSimd<Unary::Log, decltype(kLog)>);
  Register<UnaryKernel>("sqrt", kCpu, &detail::cpuUnaryFloat<decltype(kSqrt)>);
  Register<UnaryKernel>("rsqrt", kCpu, &detail::cpuUnaryFloat<decltype(kRsqrt)>);
  Register<BinaryKernel>("sqrt backward", kCpu, &detail::cpuBinaryFloat<decltype(kSqrtBackward)>);
  Register<BinaryKernel>("sqrt_ backward", kCpu, &detail::cpuBinaryFloat<decltype(kSqrtBackward)>);
  Register<BinaryKernel>("rsqrt backward", kCpu, &detail::cpuBinaryFloat<decltype(kRsqrtBackward)>);
  Register<BinaryKernel>("abs backward", kCpu, &detail::cpuBinaryFloat<decltype(kAbsBackward)>);
  Register<TernaryKernel>("pow backward (base)", kCpu,
                          &detail::cpuTernaryFloat<decltype(kPowBackwardBase), kComputeBoundGrain>);
  Register<TernaryKernel>("pow backward (exponent)", kCpu,
                          &detail::cpuTernaryFloat<decltype(kPowBackwardExponent), kComputeBoundGrain>);
  Register<ClampKernel>("clamp", kCpu, &detail::clampCpu);
  Register<ClampKernel>("clamp_", kCpu, &detail::clampCpu);
  Register<ClampGradKernel>("clamp backward", kCpu, &detail::clampGradCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
