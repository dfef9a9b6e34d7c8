// Launchers of the elementwise CUDA kernels (internal to core/cuda): one strided kernel template
// instantiated per op and dtype in elementwise.cu, selected here by an op code and an ElemType.
// Plain types only: this header is included by nvcc (elementwise.cu) and g++ (elementwise_ops.cc).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail {

// The ops of the family. Each reproduces the functor the CPU op passes to mapKernel (core/ops/*.cc),
// in the same compute type (float for half types) and the same order of operations.
enum class EwOp : int32_t {
  // unary: out[i] = f(a[i]), all of out's dtype
  Neg,
  Abs,
  Relu,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Sigmoid,
  Tanh,
  Silu,
  GeluErf,
  GeluTanh,
  // unary with scalars (EwScalars: s0, s1)
  AddScalar,   // x + s0
  MulScalar,   // x * s0
  DivScalar,   // x / s0
  RsubScalar,  // s0 - x
  PowScalar,   // x ^ s0 (exponent kept as a double, as the CPU's powScalarKernel)
  ClampBoth,   // clamp to [s0, s1]
  ClampLo,     // max with s0
  ClampHi,     // min with s1
  // binary: out[i] = f(a[i], b[i])
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  AddScaled,  // x + s0 * y
  SubScaled,  // x - s0 * y
  Lerp,       // torch's lerp with weight s0
  // binary backward formulas (g, saved): floating dtypes only
  ReluBackward,
  SigmoidBackward,
  TanhBackward,
  SiluBackward,
  GeluErfBackward,
  GeluTanhBackward,
  SqrtBackward,
  RsqrtBackward,
  AbsBackward,
  ClampBackward,  // g where s0 <= x <= s1, the bounds as doubles
  // comparisons: bool out, inputs of the given dtype
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  // ternary: out[i] = f(a[i], b[i], c[i])
  PowBackwardBase,      // (g, x, y) -> g y x^(y-1), 0 where y == 0
  PowBackwardExponent,  // (g, x, y) -> g x^y log x, 0 where x == 0 and y >= 0
  MaximumBackward,      // (g, x, y) -> g where x > y, g/2 on ties
  MinimumBackward,
  Addcmul,  // x + s0 * a * b
  Addcdiv,  // x + s0 * a / b
  Where,    // (cond bool, a, b) -> cond ? a : b; the dtype given is a's and out's
};

// Scalars of an op, converted on the host as the CPU op converts them (Scalar::to<Acc<T>>): the
// kernel of dtype T takes the field of its compute type (float for float32/float16/bfloat16,
// double for float64, the integer field cast to T for integer and bool dtypes).
struct EwScalars {
  double d[2] = {0, 0};
  float f[2] = {0, 0};
  int64_t i[2] = {0, 0};
};

// Each returns false when the op has no kernel for the dtype (the caller reports it); the launch
// itself is checked with cudaGetLastError. Nothing is launched when numel is 0.
bool launchUnary(EwOp op, ElemType t, const StridedIter<2>& it, const EwScalars& s, cudaStream_t stream);
bool launchBinary(EwOp op, ElemType t, const StridedIter<3>& it, const EwScalars& s, cudaStream_t stream);
bool launchTernary(EwOp op, ElemType t, const StridedIter<4>& it, const EwScalars& s, cudaStream_t stream);
// out (dtype `dst`) = a (dtype `src`) converted as copy_ converts on the CPU.
void launchCopy(ElemType dst, ElemType src, const StridedIter<2>& it, cudaStream_t stream);
// out = s converted to t (s as for a unary op).
void launchFill(ElemType t, const StridedIter<1>& it, const EwScalars& s, cudaStream_t stream);

}  // namespace cohort::cuda::detail
