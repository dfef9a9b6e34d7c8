// Activations: relu, gelu (erf and tanh forms), silu, sigmoid, tanh. Forward kernels use the
// vectorizable float math of vec_math.h; backward formulas are fused single-pass kernels in
// torch's formulas (so float results match torch's to rounding).
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/elementwise_impl.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;
namespace vm = vecmath;

namespace {
// g times the activation's derivative at x: the AVX-512 loop when it applies (simd.h), else the
// portable kernel of the same formula.
template <typename F>
Tensor activationGrad(const Tensor& g, const Tensor& x, const char* op, detail::simd::UnaryGrad k, F&& f) {
  Tensor fast = detail::simd::unaryGrad(g, x, k);
  if (fast.defined()) return fast;
  return detail::binaryFloatOp(g, x, op, std::forward<F>(f), detail::kComputeBoundGrain);
}
}  // namespace

Tensor relu(const Tensor& a) {
  COHORT_RECORD_OP("relu", a);
  if (a.defined() && a.dtype() == DType::Bool)
    throw ValueError(fmt::format("relu: not supported for bool tensors (shape {})", shapeStr(a.sizes())));
  Tensor out = detail::unaryOp(a, "relu", [](auto x) COHORT_KERNEL_FN {
    using A = decltype(x);
    return x > A(0) ? x : (x != x ? x : A(0));  // NaN stays NaN, as torch
  });
  autograd::record("relu", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "relu backward", [](auto gv, auto y) COHORT_KERNEL_FN {
      using A = decltype(gv);
      return y > A(0) ? gv : A(0);
    })};
  });
  return out;
}

Tensor sigmoid(const Tensor& a) {
  COHORT_RECORD_OP("sigmoid", a);
  Tensor out = detail::simd::unary(a, detail::simd::Unary::Sigmoid);
  if (!out.defined()) out = detail::unaryFloatOp(a, "sigmoid", [](auto x) COHORT_KERNEL_FN { return vm::sigmoid(x); });
  autograd::record("sigmoid", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "sigmoid backward", [](auto gv, auto y) COHORT_KERNEL_FN {
      using A = decltype(gv);
      return gv * (A(1) - y) * y;
    })};
  });
  return out;
}

Tensor tanh(const Tensor& a) {
  COHORT_RECORD_OP("tanh", a);
  Tensor out = detail::simd::unary(a, detail::simd::Unary::Tanh);
  if (!out.defined()) out = detail::unaryFloatOp(a, "tanh", [](auto x) COHORT_KERNEL_FN { return vm::tanh(x); });
  autograd::record("tanh", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "tanh backward", [](auto gv, auto y) COHORT_KERNEL_FN {
      using A = decltype(gv);
      return gv * (A(1) - y * y);
    })};
  });
  return out;
}

Tensor silu(const Tensor& a) {
  COHORT_RECORD_OP("silu", a);
  Tensor out = detail::simd::unary(a, detail::simd::Unary::Silu);
  if (!out.defined()) out = detail::unaryFloatOp(a, "silu", [](auto x) COHORT_KERNEL_FN { return vm::silu(x); });
  autograd::record("silu", {a}, {out}, {a}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {activationGrad(g[0], ctx.saved(0), "silu backward", detail::simd::UnaryGrad::Silu,
                           [](auto gv, auto x) COHORT_KERNEL_FN { return vm::siluGrad(gv, x); })};
  });
  return out;
}

Tensor gelu(const Tensor& a, bool tanhApprox) {
  COHORT_RECORD_OP("gelu", a, tanhApprox);
  Tensor out = detail::simd::unary(a, tanhApprox ? detail::simd::Unary::GeluTanh : detail::simd::Unary::GeluErf);
  if (!out.defined())
    out = tanhApprox ? detail::unaryFloatOp(a, "gelu_tanh", [](auto x) COHORT_KERNEL_FN { return vm::geluTanh(x); })
                     : detail::unaryFloatOp(a, "gelu", [](auto x) COHORT_KERNEL_FN { return vm::geluErf(x); });
  autograd::record("gelu", {a}, {out}, {a}, [tanhApprox](Ctx& ctx, const GradList& g) -> GradList {
    if (tanhApprox)
      return {activationGrad(g[0], ctx.saved(0), "gelu_tanh backward", detail::simd::UnaryGrad::GeluTanh,
                             [](auto gv, auto x) COHORT_KERNEL_FN { return vm::geluTanhGrad(gv, x); })};
    return {activationGrad(g[0], ctx.saved(0), "gelu backward", detail::simd::UnaryGrad::GeluErf,
                           [](auto gv, auto x) COHORT_KERNEL_FN { return vm::geluErfGrad(gv, x); })};
  });
  return out;
}

}  // namespace cohort
