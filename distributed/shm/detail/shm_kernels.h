/*
 * Reduction kernels of the shm backend: out[i] = src0[i] (op) src1[i] (op) ... in source order,
 * computed block by block in an accumulator that stays in L1 (the accumulation type Acc<T>:
 * float32 for float16/bfloat16, rounded once on store). Every loop runs over distinct __restrict
 * pointers, so the compiler vectorizes it; `out` may be one of the sources (each block is fully
 * read before it is written). bool reduces as logical or (sum, max) and logical and (product, min).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cohort/core/tensor/dtype.h>
#include <cohort/distributed/types.h>

namespace cohort::dist::shm {

inline constexpr size_t kReduceBlockBytes = 8192;

template <typename A, typename T>
inline void loadBlock(A* __restrict acc, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(src[i]);
}

template <typename A, typename T, ReduceOp Op>
inline void combineBlock(A* __restrict acc, const T* __restrict src, size_t n) {
  if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Avg) {
    for (size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(src[i]);
  } else if constexpr (Op == ReduceOp::Product) {
    for (size_t i = 0; i < n; ++i) acc[i] *= static_cast<A>(src[i]);
  } else if constexpr (Op == ReduceOp::Min) {
    for (size_t i = 0; i < n; ++i) {
      A v = static_cast<A>(src[i]);
      acc[i] = v < acc[i] ? v : acc[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      A v = static_cast<A>(src[i]);
      acc[i] = acc[i] < v ? v : acc[i];
    }
  }
}

// acc = a (op) b: the first two sources in one pass.
template <typename A, typename T, ReduceOp Op>
inline void combine2Block(A* __restrict acc, const T* __restrict a, const T* __restrict b, size_t n) {
  if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Avg) {
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(a[i]) + static_cast<A>(b[i]);
  } else if constexpr (Op == ReduceOp::Product) {
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(a[i]) * static_cast<A>(b[i]);
  } else if constexpr (Op == ReduceOp::Min) {
    for (size_t i = 0; i < n; ++i) {
      A x = static_cast<A>(a[i]), y = static_cast<A>(b[i]);
      acc[i] = y < x ? y : x;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      A x = static_cast<A>(a[i]), y = static_cast<A>(b[i]);
      acc[i] = x < y ? y : x;
    }
  }
}

template <typename A, typename T>
inline void storeBlock(T* __restrict out, const A* __restrict acc, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(acc[i]);
}

template <typename A>
inline void divideBlock(A* __restrict acc, A div, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] /= div;
}

// Storage type T, accumulation A, op fixed at compile time; the result goes to each of the nout
// outputs (any of which may also be a source).
template <typename T, ReduceOp Op>
void reduceSourcesOp(T* const* outs, int nout, const T* const* srcs, int nsrc, size_t n, int divisor) {
  using A = std::conditional_t<std::is_same_v<T, bool>, uint8_t, Acc<T>>;
  using S = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
  constexpr size_t kBlock = kReduceBlockBytes / sizeof(A);
  alignas(64) A acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    int k = 1;
    if constexpr (!std::is_same_v<T, bool>) {
      if (nsrc >= 2) {
        combine2Block<A, S, Op>(acc, srcs[0] + b, srcs[1] + b, m);
        k = 2;
      } else {
        loadBlock<A, S>(acc, srcs[0] + b, m);
      }
    } else {
      loadBlock<A, S>(acc, reinterpret_cast<const S*>(srcs[0]) + b, m);
    }
    for (; k < nsrc; ++k) {
      const S* s = reinterpret_cast<const S*>(srcs[k]) + b;
      if constexpr (std::is_same_v<T, bool>) {
        if constexpr (Op == ReduceOp::Product || Op == ReduceOp::Min) {
          for (size_t i = 0; i < m; ++i) acc[i] &= s[i];
        } else {
          for (size_t i = 0; i < m; ++i) acc[i] |= s[i];
        }
      } else {
        combineBlock<A, S, Op>(acc, s, m);
      }
    }
    if constexpr (Op == ReduceOp::Avg && kIsFloat<A>) {
      divideBlock<A>(acc, static_cast<A>(divisor), m);
    }
    for (int o = 0; o < nout; ++o) storeBlock<A, S>(reinterpret_cast<S*>(outs[o]) + b, acc, m);
  }
}

// outs[0..nout) = reduction of the nsrc sources, n elements of `dtype`, in source order. Avg
// divides by `divisor` (float types only; ProcessGroup rejects it for integers).
inline void reduceSourcesInto(DType dtype, void* const* outs, int nout, const void* const* srcs, int nsrc, size_t n,
                              ReduceOp op, int divisor) {
  if (n == 0) return;
  COHORT_DISPATCH(dtype, "allreduce", [&]<typename T>() {
    T* const* o = reinterpret_cast<T* const*>(outs);
    const T* const* s = reinterpret_cast<const T* const*>(srcs);
    switch (op) {
      case ReduceOp::Sum: reduceSourcesOp<T, ReduceOp::Sum>(o, nout, s, nsrc, n, divisor); break;
      case ReduceOp::Avg:
        if constexpr (kIsFloat<Acc<T>>) reduceSourcesOp<T, ReduceOp::Avg>(o, nout, s, nsrc, n, divisor);
        else reduceSourcesOp<T, ReduceOp::Sum>(o, nout, s, nsrc, n, divisor);
        break;
      case ReduceOp::Product: reduceSourcesOp<T, ReduceOp::Product>(o, nout, s, nsrc, n, divisor); break;
      case ReduceOp::Min: reduceSourcesOp<T, ReduceOp::Min>(o, nout, s, nsrc, n, divisor); break;
      case ReduceOp::Max: reduceSourcesOp<T, ReduceOp::Max>(o, nout, s, nsrc, n, divisor); break;
    }
  });
}

// out (and out2 when not null) = reduction of the nsrc sources (see reduceSourcesInto).
inline void reduceSources(DType dtype, void* out, void* out2, const void* const* srcs, int nsrc, size_t n, ReduceOp op,
                          int divisor) {
  void* outs[2] = {out, out2};
  reduceSourcesInto(dtype, outs, out2 ? 2 : 1, srcs, nsrc, n, op, divisor);
}

}  // namespace cohort::dist::shm
