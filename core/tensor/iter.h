/*
 * Elementwise iteration: the one loop every elementwise kernel, copy and type conversion uses.
 *
 * forEachStrided(shape, ptrs, strides, inner) walks a shape with N operands (operand 0 is usually
 * the output). Strides are in bytes per dim (0 for a broadcast dim). Dims of size 1 are dropped
 * and dims that are contiguous with each other in every operand are merged, so a contiguous or
 * simply-broadcast tensor of any rank becomes one flat inner loop. `inner(ptrs, innerStrides, n)`
 * handles n elements along the innermost dim.
 *
 * mapKernel<TOut, TIn>(out, {a, b, ...}, f) applies f elementwise with broadcasting: f takes
 * Acc<TIn> values and returns Acc<TOut>. The innermost loop has contiguous and scalar-broadcast
 * fast paths with no index arithmetic, which the compiler vectorizes.
 * Kernels run on the calling thread, unless the caller passes a `parallelGrain` (> 0): then a
 * contiguous output whose inputs are contiguous or single elements is split across
 * intraOpThreads() threads in chunks of at least that many elements (core/util/parallel.h).
 * Compute-bound kernels (transcendentals, pow) pass one; memory-bound ones (add, copy) do not,
 * since one core already moves about what the memory system gives here.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/tensor/half.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/parallel.h>

namespace cohort::detail {

template <size_t N, typename Inner>
void forEachStrided(const Shape& shape, std::array<char*, N> ptrs, const std::array<Shape, N>& byteStrides,
                    Inner&& inner) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  for (int64_t d = 0; d < nd; ++d)
    if (shape[d] == 0) return;
  // Collect non-trivial dims, innermost first, merging contiguous neighbours.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
  sizes.reserve(nd);
  strides.reserve(nd);
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = byteStrides[k][d];
    if (!sizes.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k)
        if (s[k] != strides.back()[k] * sizes.back()) merge = false;
      if (merge) {
        sizes.back() *= shape[d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(s);
  }
  if (sizes.empty()) {
    std::array<int64_t, N> zero{};
    inner(ptrs, zero, int64_t{1});
    return;
  }
  const size_t outer = sizes.size() - 1;
  if (outer == 0) {
    inner(ptrs, strides[0], sizes[0]);
    return;
  }
  std::vector<int64_t> counter(sizes.size(), 0);
  while (true) {
    inner(ptrs, strides[0], sizes[0]);
    // Advance the outer counters (dims 1..outer, innermost first).
    size_t d = 1;
    for (; d <= outer; ++d) {
      for (size_t k = 0; k < N; ++k) ptrs[k] += strides[d][k];
      if (++counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k) ptrs[k] -= strides[d][k] * sizes[d];
      counter[d] = 0;
    }
    if (d > outer) return;
  }
}

// Byte strides of `t` viewed as broadcast to `shape` (right-aligned; 0 on broadcast dims).
Shape broadcastByteStrides(const Tensor& t, const Shape& shape);

template <typename T>
inline Acc<T> load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<Acc<T>>(v);
}

// The elements per chunk that compute-bound kernels pass as mapKernel's parallelGrain: ~0.1 ms
// of pow or erf per chunk, far above the cost of waking a helper thread.
inline constexpr int64_t kComputeBoundGrain = int64_t{1} << 15;

// float16 elementwise loops (in and out float16, each input contiguous or one broadcast value):
// the element loop converts each value on its own, and the scalar float<->half conversions do not
// vectorize (18-21% of memcpy for add). So operands are widened a block at a time with the bulk
// F16C conversions (half.h), `f` runs on float arrays, and the results are narrowed the same way:
// the element loop's bits (the bulk conversions equal the scalar ones), every step vectorized, the
// blocks in L1 (70-74% of memcpy). bfloat16's conversions are shifts and a select that the
// compiler vectorizes in the element loop itself, which measured faster than blocking.
inline constexpr int64_t kHalfBlock = 256;

template <typename T, size_t NIn, typename F>
void halfBlockLoop(T* o, const std::array<const T*, NIn>& in, const std::array<bool, NIn>& broadcast, int64_t n, F& f) {
  float buf[NIn][kHalfBlock];
  float res[kHalfBlock];
  for (size_t k = 0; k < NIn; ++k)
    if (broadcast[k]) std::fill_n(buf[k], kHalfBlock, static_cast<float>(in[k][0]));
  for (int64_t i0 = 0; i0 < n; i0 += kHalfBlock) {
    const int64_t m = std::min(kHalfBlock, n - i0);
    for (size_t k = 0; k < NIn; ++k)
      if (!broadcast[k]) halfTypeToFloatN(in[k] + i0, buf[k], m);
    if constexpr (NIn == 1) {
      for (int64_t i = 0; i < m; ++i) res[i] = static_cast<float>(f(buf[0][i]));
    } else if constexpr (NIn == 2) {
      for (int64_t i = 0; i < m; ++i) res[i] = static_cast<float>(f(buf[0][i], buf[1][i]));
    } else {
      for (int64_t i = 0; i < m; ++i) res[i] = static_cast<float>(f(buf[0][i], buf[1][i], buf[2][i]));
    }
    floatToHalfTypeN(res, o + i0, m);
  }
}

template <typename TOut, typename TIn, size_t NIn, typename F>
void mapKernel(const Tensor& out, const std::array<Tensor, NIn>& ins, F&& f, int64_t parallelGrain = 0) {
  constexpr size_t N = NIn + 1;
  std::array<char*, N> ptrs;
  std::array<Shape, N> strides;
  const Shape& shape = out.sizes();
  const int64_t numel = out.numel();
  if (numel == 0) return;
  ptrs[0] = static_cast<char*>(out.dataPtr());
  for (size_t k = 0; k < NIn; ++k) ptrs[k + 1] = static_cast<char*>(ins[k].dataPtr());
  auto inner = [&](std::array<char*, N> p, const std::array<int64_t, N>& s, int64_t n) {
    TOut* o = reinterpret_cast<TOut*>(p[0]);
    if constexpr (std::is_same_v<TIn, Half> && std::is_same_v<TOut, TIn>) {
      bool blocked = s[0] == sizeof(TOut);
      std::array<const TIn*, NIn> in;
      std::array<bool, NIn> broadcast;
      for (size_t k = 0; k < NIn; ++k) {
        in[k] = reinterpret_cast<const TIn*>(p[k + 1]);
        broadcast[k] = s[k + 1] == 0;
        blocked = blocked && (s[k + 1] == 0 || s[k + 1] == sizeof(TIn));
      }
      if (blocked && n >= 16) {
        halfBlockLoop<TIn, NIn>(o, in, broadcast, n, f);
        return;
      }
    }
    if constexpr (NIn == 1) {
      const TIn* a = reinterpret_cast<const TIn*>(p[1]);
      if (s[0] == sizeof(TOut) && s[1] == sizeof(TIn)) {
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<TOut>(f(static_cast<Acc<TIn>>(a[i])));
      } else if (s[0] == sizeof(TOut) && s[1] == 0) {
        const TOut v = static_cast<TOut>(f(static_cast<Acc<TIn>>(a[0])));
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TOut*>(p[0] + i * s[0]) =
              static_cast<TOut>(f(static_cast<Acc<TIn>>(*reinterpret_cast<const TIn*>(p[1] + i * s[1]))));
      }
    } else if constexpr (NIn == 2) {
      const TIn* a = reinterpret_cast<const TIn*>(p[1]);
      const TIn* b = reinterpret_cast<const TIn*>(p[2]);
      using A = Acc<TIn>;
      if (s[0] == sizeof(TOut) && s[1] == sizeof(TIn) && s[2] == sizeof(TIn)) {
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<TOut>(f(static_cast<A>(a[i]), static_cast<A>(b[i])));
      } else if (s[0] == sizeof(TOut) && s[1] == sizeof(TIn) && s[2] == 0) {
        const A bv = static_cast<A>(b[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<TOut>(f(static_cast<A>(a[i]), bv));
      } else if (s[0] == sizeof(TOut) && s[1] == 0 && s[2] == sizeof(TIn)) {
        const A av = static_cast<A>(a[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<TOut>(f(av, static_cast<A>(b[i])));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TOut*>(p[0] + i * s[0]) =
              static_cast<TOut>(f(static_cast<A>(*reinterpret_cast<const TIn*>(p[1] + i * s[1])),
                                  static_cast<A>(*reinterpret_cast<const TIn*>(p[2] + i * s[2]))));
      }
    } else {
      using A = Acc<TIn>;
      if (s[0] == sizeof(TOut) && s[1] == sizeof(TIn) && s[2] == sizeof(TIn) && s[3] == sizeof(TIn)) {
        const TIn* a = reinterpret_cast<const TIn*>(p[1]);
        const TIn* b = reinterpret_cast<const TIn*>(p[2]);
        const TIn* c = reinterpret_cast<const TIn*>(p[3]);
        for (int64_t i = 0; i < n; ++i)
          o[i] = static_cast<TOut>(f(static_cast<A>(a[i]), static_cast<A>(b[i]), static_cast<A>(c[i])));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TOut*>(p[0] + i * s[0]) =
              static_cast<TOut>(f(static_cast<A>(*reinterpret_cast<const TIn*>(p[1] + i * s[1])),
                                  static_cast<A>(*reinterpret_cast<const TIn*>(p[2] + i * s[2])),
                                  static_cast<A>(*reinterpret_cast<const TIn*>(p[3] + i * s[3]))));
      }
    }
  };
  if (parallelGrain > 0 && numel >= 2 * parallelGrain && out.isContiguous()) {
    // Flat operands: every chunk is the same inner loop over a sub-range.
    std::array<int64_t, N> flat;
    flat[0] = sizeof(TOut);
    bool isFlat = true;
    for (size_t k = 0; k < NIn; ++k) {
      if (ins[k].numel() == 1) flat[k + 1] = 0;
      else if (ins[k].isContiguous() && ins[k].numel() == numel) flat[k + 1] = sizeof(TIn);
      else isFlat = false;
    }
    if (isFlat) {
      parallelFor(numel, parallelGrain, [&](int64_t begin, int64_t end) {
        std::array<char*, N> p = ptrs;
        for (size_t k = 0; k < N; ++k) p[k] += begin * flat[k];
        inner(p, flat, end - begin);
      });
      return;
    }
  }
  strides[0] = broadcastByteStrides(out, shape);
  for (size_t k = 0; k < NIn; ++k) strides[k + 1] = broadcastByteStrides(ins[k], shape);
  forEachStrided<N>(shape, ptrs, strides, inner);
}

}  // namespace cohort::detail
