// Shared by the CUDA tests: skipping without a GPU, and comparing a CUDA result with the CPU's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>

namespace cohort::testing {

#define COHORT_REQUIRE_GPU()                                                                       \
  do {                                                                                             \
    if (!::cohort::cuda::isAvailable())                                                            \
      GTEST_SKIP() << "no CUDA device (this build " << (COHORT_USE_CUDA ? "has" : "has no")        \
                   << " CUDA): the GPU tests run on a machine with a GPU, see README 'GPU tests'"; \
  } while (0)

// The float dtypes every kernel test runs through.
inline const std::vector<DType> kFloatTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};

// Test inputs, the same on every call with one seed: floats uniform in [lo, hi), integers in
// [0, 100), bools true with probability 1/2.
inline Tensor values(const Shape& s, DType dt, uint64_t seed = 1, double lo = -4, double hi = 4) {
  Generator g(seed);
  Tensor u = rand(s, {}, &g);
  if (isFloating(dt)) return (u * (hi - lo) + lo).to(dt);
  if (dt == DType::Bool) return gt(u, scalarTensor(0.5));
  return (u * 100.0).to(DType::Int64).to(dt);
}

// A batch a small classifier can learn: x [n, features] ~ N(0, 1) from one of `distinct` seeds
// (batchSeed + step % distinct: the batches cycle, so the loss can fall) and the label
// argmax(x W0) for a fixed W0 [features, classes] drawn from weightSeed; both on `dev`.
struct LearnableBatch {
  int64_t n, features, classes;
  uint64_t weightSeed, batchSeed;
  int distinct;
};
inline std::pair<Tensor, Tensor> learnableBatch(const LearnableBatch& b, int step, Device dev) {
  Generator wg(b.weightSeed);
  Tensor w0 = randn({b.features, b.classes}, {}, &wg);
  Generator g(b.batchSeed + static_cast<uint64_t>(step % b.distinct));
  Tensor x = randn({b.n, b.features}, {}, &g);
  return {x.to(dev), argmax(matmul(x, w0), 1).to(dev)};
}

// Every element of `got` (any device) within atol + rtol * |want| of `want` (CPU), shapes and
// dtypes equal; equal values (infinities included) and NaN against NaN pass. On failure: the
// count, and the worst element with its flat index and both values.
inline void expectClose(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what = "") {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  std::vector<double> g = got.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  std::vector<double> w = want.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  double worst = -1;
  size_t at = 0, bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
    const double excess = std::abs(g[i] - w[i]) - (atol + rtol * std::abs(w[i]));
    if (excess <= 0) continue;
    ++bad;
    const double e = std::isnan(excess) ? INFINITY : excess;
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << w.size() << " elements off; worst at flat index " << at
                     << ": got " << (bad ? g[at] : 0.0) << ", want " << (bad ? w[at] : 0.0) << " (atol " << atol
                     << ", rtol " << rtol << ")";
}

// Same bytes (after moving `got` to the CPU): bit-identical results.
inline void expectBitEqual(const Tensor& got, const Tensor& want, const std::string& what = "") {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  Tensor g = got.to(Device::cpu()).contiguous(), w = want.contiguous();
  if (w.numel() == 0) return;
  const auto* pg = static_cast<const unsigned char*>(g.dataPtr());
  const auto* pw = static_cast<const unsigned char*>(w.dataPtr());
  size_t es = w.elementSize();
  for (int64_t i = 0; i < w.numel(); ++i)
    if (std::memcmp(pg + i * es, pw + i * es, es) != 0) {
      ADD_FAILURE() << what << ": first difference at flat index " << i << ": got "
                    << g.to(DType::Float64).contiguous().toVector<double>()[static_cast<size_t>(i)] << ", want "
                    << w.to(DType::Float64).contiguous().toVector<double>()[static_cast<size_t>(i)];
      return;
    }
}

}  // namespace cohort::testing
