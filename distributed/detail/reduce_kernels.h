/*
 * The element-wise reduction kernels every CPU backend uses (shm's all-reduce and reduce-scatter,
 * gloo's reduce function and its local reduce-scatter accumulation).
 *
 * One definition of each reduction: sum (and avg, which sums and divides once), product, min and
 * max; bool reduces as logical or (sum, max) and logical and (product, min) on its 0/1 bytes.
 * min(x, y) is `y < x ? y : x` and max(x, y) is `x < y ? y : x`, with x the value accumulated so far:
 * a NaN already accumulated stays, a NaN arriving later is dropped (as every backend did before).
 * float16/bfloat16 compute in Acc<T> (float32) and are rounded once on store.
 *
 * The loops run over distinct __restrict pointers so that the compiler vectorizes them; the block
 * driver keeps its accumulator in L1 (kReduceBlockBytes) and `out` may be one of the sources (each
 * block is fully read before it is written).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cohort/core/tensor/dtype.h>
#include <cohort/distributed/collective_options.h>

namespace cohort::dist::detail {

inline constexpr size_t kReduceBlockBytes = 8192;

// How a value of logical type T is stored and accumulated: bool as its byte; float16/bfloat16 in float32.
template <typename T>
using ReduceStorage = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
template <typename T>
using ReduceAcc = std::conditional_t<std::is_same_v<T, bool>, uint8_t, Acc<T>>;

// x (op) y for elements of logical type T held as A; Avg combines as Sum (the division is separate).
template <typename T, ReduceOp Op, typename A>
inline A combineOne(A x, A y) {
  if constexpr (std::is_same_v<T, bool>) {
    if constexpr (Op == ReduceOp::Product || Op == ReduceOp::Min) {
      return static_cast<A>(x & y);
    } else {
      return static_cast<A>(x | y);
    }
  } else if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Avg) {
    return static_cast<A>(x + y);
  } else if constexpr (Op == ReduceOp::Product) {
    return static_cast<A>(x * y);
  } else if constexpr (Op == ReduceOp::Min) {
    return y < x ? y : x;
  } else {
    return x < y ? y : x;
  }
}

// acc[i] = src[i], widened to the accumulation type.
template <typename A, typename S>
inline void loadBlock(A* __restrict acc, const S* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(src[i]);
}

// acc[i] = acc[i] (op) src[i].
template <typename T, ReduceOp Op, typename A, typename S>
inline void combineBlock(A* __restrict acc, const S* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = combineOne<T, Op, A>(acc[i], static_cast<A>(src[i]));
}

// acc[i] = a[i] (op) b[i]: the first two sources in one pass.
template <typename T, ReduceOp Op, typename A, typename S>
inline void combine2Block(A* __restrict acc, const S* __restrict a, const S* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = combineOne<T, Op, A>(static_cast<A>(a[i]), static_cast<A>(b[i]));
}

// out[i] = acc[i], rounded to the storage type.
template <typename A, typename S>
inline void storeBlock(S* __restrict out, const A* __restrict acc, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<S>(acc[i]);
}

template <typename A>
inline void divideBlock(A* __restrict acc, A div, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] /= div;
}

// acc = acc (op) x, element-wise over n elements, op chosen at run time (Avg sums). A is the
// accumulation type and T the logical element type of x (bool: A and T are bool, reduced bytewise).
template <typename A, typename T>
void accumulate(A* acc, const T* x, size_t n, ReduceOp op) {
  using AS = ReduceStorage<A>;
  using TS = ReduceStorage<T>;
  auto* a = reinterpret_cast<AS*>(acc);
  auto* s = reinterpret_cast<const TS*>(x);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: combineBlock<T, ReduceOp::Sum, AS, TS>(a, s, n); return;
    case ReduceOp::Product: combineBlock<T, ReduceOp::Product, AS, TS>(a, s, n); return;
    case ReduceOp::Min: combineBlock<T, ReduceOp::Min, AS, TS>(a, s, n); return;
    case ReduceOp::Max: combineBlock<T, ReduceOp::Max, AS, TS>(a, s, n); return;
  }
}

// c = a (op) b over n elements of T (never float16/bfloat16: no widening here). c may be a (the
// usual in-place call) or distinct from both; any other overlap takes the plain loop.
template <typename T, ReduceOp Op>
void combineInto(void* cv, const void* av, const void* bv, size_t n) {
  using S = ReduceStorage<T>;
  S* c = static_cast<S*>(cv);
  const S* a = static_cast<const S*>(av);
  const S* b = static_cast<const S*>(bv);
  if (c == a && c != b) {
    combineBlock<T, Op, S, S>(c, b, n);
  } else if (c != a && c != b) {
    combine2Block<T, Op, S, S>(c, a, b, n);
  } else {
    for (size_t i = 0; i < n; ++i) c[i] = combineOne<T, Op, S>(a[i], b[i]);
  }
}

// Storage type T, op fixed at compile time; the result goes to each of the nout outputs (any of
// which may also be a source).
template <typename T, ReduceOp Op>
void reduceSourcesOp(T* const* outs, int nout, const T* const* srcs, int nsrc, size_t n, int divisor) {
  using A = ReduceAcc<T>;
  using S = ReduceStorage<T>;
  constexpr size_t kBlock = kReduceBlockBytes / sizeof(A);
  alignas(64) A acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    int k = 1;
    if constexpr (!std::is_same_v<T, bool>) {
      if (nsrc >= 2) {
        combine2Block<T, Op, A, S>(acc, srcs[0] + b, srcs[1] + b, m);
        k = 2;
      } else {
        loadBlock<A, S>(acc, srcs[0] + b, m);
      }
    } else {
      loadBlock<A, S>(acc, reinterpret_cast<const S*>(srcs[0]) + b, m);
    }
    for (; k < nsrc; ++k) combineBlock<T, Op, A, S>(acc, reinterpret_cast<const S*>(srcs[k]) + b, m);
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

}  // namespace cohort::dist::detail
