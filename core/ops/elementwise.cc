// Elementwise arithmetic with broadcasting. Kernels run through detail::mapKernel (tensor/iter.h),
// whose contiguous inner loops the compiler vectorizes; half types compute in float32.
#include <cmath>

#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/elementwise_impl.h>
#include <cohort/core/ops/ops.h>

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

void checkBinary(const Tensor& a, const Tensor& b, const char* op) {
  if (!a.defined() || !b.defined()) throw ValueError(fmt::format("{}: an input tensor is undefined", op));
  if (a.device() != b.device())
    throw ValueError(fmt::format("{}: inputs are on different devices ({} and {})", op, a.device(), b.device()));
}

}  // namespace detail

// ---- add / sub / mul / div ----------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  Tensor out;
  bool unitAlpha = alpha.toDouble() == 1.0;
  if (unitAlpha) {
    out = detail::binaryOp(a, b, "add", [](auto x, auto y) { return x + y; });
  } else {
    out = detail::binaryOpWithScalar(a, b, alpha, "add", [](auto x, auto y, auto s) { return x + s * y; });
  }
  double al = alpha.toDouble();
  autograd::record("add", {a, b}, {out}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], al == 1.0 ? g[0] : g[0] * al};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (a.defined() && a.dtype() == DType::Bool && b.defined() && b.dtype() == DType::Bool)
    throw ValueError("sub: subtraction of two bool tensors is not supported; use logical operations");
  Tensor out;
  if (alpha.toDouble() == 1.0) {
    out = detail::binaryOp(a, b, "sub", [](auto x, auto y) { return x - y; });
  } else {
    out = detail::binaryOpWithScalar(a, b, alpha, "sub", [](auto x, auto y, auto s) { return x - s * y; });
  }
  double al = alpha.toDouble();
  autograd::record("sub", {a, b}, {out}, {}, [al](Ctx&, const GradList& g) -> GradList {
    return {g[0], g[0] * (-al)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = detail::binaryOp(a, b, "mul", [](auto x, auto y) { return x * y; });
  autograd::record("mul", {a, b}, {out}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    if (ctx.needsInputGrad(0)) r[0] = g[0] * ctx.saved(1);
    if (ctx.needsInputGrad(1)) r[1] = g[0] * ctx.saved(0);
    return r;
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  // True division: integer inputs give float32, as in PyTorch.
  Tensor af = a, bf = b;
  if (a.defined() && b.defined() && !isFloating(promoteTypes(a.dtype(), b.dtype()))) {
    af = a.to(DType::Float32);
    bf = b.to(DType::Float32);
  }
  Tensor out = detail::binaryOp(af, bf, "div", [](auto x, auto y) { return x / y; });
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
  Tensor out = detail::scalarOp(a, s, "add", [](auto x, auto v) { return x + v; });
  autograd::record("add", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, Scalar s) {
  Tensor out = detail::scalarOp(a, s, "mul", [](auto x, auto v) { return x * v; });
  double sv = s.toDouble();
  autograd::record("mul", {a}, {out}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] * sv}; });
  return out;
}

Tensor div(const Tensor& a, Scalar s) {
  Tensor af = a.defined() && !isFloating(a.dtype()) ? a.to(DType::Float32) : a;
  double sv = s.toDouble();
  Tensor out = detail::scalarOp(af, Scalar(sv), "div", [](auto x, auto v) { return x / v; });
  autograd::record("div", {a}, {out}, {}, [sv](Ctx&, const GradList& g) -> GradList { return {g[0] / sv}; });
  return out;
}

Tensor rsub(const Tensor& a, Scalar s) {
  Tensor out = detail::scalarOp(a, s, "rsub", [](auto x, auto v) { return v - x; });
  autograd::record("rsub", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {-g[0]}; });
  return out;
}

Tensor neg(const Tensor& a) {
  if (a.defined() && a.dtype() == DType::Bool) throw ValueError("neg: negation of a bool tensor is not supported");
  Tensor out = detail::unaryOp(a, "neg", [](auto x) { return -x; });
  autograd::record("neg", {a}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {-g[0]}; });
  return out;
}

}  // namespace cohort
