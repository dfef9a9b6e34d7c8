/*
 * Building blocks for elementwise ops (internal to core/ops).
 *
 * The op side (`binaryOp`, `unaryFloatOp`, ...) checks the operands, allocates the result with
 * the promoted dtype and broadcast shape on the operands' device, converts the inputs to the
 * compute dtype and calls the kernel registered under the op's name for that device (dispatch.h).
 * Each name stands for one formula on every device (gelu's two forms are "gelu" and "gelu_tanh").
 *
 * The CPU side (`cpuUnary<F>`, `cpuBinary<F>`, ...) is the kernel a CPU registration names: it
 * dispatches on dtype and runs the functor F through detail::mapKernel. Functors are captureless
 * generic lambdas (`[](auto x, auto y) COHORT_KERNEL_FN { return x + y; }`) that receive Acc<T>
 * values (float for half types), passed by type and default-constructed; a scalar argument arrives
 * converted to Acc<T>.
 */
#pragma once

#include <cohort/core/ops/detail/elementwise_dispatch.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/iter.h>

// Kernel functors are written `[](auto x) COHORT_KERNEL_FN { ... }`. Forced inlining keeps the
// functor's body inside mapKernel's loop so the loop vectorizes: a functor that calls the
// (inlined) vec_math functions is otherwise too big for GCC's heuristics, and one call per
// element runs scalar, several times slower.
#define COHORT_KERNEL_FN __attribute__((always_inline))

