// Accuracy of the vectorizable float math (core/ops/vec_math.h) against double-precision std::
// functions: maximum error in ulp over a sweep of the whole float range, and IEEE special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <cohort/core/ops/vec_math.h>

namespace vm = cohort::vecmath;

namespace {

// |got - ref| in units of the float spacing at ref (subnormal spacing below FLT_MIN).
double ulpError(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : 1e30;
  float rf = static_cast<float>(ref);
  if (std::isinf(rf)) {
    if (got == rf) return 0;
    // ref rounds to inf only when above FLT_MAX + half an ulp: a finite FLT_MAX is 1 ulp away.
    return std::abs(got) == std::numeric_limits<float>::max() ? 1 : 1e30;
  }
  if (std::isinf(got)) return 1e30;
  double a = std::abs(static_cast<double>(rf));
  double ulp = a < std::numeric_limits<float>::min() ? std::numeric_limits<float>::denorm_min()
                                                      : std::nextafter(static_cast<float>(a), INFINITY) - a;
  return std::abs(static_cast<double>(got) - ref) / ulp;
}

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Max ulp error of f against ref over every `step`-th float bit pattern (both signs, all exponents).
template <typename F, typename R>
double maxUlp(F f, R ref, float lo, float hi, float* where, uint64_t step = 61) {
  double worst = 0;
  for (uint64_t u = 0; u < 0x100000000ull; u += step) {
    float x = fromBits(static_cast<uint32_t>(u));
    if (!(x >= lo && x <= hi)) continue;
    double e = ulpError(f(x), ref(static_cast<double>(x)));
    if (e > worst) {
      worst = e;
      *where = x;
    }
  }
  return worst;
}

}  // namespace

TEST(VecMath, ExpAccuracy) {
  float at = 0;
  double e = maxUlp([](float x) { return vm::exp(x); }, [](double x) { return std::exp(x); }, -110.0f, 90.0f, &at);
  EXPECT_LE(e, 2.0) << "at " << at;
}

TEST(VecMath, LogAccuracy) {
  float at = 0;
  double e = maxUlp([](float x) { return vm::log(x); }, [](double x) { return std::log(x); }, 0.0f,
                    std::numeric_limits<float>::max(), &at);
  EXPECT_LE(e, 2.0) << "at " << at;
}

TEST(VecMath, TanhSigmoidErfAccuracy) {
  const float inf = std::numeric_limits<float>::infinity();
  float at = 0;
  double e = maxUlp([](float x) { return vm::tanh(x); }, [](double x) { return std::tanh(x); }, -inf, inf, &at);
  EXPECT_LE(e, 3.0) << "tanh at " << at;
  e = maxUlp([](float x) { return vm::sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -inf, inf,
             &at);
  EXPECT_LE(e, 4.0) << "sigmoid at " << at;
  e = maxUlp([](float x) { return vm::erf(x); }, [](double x) { return std::erf(x); }, -inf, inf, &at);
  EXPECT_LE(e, 4.0) << "erf at " << at;
}

TEST(VecMath, ActivationAccuracy) {
  // gelu, gelu-tanh and silu against their formulas in double. torch's gelu formula
  // 0.5 x (1 + erf(x / sqrt 2)) cancels in 1 + erf for large negative x, so gelu also gets an
  // absolute allowance of a float ulp of erf times |x| there.
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.000731f) {
    const double xd = x;
    const double ge = 0.5 * xd * (1 + std::erf(xd / std::sqrt(2.0)));
    const double gt = 0.5 * xd * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd)));
    const double si = xd / (1 + std::exp(-xd));
    const double cancel = 1.2e-7 * std::abs(xd);
    const double r = std::max({std::abs(vm::geluErf(x) - ge) / (4e-7 * std::abs(ge) + cancel + 1e-45),
                               std::abs(vm::geluTanh(x) - gt) / (4e-7 * std::abs(gt) + cancel + 1e-45),
                               std::abs(vm::silu(x) - si) / (4e-7 * std::abs(si) + 1e-45)});
    if (r > worst) {
      worst = r;
      at = x;
    }
  }
  EXPECT_LE(worst, 1.0) << "at " << at;
}

TEST(VecMath, PowAccuracyAndSpecialValues) {
  // General exponents against double pow over a wide range of bases.
  float at = 0;
  for (float y : {2.5f, -1.7f, 0.3f, 11.0f, -3.0f, 1.0f / 3}) {
    double e = maxUlp([y](float x) { return vm::pow(x, y); }, [y](double x) { return std::pow(x, static_cast<double>(y)); },
                      -1e6f, 1e6f, &at, 1009);
    EXPECT_LE(e, 1.0) << "y = " << y << " at " << at;
  }
  // Every combination of special values agrees with std::pow.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, -0.5f, 3.0f, -3.0f, inf, -inf, nan,
                            1e-40f, 16777217.0f, -16777216.0f, 1e30f, 2.5f};
  for (float x : specials)
    for (float y : specials) {
      float want = std::pow(x, y), got = vm::pow(x, y);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << x << "^" << y;
      } else {
        EXPECT_LE(ulpError(got, std::pow(static_cast<double>(x), static_cast<double>(y))), 1.0) << x << "^" << y;
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << x << "^" << y;
      }
    }
}

TEST(VecMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(vm::exp(inf), inf);
  EXPECT_EQ(vm::exp(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(vm::exp(nan)));
  EXPECT_EQ(vm::exp(0.0f), 1.0f);
  EXPECT_GT(vm::exp(-100.0f), 0.0f);  // subnormal, not flushed
  EXPECT_EQ(vm::log(0.0f), -inf);
  EXPECT_EQ(vm::log(-0.0f), -inf);
  EXPECT_TRUE(std::isnan(vm::log(-1.0f)));
  EXPECT_EQ(vm::log(inf), inf);
  EXPECT_TRUE(std::isnan(vm::log(nan)));
  EXPECT_EQ(vm::log(1.0f), 0.0f);
  EXPECT_NEAR(vm::log(std::numeric_limits<float>::denorm_min()), std::log(1.401298464e-45), 1e-5);
  EXPECT_EQ(vm::tanh(inf), 1.0f);
  EXPECT_EQ(vm::tanh(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(vm::tanh(nan)));
  EXPECT_TRUE(std::signbit(vm::tanh(-0.0f)));
  EXPECT_EQ(vm::sigmoid(inf), 1.0f);
  EXPECT_EQ(vm::sigmoid(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(vm::sigmoid(nan)));
  EXPECT_EQ(vm::erf(inf), 1.0f);
  EXPECT_EQ(vm::erf(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(vm::erf(nan)));
  EXPECT_TRUE(std::signbit(vm::erf(-0.0f)));
  EXPECT_EQ(vm::erf(5.0f), 1.0f);
}
