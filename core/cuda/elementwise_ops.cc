// Tensor-level glue of the elementwise CUDA kernels (elementwise.cu, elementwise_binary.cu): checks,
// the strided iterator, the launch on the output's current stream, and the kernels' registration
// under the names the CPU ops dispatch with (core/ops/detail/elementwise_impl.h and the ops that
// call dispatch::kernel themselves: copy_, fill_, where, clamp, pow).
#include <cmath>

#include <cohort/core/cuda/detail/elementwise_kernels.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/detail/elementwise_dispatch.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

// The scalars as the CPU ops convert them: Scalar::to<Acc<T>>() for each compute type.
EwScalars scalars(Scalar s0, Scalar s1 = Scalar(0)) {
  EwScalars s;
  s.d[0] = s0.to<double>();
  s.f[0] = s0.to<float>();
  s.i[0] = s0.to<int64_t>();
  s.d[1] = s1.to<double>();
  s.f[1] = s1.to<float>();
  s.i[1] = s1.to<int64_t>();
  return s;
}

[[noreturn]] void noKernelForDtype(const char* op, DType t) {
  throw NotSupportedError(fmt::format("{}: the CUDA kernel does not take dtype {}", op, t));
}

void requireDtype(const char* op, const Tensor& t, DType want) {
  COHORT_CHECK(t.dtype() == want, "{}: CUDA kernel given an operand of dtype {} where {} was expected", op, t.dtype(),
               want);
}

// out = op(a); a of out's dtype.
void runUnary(const char* name, EwOp op, Tensor& out, const Tensor& a, const EwScalars& s) {
  requireSameDevice(name, out.device(), {&a});
  requireDtype(name, a, out.dtype());
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  const StridedIter<2> it = makeIter<1>(out, {&a});
  if (!launchUnary(op, elemType(out.dtype()), it, s, streamOf(out))) noKernelForDtype(name, out.dtype());
  COHORT_CUDA_CHECK_LAUNCH();
}

// out = op(a, b); a and b of dtype `in` (out's dtype, or bool out for comparisons).
void runBinary(const char* name, EwOp op, Tensor& out, const Tensor& a, const Tensor& b, DType in, const EwScalars& s) {
  requireSameDevice(name, out.device(), {&a, &b});
  requireDtype(name, a, in);
  requireDtype(name, b, in);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  const StridedIter<3> it = makeIter<2>(out, {&a, &b});
  if (!launchBinary(op, elemType(in), it, s, streamOf(out))) noKernelForDtype(name, in);
  COHORT_CUDA_CHECK_LAUNCH();
}

// out = op(a, b, c); for Where, a is the bool condition.
void runTernary(const char* name, EwOp op, Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c,
                const EwScalars& s) {
  requireSameDevice(name, out.device(), {&a, &b, &c});
  requireDtype(name, a, op == EwOp::Where ? DType::Bool : out.dtype());
  requireDtype(name, b, out.dtype());
  requireDtype(name, c, out.dtype());
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  const StridedIter<4> it = makeIter<3>(out, {&a, &b, &c});
  if (!launchTernary(op, elemType(out.dtype()), it, s, streamOf(out))) noKernelForDtype(name, out.dtype());
  COHORT_CUDA_CHECK_LAUNCH();
}

const char* ewName(EwOp op) {
  switch (op) {
    case EwOp::Neg: return "neg";
    case EwOp::Abs: return "abs";
    case EwOp::Relu: return "relu";
    case EwOp::Exp: return "exp";
    case EwOp::Log: return "log";
    case EwOp::Sqrt: return "sqrt";
    case EwOp::Rsqrt: return "rsqrt";
    case EwOp::Sigmoid: return "sigmoid";
    case EwOp::Tanh: return "tanh";
    case EwOp::Silu: return "silu";
    case EwOp::GeluErf: return "gelu";
    case EwOp::GeluTanh: return "gelu_tanh";
    case EwOp::AddScalar: return "add";
    case EwOp::MulScalar: return "mul";
    case EwOp::DivScalar: return "div";
    case EwOp::RsubScalar: return "rsub";
    case EwOp::PowScalar: return "pow";
    case EwOp::ClampBoth:
    case EwOp::ClampLo:
    case EwOp::ClampHi: return "clamp";
    case EwOp::Add: return "add";
    case EwOp::Sub: return "sub";
    case EwOp::Mul: return "mul";
    case EwOp::Div: return "div";
    case EwOp::Maximum: return "maximum";
    case EwOp::Minimum: return "minimum";
    case EwOp::Pow: return "pow";
    case EwOp::AddScaled: return "add";
    case EwOp::SubScaled: return "sub";
    case EwOp::Lerp: return "lerp_";
    case EwOp::ReluBackward: return "relu backward";
    case EwOp::SigmoidBackward: return "sigmoid backward";
    case EwOp::TanhBackward: return "tanh backward";
    case EwOp::SiluBackward: return "silu backward";
    case EwOp::GeluErfBackward: return "gelu backward";
    case EwOp::GeluTanhBackward: return "gelu_tanh backward";
    case EwOp::SqrtBackward: return "sqrt backward";
    case EwOp::RsqrtBackward: return "rsqrt backward";
    case EwOp::AbsBackward: return "abs backward";
    case EwOp::ClampBackward: return "clamp backward";
    case EwOp::Eq: return "eq";
    case EwOp::Ne: return "ne";
    case EwOp::Lt: return "lt";
    case EwOp::Le: return "le";
    case EwOp::Gt: return "gt";
    case EwOp::Ge: return "ge";
    case EwOp::PowBackwardBase: return "pow backward (base)";
    case EwOp::PowBackwardExponent: return "pow backward (exponent)";
    case EwOp::MaximumBackward: return "maximum backward";
    case EwOp::MinimumBackward: return "minimum backward";
    case EwOp::Addcmul: return "addcmul_";
    case EwOp::Addcdiv: return "addcdiv_";
    case EwOp::Where: return "where";
  }
  return "elementwise";
}

