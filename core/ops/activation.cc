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
    return {detail::binaryFloatOp(
        g[0], ctx.saved(0), "silu backward",
        [](auto gv, auto x) COHORT_KERNEL_FN {
          using A = decltype(gv);
          const A s = vm::sigmoid(x);
          return gv * s * (A(1) + x * (A(1) - s));
        },
        detail::kComputeBoundGrain)};
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
      return {detail::binaryFloatOp(
          g[0], ctx.saved(0), "gelu_tanh backward",
          [](auto gv, auto x) COHORT_KERNEL_FN {
            using A = decltype(gv);
            const A kBeta = A(0.79788456080286535588), kKappa = A(0.044715);
            const A x2 = x * x;
            const A t = vm::tanh(kBeta * (x + kKappa * x2 * x));
            const A left = A(0.5) * x;
            const A right = A(1) + t;
            const A dRight = left * (A(1) - t * t) * kBeta * (A(1) + A(3) * kKappa * x2);
            return gv * (A(0.5) * right + dRight);
          },
          detail::kComputeBoundGrain)};
    return {detail::binaryFloatOp(
        g[0], ctx.saved(0), "gelu backward",
        [](auto gv, auto x) COHORT_KERNEL_FN {
          using A = decltype(gv);
          const A cdf = A(0.5) * (A(1) + vm::erf(x * A(0.70710678118654752440)));
          const A pdf = vm::exp(A(-0.5) * x * x) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
          return gv * (cdf + x * pdf);
        },
        detail::kComputeBoundGrain)};
  });
  return out;
}

}  // namespace cohort
