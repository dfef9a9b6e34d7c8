/*
 * Kernel signatures of the reductions for devices other than the CPU (internal to core/ops). The
 * reduction ops plan on every device (detail::planReduce: a contiguous source viewed as
 * [outer, reduced, inner]) and hand the planned source to the device's kernel, so a kernel only
 * ever sees a dense [outer, reduced, inner] buffer and writes a dense [outer, inner] result.
 */
#pragma once

#include <cstdint>

#include <cohort/core/tensor/tensor.h>

namespace cohort::detail {

// out[o, i] = reduction over r of src[o, r, i]; `out` holds outer * inner elements (allocated by
// the op in its result dtype). Registered under "sum", "mean" (param: the scale, 1/count),
// "amax", "amin", "norm" (param: p), "var" and "std" (param: the divisor, max(0, N - correction)).
using PlannedReduceKernel = void(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner,
                                 double param);

// Value (when `values` is defined) and int64 index of the first extreme element along r (the
// first NaN if there is one), reduced >= 1. Registered under "max", "min", "argmax", "argmin".
using ArgReduceKernel = void(Tensor& values, Tensor& indices, const Tensor& src, int64_t outer, int64_t reduced,
                             int64_t inner);

// Backward of max/min over one dim: grad ([outer, reduced, inner], contiguous) is zero except
// grad[o, indices[o, i], i] = g[o, i]. Registered under "max backward".
using ArgScatterKernel = void(Tensor& grad, const Tensor& indices, const Tensor& g, int64_t reduced, int64_t inner);

// The elementwise maps of the reductions' backward closures (reduce.cc's map2/map3), over x's
// shape with a and b broadcast to it and already in x's dtype (b undefined for two-operand maps).
enum class ReduceGradMap : uint8_t {
  Hits,      // a == m ? 1 : 0, with a = x (or |x| when param != 0)
  Share,     // a == m ? s (times sgn(x) when param != 0) : 0, with m = a, s = b
  StdScale,  // x = g, a = std: std == 0 ? 0 : g / (2 std)
  Var,       // param * (x - mu) * g, with mu = a, g = b
  Norm,      // p-norm gradient, p = param: x, n = a, g = b
};
using ReduceGradMapKernel = void(Tensor& out, const Tensor& x, const Tensor& a, const Tensor& b, ReduceGradMap kind,
                                 double param);

}  // namespace cohort::detail
