// Helpers for process-group tests: the worlds of tests/harness/world.h (ranks as threads sharing a
// HashStore, or a launcher's processes), per-rank data that every reduction keeps exact,
// references computed in double, and element-by-element comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>

#include "harness/world.h"

namespace cohort::dist::testing {

using namespace std::chrono_literals;

// The key Works are completed with (work.h), for tests that complete Works by hand: taken the way
// a backend of a user's own takes it, from the Backend base class.
struct CompletionKeySource : Backend {
  static Work::CompletionKey key() { return completionKey(); }
};
inline Work::CompletionKey completionKeyForTests() { return CompletionKeySource::key(); }

inline const std::vector<DType> kAllDTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                              DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};
inline const std::vector<ReduceOp> kAllReduceOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min,
                                                    ReduceOp::Max};
inline const std::vector<int64_t> kCounts = {0, 1, 7, 1000};
inline constexpr int64_t kLargeCount = (1 << 20) + 3;

// Ranks as threads, or as a launcher's processes: tests/harness/world.h.
using ::cohort::testing::makeWorld;
using ::cohort::testing::ThreadWorld;
using ::cohort::testing::World;

// ---- data and references -------------------------------------------------------------------

inline bool isSigned(DType d) { return d != DType::UInt8 && d != DType::Bool; }

// Values chosen so every reduction over up to 5 ranks is exact in every dtype (sums are
// multiples of 0.25 below 32 in magnitude, products of {0.5, 1, 1.5} or {-1, 2}).
inline double value(DType d, ReduceOp op, int rank, int64_t i) {
  if (d == DType::Bool) return ((rank + i) % 5 != 0) ? 1.0 : 0.0;
  if (op == ReduceOp::Product) {
    if (isFloating(d)) return 0.5 * (1 + (rank + i) % 3);
    if (isSigned(d)) return (rank + i) % 2 ? 2.0 : -1.0;
    return 1.0 + (rank + i) % 2;
  }
  double v = static_cast<double>((rank * 7 + i * 3) % 11);
  if (isSigned(d)) v -= 5;
  if (isFloating(d)) v *= 0.25 + 0.5 * ((rank + i) % 2);
  return v;
}

// Casts a double to the dtype and back, as storing it would.
inline double roundTo(DType d, double v) {
  switch (d) {
    case DType::Float32: return static_cast<float>(v);
    case DType::Float64: return v;
    case DType::Float16: return static_cast<float>(Half(static_cast<float>(v)));
    case DType::BFloat16: return static_cast<float>(BFloat16(static_cast<float>(v)));
    case DType::Int64: return static_cast<double>(static_cast<int64_t>(v));
    case DType::Int32: return static_cast<double>(static_cast<int32_t>(v));
    case DType::UInt8: return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
    case DType::Bool: return v != 0 ? 1.0 : 0.0;
  }
  return v;
}

inline double reduceRef(DType d, ReduceOp op, int size, int64_t i, const std::vector<int>& ranks = {}) {
  std::vector<int> rs = ranks;
  if (rs.empty())
    for (int r = 0; r < size; ++r) rs.push_back(r);
  double acc = value(d, op, rs[0], i);
  for (size_t k = 1; k < rs.size(); ++k) {
    double v = value(d, op, rs[k], i);
    if (d == DType::Bool) {
      bool andOp = op == ReduceOp::Product || op == ReduceOp::Min;
      acc = andOp ? (acc != 0 && v != 0) : (acc != 0 || v != 0);
      continue;
    }
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Product: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) acc /= static_cast<double>(rs.size());
  return roundTo(d, acc);
}

// value() and so every reference built from it repeat every kValuePeriod indices (the moduli
// it uses are 2, 3, 5 and 11).
inline constexpr int64_t kValuePeriod = 330;

// f, computed once for the first kValuePeriod indices: the same function for any f of the form
// i -> g(value(..., c + i)), and cheap on the million-element tensors.
inline std::function<double(int64_t)> periodic(const std::function<double(int64_t)>& f) {
  auto table = std::make_shared<std::vector<double>>(kValuePeriod);
  for (int64_t i = 0; i < kValuePeriod; ++i) (*table)[i] = f(i);
  return [table](int64_t i) { return (*table)[i % kValuePeriod]; };
}

inline Tensor filled(DType d, int64_t n, const std::function<double(int64_t)>& f) {
  Tensor t = empty({n}, TensorOptions{.dtype = d});
  COHORT_DISPATCH(d, "filled", [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) p[i] = T(static_cast<float>(f(i)));
      else p[i] = static_cast<T>(f(i));
    }
  });
  return t;
}

inline double elementAt(const Tensor& t, int64_t i) {
  return COHORT_DISPATCH(t.dtype(), "elementAt", [&]<typename T>() -> double {
    const T* p = static_cast<const T*>(t.dataPtr());
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(p[i]);
    else return static_cast<double>(p[i]);
  });
}

inline double tolerance(DType d, double expected) {
  double mag = std::max(1.0, std::abs(expected));
  switch (d) {
    case DType::Float32: return 2e-6 * mag;
    case DType::Float64: return 1e-12 * mag;
    case DType::Float16: return 1e-3 * mag;
    case DType::BFloat16: return 8e-3 * mag;
    default: return 0;
  }
}

// "" when t[i] == expected(i) for every i (within the dtype's rounding), else the first mismatch.
inline std::string mismatch(const Tensor& t, int64_t n, const std::function<double(int64_t)>& expected) {
  if (t.numel() != n) return fmt::format("expected {} elements, got {}", n, t.numel());
  for (int64_t i = 0; i < n; ++i) {
    double e = expected(i), g = elementAt(t, i);
    if (!(std::abs(g - e) <= tolerance(t.dtype(), e))) {
      return fmt::format("{} element {}: got {}, expected {}", dtypeName(t.dtype()), i, g, e);
    }
  }
  return "";
}

#define COHORT_EXPECT_MATCH(t, n, fn)                                     \
  do {                                                                    \
    std::string cohort_mm_ = ::cohort::dist::testing::mismatch(t, n, fn); \
    if (!cohort_mm_.empty()) throw std::runtime_error(cohort_mm_);        \
  } while (0)

// Largest absolute elementwise difference.
inline double maxDiff(const Tensor& a, const Tensor& b) { return (a - b).abs().max().item<double>(); }

// Data-parallel results: every rank holds the reference parameters (within `tol`), and every rank
// exactly the same ones as rank 0.
inline void expectRanksMatchReference(const std::vector<std::vector<Tensor>>& rankParams,
                                      const std::vector<Tensor>& reference, double tol) {
  for (size_t r = 0; r < rankParams.size(); ++r) {
    ASSERT_EQ(rankParams[r].size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_LE(maxDiff(rankParams[r][i], reference[i]), tol) << "rank " << r << " parameter " << i;
      EXPECT_EQ(maxDiff(rankParams[r][i], rankParams[0][i]), 0.0) << "rank " << r << " parameter " << i;
    }
  }
}

}  // namespace cohort::dist::testing
