/*
 * Reduction planning shared by the reduction kernels (internal to core/ops).
 * A ReducePlan describes `a` reduced over a set of dims as [outer, reduced, inner] over a
 * contiguous buffer: value[o, r, i] with o in [0,outer), r in [0,reduced), i in [0,inner)
 * reduces over r. Reduced dims that are not adjacent are made adjacent by a permuted copy
 * (kept dims first, reduced dims last, so inner == 1); dims of size 1 never break adjacency.
 * A 0-dim tensor reduces over "dim 0" as a single element (outer = reduced = inner = 1).
 */
#pragma once

#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/dtype.h>
#include <cohort/core/tensor/half.h>

namespace cohort::detail {

struct ReducePlan {
  Tensor src;  // contiguous; viewed as [outer, reduced, inner]
  int64_t outer = 1;
  int64_t reduced = 1;
  int64_t inner = 1;
  Shape outShape;               // result shape (with or without kept dims)
  Shape keptShape;              // result shape with reduced dims kept as 1 (for broadcasting back)
  std::vector<bool> isReduced;  // per input dim (one entry for a 0-dim tensor)
};

// dims empty = all dims. Negative dims allowed; out-of-range dims are an IndexError and
// repeated dims a ValueError, both naming `op`, the dims and the input shape.
ReducePlan planReduce(const Tensor& a, const Shape& dims, bool keepdim, const char* op);

// The plan of a kernel's arguments: src contiguous, viewed as [outer, reduced, inner] (the shapes
// are not needed by the kernels and stay empty).
inline ReducePlan planOf(const Tensor& src, int64_t outer, int64_t reduced, int64_t inner) {
  ReducePlan p;
  p.src = src;
  p.outer = outer;
  p.reduced = reduced;
  p.inner = inner;
  return p;
}

// Throws ValueError naming `op`, the input shape and the dims when the reduced extent is empty
// (max/min/argmax/var have no identity).
void requireNonEmptyReduction(const ReducePlan& p, const Tensor& a, const Shape& dims, const char* op);

// Blocking shared by the reduction kernels (reduce.cc, reduce_extreme.cc).
constexpr int64_t kLanes = 64;         // GCC vectorizes a 64-lane select (max) loop, not a 16-lane one
constexpr int64_t kRowBlock = 4096;    // elements per lane block (inner reductions)
constexpr int64_t kTile = 4096;        // columns per tile (outer reductions); the Acc tile stays in L1
constexpr int64_t kRowsPerFold = 256;  // rows accumulated in Acc before folding into Total

// Converts n elements to the compute type. float16 uses F16C 8 at a time (the scalar
// conversion does not vectorize); everything else is a plain loop the compiler vectorizes.
template <typename T>
inline void toCompute(const T* src, cohort::Acc<T>* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<T, Half>) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<cohort::Acc<T>>(src[i]);
}

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

}  // namespace cohort::detail