namespace cohort::detail {

DType resultType(const Tensor& a, const Tensor& b);
// dtype of `tensor op scalar`: a float scalar makes an integer tensor float32.
DType scalarResultType(const Tensor& a, Scalar s);
void checkBinary(const Tensor& a, const Tensor& b, const char* op);

// ---- ops ----------------------------------------------------------------------------------------

// f(a, b) in the promoted dtype (BinaryKernel).
Tensor binaryOp(const Tensor& a, const Tensor& b, const char* op);
// Restricted to floating dtypes (integer operands compute in float32); used by backward formulas,
// whose gradients are always floating.
Tensor binaryFloatOp(const Tensor& a, const Tensor& b, const char* op);
// f(a, b, s) (BinaryScalarKernel); a float scalar makes integer operands compute in float32.
Tensor binaryOpWithScalar(const Tensor& a, const Tensor& b, Scalar s, const char* op);
// f(a, s) (ScalarKernel).
Tensor scalarOp(const Tensor& a, Scalar s, const char* op);
// f(a) in a's dtype (UnaryKernel).
Tensor unaryOp(const Tensor& a, const char* op);
// Floating-only unary op: integer inputs are converted to float32 first (like torch.exp(int)).
Tensor unaryFloatOp(const Tensor& a, const char* op);
// Comparison: both operands are converted to their promoted type, the result is bool (BinaryKernel).
Tensor compareOp(const Tensor& a, const Tensor& b, const char* op);
// f(a, b, c) over three operands broadcast together, computed in their promoted type restricted to
// floating dtypes (integer operands compute in float32) (TernaryKernel).
Tensor ternaryFloatOp(const Tensor& a, const Tensor& b, const Tensor& c, const char* op);

// clamp's kernel (out may alias x, for clamp_) and its gradient mask (lo <= x <= hi passes g).
void clampKernel(const Tensor& out, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi,
                 const char* op);
Tensor clampGrad(const Tensor& g, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi);

// The broadcast shape of three operands (ValueError naming `op` and all three shapes).
Shape broadcastShapes3(const Shape& a, const Shape& b, const Shape& c, const char* op);

// ---- CPU kernels --------------------------------------------------------------------------------
//
// Float-only kernels are the transcendentals (exp, log, tanh, gelu, ...) and the backward
// formulas: compute-bound, so large contiguous tensors are split across the intra-op threads
// (iter.h, kComputeBoundGrain); the others leave Grain at 0 (one thread).

template <typename F, int64_t Grain = 0>
void cpuUnary(Tensor& out, const Tensor& a) {
  COHORT_DISPATCH(out.dtype(), "elementwise kernel",
                  [&]<typename T>() { mapKernel<T, T, 1>(out, {a}, std::remove_cv_t<F>{}, Grain); });
}

template <typename F>
void cpuUnaryFloat(Tensor& out, const Tensor& a) {
  COHORT_DISPATCH_FLOAT(out.dtype(), "elementwise kernel",
                        [&]<typename T>() { mapKernel<T, T, 1>(out, {a}, std::remove_cv_t<F>{}, kComputeBoundGrain); });
}

// The transcendentals: the AVX-512 loop of simd.h when it applies, else the portable one.
template <simd::Unary K, typename F>
void cpuUnaryFloatSimd(Tensor& out, const Tensor& a) {
  if (!simd::unary(out, a, K)) cpuUnaryFloat<F>(out, a);
}

template <typename F, int64_t Grain = 0>
void cpuBinary(Tensor& out, const Tensor& a, const Tensor& b) {
  COHORT_DISPATCH(out.dtype(), "elementwise kernel", [&]<typename T>() {
    mapKernel<T, T, 2>(out, {a, b}, std::remove_cv_t<F>{}, Grain);
  });
}

template <typename F, int64_t Grain = 0>
void cpuBinaryFloat(Tensor& out, const Tensor& a, const Tensor& b) {
  COHORT_DISPATCH_FLOAT(out.dtype(), "elementwise kernel", [&]<typename T>() {
    mapKernel<T, T, 2>(out, {a, b}, std::remove_cv_t<F>{}, Grain);
  });
}

// out (bool) = f(a, b) with a and b of one dtype.
template <typename F>
void cpuCompare(Tensor& out, const Tensor& a, const Tensor& b) {
  COHORT_DISPATCH(a.dtype(), "comparison kernel", [&]<typename T>() {
    mapKernel<bool, T, 2>(out, {a, b}, std::remove_cv_t<F>{});
  });
}

template <typename F>
void cpuScalar(Tensor& out, const Tensor& a, Scalar s) {
  COHORT_DISPATCH(out.dtype(), "elementwise kernel", [&]<typename T>() {
    const Acc<T> sv = s.to<Acc<T>>();
    mapKernel<T, T, 1>(out, {a}, [sv](Acc<T> x) COHORT_KERNEL_FN { return std::remove_cv_t<F>{}(x, sv); });
  });
}

template <typename F>
void cpuBinaryScalar(Tensor& out, const Tensor& a, const Tensor& b, Scalar s) {
  COHORT_DISPATCH(out.dtype(), "elementwise kernel", [&]<typename T>() {
    const Acc<T> sv = s.to<Acc<T>>();
    mapKernel<T, T, 2>(out, {a, b},
                       [sv](Acc<T> x, Acc<T> y) COHORT_KERNEL_FN { return std::remove_cv_t<F>{}(x, y, sv); });
  });
}

template <typename F, int64_t Grain = 0>
void cpuTernaryFloat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c) {
  COHORT_DISPATCH_FLOAT(out.dtype(), "elementwise kernel", [&]<typename T>() {
    mapKernel<T, T, 3>(out, {a, b, c}, std::remove_cv_t<F>{}, Grain);
  });
}

template <typename F>
void cpuTernaryScalar(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Scalar s) {
  COHORT_DISPATCH(out.dtype(), "elementwise kernel", [&]<typename T>() {
    const Acc<T> sv = s.to<Acc<T>>();
    mapKernel<T, T, 3>(out, {a, b, c}, [sv](Acc<T> x, Acc<T> y, Acc<T> z) COHORT_KERNEL_FN {
      return std::remove_cv_t<F>{}(x, y, z, sv);
    });
  });
}

}  // namespace cohort::detail
