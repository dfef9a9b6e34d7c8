/*
 * Element-wise reductions for the gloo backend: the functions gloo's allreduce/reduce call to
 * combine two buffers (simple loops over contiguous memory that the compiler vectorizes), and
 * the local accumulation reduce_scatter uses. float16/bfloat16 never reach gloo's reduce: the
 * backend widens them to float32 first, so they accumulate in float32 and round once.
 * bool reduces as logical or (sum, max) and logical and (product, min).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>

#include <cohort/core/tensor/dtype.h>
#include <cohort/distributed/types.h>

namespace cohort::dist::gloo_backend {

using GlooReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

template <typename T, ReduceOp Op>
void combine(void* cv, const void* av, const void* bv, size_t n) {
  T* c = static_cast<T*>(cv);
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  if constexpr (std::is_same_v<T, bool>) {
    // bool storage is one byte of 0/1: or/and on the bytes.
    auto* cb = reinterpret_cast<uint8_t*>(c);
    auto* ab = reinterpret_cast<const uint8_t*>(a);
    auto* bb = reinterpret_cast<const uint8_t*>(b);
    if constexpr (Op == ReduceOp::Product || Op == ReduceOp::Min) {
      for (size_t i = 0; i < n; ++i) cb[i] = ab[i] & bb[i];
    } else {
      for (size_t i = 0; i < n; ++i) cb[i] = ab[i] | bb[i];
    }
  } else if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Avg) {
    for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
  } else if constexpr (Op == ReduceOp::Product) {
    for (size_t i = 0; i < n; ++i) c[i] = a[i] * b[i];
  } else if constexpr (Op == ReduceOp::Min) {
    for (size_t i = 0; i < n; ++i) c[i] = b[i] < a[i] ? b[i] : a[i];
  } else {
    for (size_t i = 0; i < n; ++i) c[i] = a[i] < b[i] ? b[i] : a[i];
  }
}

// The gloo reduce function for a storage type T (never Half/BFloat16).
template <typename T>
GlooReduceFn reduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return &combine<T, ReduceOp::Sum>;
    case ReduceOp::Product: return &combine<T, ReduceOp::Product>;
    case ReduceOp::Min: return &combine<T, ReduceOp::Min>;
    case ReduceOp::Max: return &combine<T, ReduceOp::Max>;
  }
  return &combine<T, ReduceOp::Sum>;
}

// acc = acc (op) x, elementwise, n elements; A is the accumulation type.
template <typename A, typename T>
void accumulate(A* acc, const T* x, size_t n, ReduceOp op) {
  if constexpr (std::is_same_v<A, bool>) {
    auto* ab = reinterpret_cast<uint8_t*>(acc);
    auto* xb = reinterpret_cast<const uint8_t*>(x);
    if (op == ReduceOp::Product || op == ReduceOp::Min) {
      for (size_t i = 0; i < n; ++i) ab[i] &= xb[i];
    } else {
      for (size_t i = 0; i < n; ++i) ab[i] |= xb[i];
    }
    return;
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        for (size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(x[i]);
        return;
      case ReduceOp::Product:
        for (size_t i = 0; i < n; ++i) acc[i] *= static_cast<A>(x[i]);
        return;
      case ReduceOp::Min:
        for (size_t i = 0; i < n; ++i) {
          A v = static_cast<A>(x[i]);
          acc[i] = v < acc[i] ? v : acc[i];
        }
        return;
      case ReduceOp::Max:
        for (size_t i = 0; i < n; ++i) {
          A v = static_cast<A>(x[i]);
          acc[i] = acc[i] < v ? v : acc[i];
        }
        return;
    }
  }
}

}  // namespace cohort::dist::gloo_backend