// ---- the kernels, one per op code and signature -------------------------------------------------

template <EwOp Op>
void unaryK(Tensor& out, const Tensor& a) {
  runUnary(ewName(Op), Op, out, a, EwScalars{});
}

template <EwOp Op>
void scalarK(Tensor& out, const Tensor& a, Scalar s) {
  runUnary(ewName(Op), Op, out, a, scalars(s));
}

template <EwOp Op>
void binaryK(Tensor& out, const Tensor& a, const Tensor& b) {
  runBinary(ewName(Op), Op, out, a, b, out.dtype(), EwScalars{});
}

template <EwOp Op>
void compareK(Tensor& out, const Tensor& a, const Tensor& b) {
  requireDtype(ewName(Op), out, DType::Bool);
  runBinary(ewName(Op), Op, out, a, b, a.dtype(), EwScalars{});
}

template <EwOp Op>
void binaryScalarK(Tensor& out, const Tensor& a, const Tensor& b, Scalar s) {
  runBinary(ewName(Op), Op, out, a, b, out.dtype(), scalars(s));
}

template <EwOp Op>
void ternaryK(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c) {
  runTernary(ewName(Op), Op, out, a, b, c, EwScalars{});
}

template <EwOp Op>
void ternaryScalarK(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Scalar s) {
  runTernary(ewName(Op), Op, out, a, b, c, scalars(s));
}

void clampK(Tensor& out, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi) {
  COHORT_CHECK(lo || hi, "clamp: the CUDA kernel needs at least one bound");
  const EwOp op = lo && hi ? EwOp::ClampBoth : (lo ? EwOp::ClampLo : EwOp::ClampHi);
  runUnary("clamp", op, out, x, scalars(lo ? *lo : Scalar(0), hi ? *hi : Scalar(0)));
}

void clampGradK(Tensor& out, const Tensor& g, const Tensor& x, double lo, double hi) {
  EwScalars s;
  s.d[0] = lo;
  s.d[1] = hi;
  runBinary("clamp backward", EwOp::ClampBackward, out, g, x, out.dtype(), s);
}

void whereK(Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  runTernary("where", EwOp::Where, out, cond, a, b, EwScalars{});
}

void fillK(Tensor& out, Scalar v) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  const double d = v.toDouble();
  if (out.isContiguous() && d == 0 && !std::signbit(d)) {
    // All-zero bits in every dtype (a -0.0 fill goes through the kernel).
    COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(out), 0, out.nbytes(), streamOf(out)));
    return;
  }
  const StridedIter<1> it = makeIter<0>(out, {});
  launchFill(elemType(out.dtype()), it, scalars(v), streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
}

