// core/blas: half-width GEMM with a bias (blas::hgemmBias), the product of a bfloat16/float16
// linear layer.
//
// The bias is an input of oneDNN's matmul where hgemm runs there, and otherwise it is filled into
// C and hgemm adds the product. For a bias of half values widened to float32 (what autocast gives a
// linear layer) both must produce the same bits, and both must match a long double reference within
// float32 accumulation plus one rounding to the half type.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/blas/blas.h>

#include "core/test_util.h"

namespace cohort {
namespace {

using blas::HalfType;
using blas::Trans;
using testing::expectError;

uint16_t toBits(HalfType t, float v) { return t == HalfType::BFloat16 ? BFloat16::fromFloat(v) : Half::fromFloat(v); }
float fromBits(HalfType t, uint16_t b) {
  return t == HalfType::BFloat16 ? static_cast<float>(BFloat16::fromBits(b)) : static_cast<float>(Half::fromBits(b));
}

struct Shape3 {
  Trans ta, tb;
  int64_t m, n, k, pad;  // pad: extra columns in every leading dimension
};

void checkHgemmBias(HalfType t, const Shape3& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t lda = (s.ta == Trans::No ? s.k : s.m) + s.pad, ldb = (s.tb == Trans::No ? s.n : s.k) + s.pad;
  const int64_t ldc = s.n + s.pad;
  const int64_t aRows = s.ta == Trans::No ? s.m : s.k, bRows = s.tb == Trans::No ? s.k : s.n;
  std::vector<uint16_t> a(static_cast<size_t>(std::max<int64_t>(1, aRows * lda)));
  std::vector<uint16_t> b(static_cast<size_t>(std::max<int64_t>(1, bRows * ldb)));
  std::vector<float> bias(static_cast<size_t>(std::max<int64_t>(1, s.n)));
  for (auto& x : a) x = toBits(t, u(rng));
  for (auto& x : b) x = toBits(t, u(rng));
  for (auto& x : bias) x = fromBits(t, toBits(t, 4.f * u(rng)));  // half values, as autocast's bias
  const uint16_t sentinel = toBits(t, 12345.f);
  std::vector<uint16_t> got(static_cast<size_t>(std::max<int64_t>(1, s.m * ldc)), sentinel);
  std::vector<uint16_t> filled = got;
  blas::hgemmBias(t, s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, bias.data(), got.data(), ldc);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) filled[i * ldc + j] = toBits(t, bias[j]);
  blas::hgemm(t, false, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 1.f, filled.data(), ldc);
  const std::string what = std::string(t == HalfType::BFloat16 ? "bfloat16" : "float16") + " m=" + std::to_string(s.m) +
                           " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                           (s.ta == Trans::Yes ? " A^T" : "") + (s.tb == Trans::Yes ? " B^T" : "");
  ASSERT_EQ(got, filled) << what << ": the bias as a matmul input and the bias filled in differ";
  const long double eps32 = std::numeric_limits<float>::epsilon();
  const long double epsHalf = t == HalfType::BFloat16 ? 1.0L / 256 : 1.0L / 2048;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      long double sum = bias[j], mag = std::fabs(bias[j]);
      for (int64_t p = 0; p < s.k; ++p) {
        const long double x = fromBits(t, s.ta == Trans::No ? a[i * lda + p] : a[p * lda + i]);
        const long double y = fromBits(t, s.tb == Trans::No ? b[p * ldb + j] : b[j * ldb + p]);
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const long double bound = (s.k + 2) * eps32 * mag + epsHalf * std::fabs(sum) + 1e-6L;
      const long double v = fromBits(t, got[i * ldc + j]);
      ASSERT_LE(std::fabs(v - sum), bound) << what << " at (" << i << "," << j << ")";
    }
    for (int64_t j = s.n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], sentinel) << what << " wrote padding";
  }
}

TEST(HgemmBias, EqualsTheBiasFilledInAndTheReference) {
  unsigned seed = 40;
  for (HalfType t : {HalfType::BFloat16, HalfType::Float16}) {
    for (auto [ta, tb] : {std::pair{Trans::No, Trans::Yes}, {Trans::No, Trans::No}, {Trans::Yes, Trans::No}}) {
      checkHgemmBias(t, {ta, tb, 1, 1, 1, 0}, seed++);
      checkHgemmBias(t, {ta, tb, 7, 5, 3, 2}, seed++);
      checkHgemmBias(t, {ta, tb, 64, 96, 48, 0}, seed++);
      checkHgemmBias(t, {ta, tb, 130, 70, 385, 3}, seed++);  // k split into blocks, padded rows
    }
    checkHgemmBias(t, {Trans::No, Trans::Yes, 3, 4, 0, 1}, seed++);  // k == 0: the bias alone
  }
}

// A thread keeps the primitives it ran (and their memory objects) in front of the shared cache and
// starts over past a few hundred shapes: products stay right across that, and for shapes run again.
TEST(HgemmBias, ManyShapesOnOneThread) {
  unsigned seed = 900;
  for (int64_t n = 1; n <= 300; ++n) checkHgemmBias(HalfType::BFloat16, {Trans::No, Trans::Yes, 3, n, 5, 0}, seed++);
  for (int64_t n = 1; n <= 20; ++n) checkHgemmBias(HalfType::BFloat16, {Trans::No, Trans::Yes, 3, n, 5, 0}, seed++);
}

// nn.Linear's forward on half tensors (what autocast runs) adds the bias before the one rounding.
TEST(HgemmBias, HalfLinearEqualsTheFloat64ProductPlusBiasWithinOneRounding) {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Generator g(3);
    Tensor x = randn({2, 33, 40}, {}, &g).to(dt), w = randn({50, 40}, {}, &g).to(dt);
    Tensor bias = randn({50}, {}, &g).to(dt);
    Tensor got = linear(x, w, bias);
    ASSERT_EQ(got.dtype(), dt);
    Tensor want = matmul(x.to(DType::Float64), w.to(DType::Float64).t()) + bias.to(DType::Float64);
    const double tol = dt == DType::BFloat16 ? 1.0 / 256 : 1.0 / 2048;
    Tensor err = (got.to(DType::Float64) - want).abs() - want.abs() * tol;
    EXPECT_LE(err.max().item<double>(), 1e-5) << dtypeName(dt);
  }
}

TEST(HgemmBias, BadArgumentsAreValueErrors) {
  std::vector<uint16_t> x(16, 0), y(16);
  std::vector<float> bias(4, 0.f);
  expectError<ValueError>(
      [&] {
        blas::hgemmBias(HalfType::BFloat16, Trans::No, Trans::No, 2, 2, 2, x.data(), 2, x.data(), 2, nullptr, y.data(),
                        2);
      },
      {"hgemmBias", "null bias"});
  expectError<ValueError>(
      [&] {
        blas::hgemmBias(HalfType::BFloat16, Trans::No, Trans::No, 2, 3, 2, x.data(), 2, x.data(), 3, bias.data(),
                        y.data(), 2);
      },
      {"hgemmBias", "ldc=2"});
  expectError<ValueError>(
      [&] {
        blas::hgemmBias(HalfType::Float16, Trans::No, Trans::No, 2, 2, 2, nullptr, 2, x.data(), 2, bias.data(),
                        y.data(), 2);
      },
      {"hgemmBias", "null"});
}

}  // namespace
}  // namespace cohort
