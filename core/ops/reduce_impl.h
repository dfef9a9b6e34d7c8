/*
 * Reduction planning shared by the reduction kernels (internal to core/ops).
 * A ReducePlan describes `a` reduced over a set of dims as rows x inner x outer over a
 * contiguous buffer: value[o, r, i] with o in [0,outer), r in [0,reduced), i in [0,inner)
 * reduces over r. Reduced dims that are not adjacent are made adjacent by a permuted copy.
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
  std::vector<bool> isReduced;  // per input dim
};

// dims empty = all dims. Negative dims allowed; repeats are an error naming `op`.
ReducePlan planReduce(const Tensor& a, const Shape& dims, bool keepdim, const char* op);

}  // namespace cohort::detail
