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
  Tensor out = detail::unaryOp(a, "relu");
  autograd::record("relu", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "relu backward")};
  });
  return out;
}

Tensor sigmoid(const Tensor& a) {
  COHORT_RECORD_OP("sigmoid", a);
  Tensor out = detail::unaryFloatOp(a, "sigmoid");
  autograd::record("sigmoid", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "sigmoid backward")};
  });
  return out;
}

Tensor tanh(const Tensor& a) {
  COHORT_RECORD_OP("tanh", a);
  Tensor out = detail::unaryFloatOp(a, "tanh");
  autograd::record("tanh", {a}, {out}, {out}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "tanh backward")};
  });
  return out;
}

Tensor silu(const Tensor& a) {
  COHORT_RECORD_OP("silu", a);
  Tensor out = detail::unaryFloatOp(a, "silu");
  autograd::record("silu", {a}, {out}, {a}, [](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), "silu backward")};
  });
  return out;
}

Tensor gelu(const Tensor& a, bool tanhApprox) {
  COHORT_RECORD_OP("gelu", a, tanhApprox);
  Tensor out = detail::unaryFloatOp(a, tanhApprox ? "gelu_tanh" : "gelu");
  autograd::record("gelu", {a}, {out}, {a}, [tanhApprox](Ctx& ctx, const GradList& g) -> GradList {
    return {detail::binaryFloatOp(g[0], ctx.saved(0), tanhApprox ? "gelu_tanh backward" : "gelu backward")};
  });
  return out;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

using detail::simd::Unary;
using detail::simd::UnaryGrad;

constexpr auto kRelu = [](auto x) COHORT_KERNEL_FN {
  using A = decltype(x);
  return x > A(0) ? x : (x != x ? x : A(0));  // NaN stays NaN, as torch
};
constexpr auto kReluBackward = [](auto gv, auto y) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return y > A(0) ? gv : A(0);
};
constexpr auto kSigmoid = [](auto x) COHORT_KERNEL_FN { return vm::sigmoid(x); };
constexpr auto kSigmoidBackward = [](auto gv, auto y) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return gv * (A(1) - y) * y;
};
constexpr auto kTanh = [](auto x) COHORT_KERNEL_FN { return vm::tanh(x); };
constexpr auto kTanhBackward = [](auto gv, auto y) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return gv * (A(1) - y * y);
};
constexpr auto kSilu = [](auto x) COHORT_KERNEL_FN { return vm::silu(x); };
constexpr auto kSiluBackward = [](auto gv, auto x) COHORT_KERNEL_FN { return vm::siluGrad(gv, x); };
constexpr auto kGelu = [](auto x) COHORT_KERNEL_FN { return vm::geluErf(x); };
constexpr auto kGeluBackward = [](auto gv, auto x) COHORT_KERNEL_FN { return vm::geluErfGrad(gv, x); };
constexpr auto kGeluTanh = [](auto x) COHORT_KERNEL_FN { return vm::geluTanh(x); };
constexpr auto kGeluTanhBackward = [](auto gv, auto x) COHORT_KERNEL_FN { return vm::geluTanhGrad(gv, x); };

// g times the activation's derivative at x: the AVX-512 loop when it applies (simd.h), else the
// portable kernel of the same formula.
template <UnaryGrad K, typename F>
void activationGradCpu(Tensor& out, const Tensor& g, const Tensor& x) {
  if (!detail::simd::unaryGrad(out, g, x, K)) detail::cpuBinaryFloat<F, detail::kComputeBoundGrain>(out, g, x);
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<UnaryKernel>("relu", kCpu, &detail::cpuUnary<decltype(kRelu)>);
  Register<BinaryKernel>("relu backward", kCpu, &detail::cpuBinaryFloat<decltype(kReluBackward)>);
  Register<UnaryKernel>("sigmoid", kCpu, &detail::cpuUnaryFloatSimd<Unary::Sigmoid, decltype(kSigmoid)>);
  Register<BinaryKernel>("sigmoid backward", kCpu, &detail::cpuBinaryFloat<decltype(kSigmoidBackward)>);
  Register<UnaryKernel>("tanh", kCpu, &detail::cpuUnaryFloatSimd<Unary::Tanh, decltype(kTanh)>);
  Register<BinaryKernel>("tanh backward", kCpu, &detail::cpuBinaryFloat<decltype(kTanhBackward)>);
  Register<UnaryKernel>("silu", kCpu, &detail::cpuUnaryFloatSimd<Unary::Silu, decltype(kSilu)>);
  Register<BinaryKernel>("silu backward", kCpu, &activationGradCpu<UnaryGrad::Silu, decltype(kSiluBackward)>);
  Register<UnaryKernel>("gelu", kCpu, &detail::cpuUnaryFloatSimd<Unary::GeluErf, decltype(kGelu)>);
  Register<BinaryKernel>("gelu backward", kCpu, &activationGradCpu<UnaryGrad::GeluErf, decltype(kGeluBackward)>);
  Register<UnaryKernel>("gelu_tanh", kCpu, &detail::cpuUnaryFloatSimd<Unary::GeluTanh, decltype(kGeluTanh)>);
  Register<BinaryKernel>("gelu_tanh backward", kCpu,
                         &activationGradCpu<UnaryGrad::GeluTanh, decltype(kGeluTanhBackward)>);
  return true;
}();

}  // namespace

}  // namespace cohort
