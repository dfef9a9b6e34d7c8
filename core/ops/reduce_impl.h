/*
 * Reduction planning shared by the reduction kernels (internal to core/ops).
 * A ReducePlan describes `a` reduced over a set of dims as [outer, reduced, inner] over a
 * contiguous buffer: value[o, r, i] with o in [0,outer), r in [0,reduced), i in [0,inner)
 * reduces over r. Reduced dims that are not adjacent are made adjacent by a permuted copy
 * (kept dims first, reduced dims last, so inner == 1); dims of size 1 never break adjacency.
 * A 0-dim tensor reduces over "dim 0" as a single element (outer = reduced = inner = 1).
 */
#pragma once

#include <cohort/core/ops/ops.h>

namespace cohort::detail {

struct ReducePlan {
  Tensor src;         // contiguous; viewed as [outer, reduced, inner]
  int64_t outer = 1;
  int64_t reduced = 1;
  int64_t inner = 1;
  Shape outShape;     // result shape (with or without kept dims)
  Shape keptShape;    // result shape with reduced dims kept as 1 (for broadcasting back)
  std::vector<bool> isReduced;  // per input dim (one entry for a 0-dim tensor)
};

// dims empty = all dims. Negative dims allowed; out-of-range dims are an IndexError and
// repeated dims a ValueError, both naming `op`, the dims and the input shape.
ReducePlan planReduce(const Tensor& a, const Shape& dims, bool keepdim, const char* op);

}  // namespace cohort::detail
