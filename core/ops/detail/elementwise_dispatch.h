/*
 * Kernel signatures of the elementwise ops whose arguments do not fit dispatch.h's shared shapes
 * (internal to core): where, the three-operand formulas, clamp, fill_ and copy_. The op calls the
 * kernel registered for the tensors' device under its name (dispatch.h); the CPU path stays in
 * the op.
 */
#pragma once

#include <optional>

#include <cohort/core/ops/dispatch.h>

namespace cohort::dispatch {

// out = cond ? a : b; cond bool, a and b of out's dtype, all broadcast to out's shape.
using WhereKernel = void(Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// out = f(a, b, c) over operands of out's dtype broadcast to out's shape (backward formulas).
using TernaryKernel = void(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c);
// out = f(a, b, c, s) (addcmul_, addcdiv_: out is a).
using TernaryScalarKernel = void(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Scalar s);
// out = x clamped to [lo, hi] (at least one given), in out's dtype; out may be x (clamp_).
using ClampKernel = void(Tensor& out, const Tensor& x, const std::optional<Scalar>& lo,
                         const std::optional<Scalar>& hi);
// out = g where lo <= x <= hi, else 0 (clamp's backward); absent bounds are -inf / inf.
using ClampGradKernel = void(Tensor& out, const Tensor& g, const Tensor& x, double lo, double hi);
// Every element of out (any strides) = v converted to out's dtype (fill_).
using FillKernel = void(Tensor& out, Scalar v);
// out = src converted to out's dtype, src broadcast to out's shape, both on out's device (copy_).
using CopyKernel = void(Tensor& out, const Tensor& src);

}  // namespace cohort::dispatch
