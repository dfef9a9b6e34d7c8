/*
 * Building blocks for elementwise ops (internal to core/ops): allocate the result with the
 * promoted dtype and broadcast shape, convert inputs to the compute dtype, dispatch on dtype and
 * run the functor through detail::mapKernel. Functors receive Acc<T> values (float for half
 * types) and are generic lambdas (`[](auto x, auto y) { return x + y; }`).
 *
 * Tensors on other devices run the kernel registered for the device under the op name passed here
 * (dispatch.h), with the output allocated and the inputs converted as for the CPU: so each name
 * must stand for one functor (gelu's two forms are "gelu" and "gelu_tanh").
 */
#pragma once

#include <cohort/core/ops/detail/elementwise_dispatch.h>
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

template <typename F>
Tensor binaryOp(const Tensor& a, const Tensor& b, const char* op, F&& f, int64_t parallelGrain = 0) {
  checkBinary(a, b, op);
  DType dt = resultType(a, b);
  Shape shape = broadcastShapes(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::BinaryKernel>(op, out.device())(out, ac, bc);
    return out;
  }
  COHORT_DISPATCH(dt, op, [&]<typename T>() { mapKernel<T, T, 2>(out, {ac, bc}, f, parallelGrain); });
  return out;
}

// f(x, y, s) with a scalar s in the compute type.
template <typename F>
Tensor binaryOpWithScalar(const Tensor& a, const Tensor& b, Scalar s, const char* op, F&& f) {
  checkBinary(a, b, op);
  DType dt = resultType(a, b);
  if (!isFloating(dt) && !s.isIntegral()) dt = DType::Float32;
  Shape shape = broadcastShapes(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::BinaryScalarKernel>(op, out.device())(out, ac, bc, s);
    return out;
  }
  COHORT_DISPATCH(dt, op, [&]<typename T>() {
    const Acc<T> sv = s.to<Acc<T>>();
    mapKernel<T, T, 2>(out, {ac, bc}, [&](Acc<T> x, Acc<T> y) COHORT_KERNEL_FN { return f(x, y, sv); });
  });
  return out;
}

// f(x, s) with the scalar converted to the compute type.
template <typename F>
Tensor scalarOp(const Tensor& a, Scalar s, const char* op, F&& f) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  DType dt = scalarResultType(a, s);
  Tensor out = empty(a.sizes(), {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::ScalarKernel>(op, out.device())(out, ac, s);
    return out;
  }
  COHORT_DISPATCH(dt, op, [&]<typename T>() {
    const Acc<T> sv = s.to<Acc<T>>();
    mapKernel<T, T, 1>(out, {ac}, [&](Acc<T> x) COHORT_KERNEL_FN { return f(x, sv); });
  });
  return out;
}

template <typename F>
Tensor unaryOp(const Tensor& a, const char* op, F&& f) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  Tensor out = empty(a.sizes(), {.dtype = a.dtype(), .device = a.device()});
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::UnaryKernel>(op, out.device())(out, a);
    return out;
  }
  COHORT_DISPATCH(a.dtype(), op, [&]<typename T>() { mapKernel<T, T, 1>(out, {a}, f); });
  return out;
}

// Floating-only unary op: integer inputs are converted to float32 first (like torch.exp(int)).
// These are the transcendentals (exp, log, tanh, gelu, ...): compute-bound, so large contiguous
// tensors are split across the intra-op threads (iter.h).
template <typename F>
Tensor unaryFloatOp(const Tensor& a, const char* op, F&& f) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  Tensor x = isFloating(a.dtype()) ? a : a.detach().to(DType::Float32);
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::UnaryKernel>(op, out.device())(out, x);
    return out;
  }
  COHORT_DISPATCH_FLOAT(x.dtype(), op, [&]<typename T>() { mapKernel<T, T, 1>(out, {x}, f, kComputeBoundGrain); });
  return out;
}

// clamp's kernel (out may alias x, for clamp_) and its gradient mask (lo <= x <= hi passes g).
void clampKernel(const Tensor& out, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi,
                 const char* op);
Tensor clampGrad(const Tensor& g, const Tensor& x, const std::optional<Scalar>& lo, const std::optional<Scalar>& hi);

// Comparison: both operands are converted to their promoted type, the result is bool.
template <typename F>
Tensor compareOp(const Tensor& a, const Tensor& b, const char* op, F&& f) {
  checkBinary(a, b, op);
  DType dt = resultType(a, b);
  Shape shape = broadcastShapes(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, {.dtype = DType::Bool, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::BinaryKernel>(op, out.device())(out, ac, bc);
    return out;
  }
  COHORT_DISPATCH(dt, op, [&]<typename T>() { mapKernel<bool, T, 2>(out, {ac, bc}, f); });
  return out;
}

// The broadcast shape of three operands (ValueError naming `op` and all three shapes).
Shape broadcastShapes3(const Shape& a, const Shape& b, const Shape& c, const char* op);

// f(x, y, z) over three operands broadcast together, computed in their promoted type.
template <typename F>
Tensor ternaryOp(const Tensor& a, const Tensor& b, const Tensor& c, const char* op, F&& f) {
  checkBinary(a, b, op);
  checkBinary(a, c, op);
  DType dt = promoteTypes(resultType(a, b), c.dtype());
  Shape shape = broadcastShapes3(a.sizes(), b.sizes(), c.sizes(), op);
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor cc = c.dtype() == dt ? c : c.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::TernaryKernel>(op, out.device())(out, ac, bc, cc);
    return out;
  }
  COHORT_DISPATCH(dt, op, [&]<typename T>() { mapKernel<T, T, 3>(out, {ac, bc, cc}, f); });
  return out;
}

// Like ternaryOp but restricted to floating dtypes (integer operands compute in float32).
template <typename F>
Tensor ternaryFloatOp(const Tensor& a, const Tensor& b, const Tensor& c, const char* op, F&& f,
                      int64_t parallelGrain = 0) {
  checkBinary(a, b, op);
  checkBinary(a, c, op);
  DType dt = promoteTypes(resultType(a, b), c.dtype());
  if (!isFloating(dt)) dt = DType::Float32;
  Shape shape = broadcastShapes3(a.sizes(), b.sizes(), c.sizes(), op);
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor cc = c.dtype() == dt ? c : c.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::TernaryKernel>(op, out.device())(out, ac, bc, cc);
    return out;
  }
  COHORT_DISPATCH_FLOAT(dt, op, [&]<typename T>() { mapKernel<T, T, 3>(out, {ac, bc, cc}, f, parallelGrain); });
  return out;
}

// Like binaryOp but restricted to floating dtypes (integer operands compute in float32); used by
// backward formulas, whose gradients are always floating.
template <typename F>
Tensor binaryFloatOp(const Tensor& a, const Tensor& b, const char* op, F&& f, int64_t parallelGrain = 0) {
  checkBinary(a, b, op);
  DType dt = resultType(a, b);
  if (!isFloating(dt)) dt = DType::Float32;
  Shape shape = broadcastShapes(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  if (!out.device().isCpu()) {
    dispatch::kernel<dispatch::BinaryKernel>(op, out.device())(out, ac, bc);
    return out;
  }
  COHORT_DISPATCH_FLOAT(dt, op, [&]<typename T>() { mapKernel<T, T, 2>(out, {ac, bc}, f, parallelGrain); });
  return out;
}

}  // namespace cohort::detail