void copyK(Tensor& out, const Tensor& src) {
  requireSameDevice("copy_", out.device(), {&src});
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  if (out.dtype() == src.dtype() && out.isContiguous() && src.isContiguous() && out.sizes() == src.sizes()) {
    void* dst = devicePtr(out);
    const void* from = devicePtr(src);
    if (dst != from)
      COHORT_CUDA_CHECK(cudaMemcpyAsync(dst, from, out.nbytes(), cudaMemcpyDeviceToDevice, streamOf(out)));
    return;
  }
  const StridedIter<2> it = makeIter<1>(out, {&src});
  launchCopy(elemType(out.dtype()), elemType(src.dtype()), it, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
}

// ---- registration -----------------------------------------------------------------------------------

const bool kRegistered = [] {
  using namespace dispatch;
  constexpr DeviceType kCuda = DeviceType::CUDA;
  auto unary = [](const char* name, UnaryKernel* fn) { Register<UnaryKernel>(name, kCuda, fn); };
  auto scalar = [](const char* name, ScalarKernel* fn) { Register<ScalarKernel>(name, kCuda, fn); };
  auto binary = [](const char* name, BinaryKernel* fn) { Register<BinaryKernel>(name, kCuda, fn); };
  auto binaryScalar = [](const char* name, BinaryScalarKernel* fn) { Register<BinaryScalarKernel>(name, kCuda, fn); };
  auto ternary = [](const char* name, TernaryKernel* fn) { Register<TernaryKernel>(name, kCuda, fn); };
  auto ternaryScalar = [](const char* name, TernaryScalarKernel* fn) {
    Register<TernaryScalarKernel>(name, kCuda, fn);
  };

  unary("neg", &unaryK<EwOp::Neg>);
  unary("abs", &unaryK<EwOp::Abs>);
  unary("relu", &unaryK<EwOp::Relu>);
  unary("exp", &unaryK<EwOp::Exp>);
  unary("log", &unaryK<EwOp::Log>);
  unary("sqrt", &unaryK<EwOp::Sqrt>);
  unary("rsqrt", &unaryK<EwOp::Rsqrt>);
  unary("sigmoid", &unaryK<EwOp::Sigmoid>);
  unary("tanh", &unaryK<EwOp::Tanh>);
  unary("silu", &unaryK<EwOp::Silu>);
  unary("gelu", &unaryK<EwOp::GeluErf>);
  unary("gelu_tanh", &unaryK<EwOp::GeluTanh>);

  scalar("add", &scalarK<EwOp::AddScalar>);
  scalar("mul", &scalarK<EwOp::MulScalar>);
  scalar("div", &scalarK<EwOp::DivScalar>);
  scalar("rsub", &scalarK<EwOp::RsubScalar>);
  scalar("pow", &scalarK<EwOp::PowScalar>);

  binary("add", &binaryK<EwOp::Add>);
  binary("sub", &binaryK<EwOp::Sub>);
  binary("mul", &binaryK<EwOp::Mul>);
  binary("div", &binaryK<EwOp::Div>);
  binary("maximum", &binaryK<EwOp::Maximum>);
  binary("minimum", &binaryK<EwOp::Minimum>);
  binary("pow", &binaryK<EwOp::Pow>);
  binary("relu backward", &binaryK<EwOp::ReluBackward>);
  binary("sigmoid backward", &binaryK<EwOp::SigmoidBackward>);
  binary("tanh backward", &binaryK<EwOp::TanhBackward>);
  binary("silu backward", &binaryK<EwOp::SiluBackward>);
  binary("gelu backward", &binaryK<EwOp::GeluErfBackward>);
  binary("gelu_tanh backward", &binaryK<EwOp::GeluTanhBackward>);
  binary("sqrt backward", &binaryK<EwOp::SqrtBackward>);
  binary("sqrt_ backward", &binaryK<EwOp::SqrtBackward>);
  binary("rsqrt backward", &binaryK<EwOp::RsqrtBackward>);
  binary("abs backward", &binaryK<EwOp::AbsBackward>);
  binary("eq", &compareK<EwOp::Eq>);
  binary("ne", &compareK<EwOp::Ne>);
  binary("lt", &compareK<EwOp::Lt>);
  binary("le", &compareK<EwOp::Le>);
  binary("gt", &compareK<EwOp::Gt>);
  binary("ge", &compareK<EwOp::Ge>);

  binaryScalar("add", &binaryScalarK<EwOp::AddScaled>);
  binaryScalar("sub", &binaryScalarK<EwOp::SubScaled>);
  binaryScalar("lerp_", &binaryScalarK<EwOp::Lerp>);

  ternary("pow backward (base)", &ternaryK<EwOp::PowBackwardBase>);
  ternary("pow backward (exponent)", &ternaryK<EwOp::PowBackwardExponent>);
  ternary("maximum backward", &ternaryK<EwOp::MaximumBackward>);
  ternary("minimum backward", &ternaryK<EwOp::MinimumBackward>);
  ternaryScalar("addcmul_", &ternaryScalarK<EwOp::Addcmul>);
  ternaryScalar("addcdiv_", &ternaryScalarK<EwOp::Addcdiv>);

  Register<WhereKernel>("where", kCuda, &whereK);
  Register<ClampKernel>("clamp", kCuda, &clampK);
  Register<ClampKernel>("clamp_", kCuda, &clampK);
  Register<ClampGradKernel>("clamp backward", kCuda, &clampGradK);
  Register<FillKernel>("fill_", kCuda, &fillK);
  Register<CopyKernel>("copy_", kCuda, &copyK);
  return true;
}();

}  // namespace
}  // namespace cohort::cuda::detail
