/*
 * Vectorizable float math for elementwise kernels (internal to core/ops).
 *
 * Why: std::exp/std::log/std::tanh/std::erf on float are library calls the compiler cannot
 * vectorize, and a scalar call per element is far below memory bandwidth. These are plain inline
 * functions with no branches and no table lookups (range reduction, a polynomial, a bit-level
 * rescale, and selects for the special values), so inside mapKernel's contiguous loop GCC/Clang
 * turn them into AVX2/AVX-512 code. Accuracy (checked against double-precision std:: functions
 * in tests/core/vec_math_test.cc): a few ulp over the whole float range, with IEEE special values
 * (inf, nan, +-0, subnormals) handled like the C library.
 *
 * The double overloads call the C library: float64 kernels are about accuracy, not the bandwidth
 * bar. Half and bfloat16 kernels compute in float, so they use the float versions.
 *
 * Polynomial sources: exp, log and tanh use the Cephes single-precision minimax coefficients;
 * erf on |x| < 0.921875 uses Cephes' erff polynomial, and above it erfc(x) = exp(q(x) - x^2)
 * with q a degree-8 Chebyshev fit of log(erfc(x)) + x^2 made for this file (numpy, 4000 nodes).
 */
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace cohort::vecmath {

// Forced inlining: a call left in the elementwise loop would stop its vectorization, and GCC's
// size heuristics decline to inline erf/pow into the larger kernel bodies on their own.
#define COHORT_VM_INLINE inline __attribute__((always_inline))

COHORT_VM_INLINE float fmaF(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

COHORT_VM_INLINE uint32_t bitsOf(float x) { return std::bit_cast<uint32_t>(x); }
COHORT_VM_INLINE float floatOf(uint32_t u) { return std::bit_cast<float>(u); }

// c ? a : b as a bit blend. GCC does not if-convert a plain `?:` whose arms were computed with
// floating-point operations that may trap (-ftrapping-math is the default) once it has sunk the
// computation into the branch; a blend keeps the loop branch-free and vectorizable.
COHORT_VM_INLINE float select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return floatOf((bitsOf(a) & m) | (bitsOf(b) & ~m));
}
COHORT_VM_INLINE double select(bool c, double a, double b) {
  const uint64_t m = 0ull - static_cast<uint64_t>(c);
  return std::bit_cast<double>((std::bit_cast<uint64_t>(a) & m) | (std::bit_cast<uint64_t>(b) & ~m));
}

// e^x for x in [-87.3, 88.3] (2^n stays a normal float); other inputs give garbage, which the
// callers select away. NaN propagates. Max error about 1 ulp.
COHORT_VM_INLINE float expCore(float x, float& p, int32_t& ni) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = fmaF(x, 1.44269504088896341f, kMagic);
  const float n = t - kMagic;
  ni = static_cast<int32_t>(bitsOf(t) - bitsOf(kMagic));  // n as an integer, no float->int conversion
  float r = fmaF(n, -0.693359375f, x);
  r = fmaF(n, 2.12194440e-4f, r);
  const float r2 = r * r;
  float q = fmaF(1.9875691500E-4f, r, 1.3981999507E-3f);
  q = fmaF(q, r, 8.3334519073E-3f);
  q = fmaF(q, r, 4.1665795894E-2f);
  q = fmaF(q, r, 1.6666665459E-1f);
  q = fmaF(q, r, 5.0000001201E-1f);
  p = fmaF(q, r2, r) + 1.0f;  // e^r, |r| <= ln2/2
  return n;
}
COHORT_VM_INLINE float expInRange(float x) {
  float p;
  int32_t ni;
  expCore(x, p, ni);
  return p * floatOf(static_cast<uint32_t>(ni + 127) << 23);
}

// e^x. Max error about 1 ulp; overflows to inf above 88.72, flushes to 0 below -103.97,
// subnormal results are produced (two-step scaling).
COHORT_VM_INLINE float exp(float x) {
  float xc = select(x < -104.0f, -104.0f, x);
  xc = select(xc > 89.0f, 89.0f, xc);  // NaN passes both selects unchanged
  float p;
  int32_t ni;  // [-150, 128]
  expCore(xc, p, ni);
  // 2^n split in two factors so both stay normal floats.
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = floatOf(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = floatOf(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

// Natural log. Max error about 1 ulp; log(0) = -inf, log(x<0) = nan, log(inf) = inf.
COHORT_VM_INLINE float log(float x) {
  const bool sub = x < 1.17549435e-38f;  // subnormal (or <= 0): scale up first
  const float xs = select(sub, x * 8388608.0f, x);
  const int32_t eadj = -23 * static_cast<int32_t>(sub);
  // Normalise the mantissa into [sqrt(1/2), sqrt(2)) so log(m) is small and symmetric.
  uint32_t u = bitsOf(xs) + (0x3f800000u - 0x3f3504f3u);
  const int32_t e = static_cast<int32_t>(u >> 23) - 127 + eadj;
  u = (u & 0x007fffffu) + 0x3f3504f3u;
  const float f = floatOf(u) - 1.0f;
  const float ef = static_cast<float>(e);
  const float z = f * f;
  float p = fmaF(7.0376836292E-2f, f, -1.1514610310E-1f);
  p = fmaF(p, f, 1.1676998740E-1f);
  p = fmaF(p, f, -1.2420140846E-1f);
  p = fmaF(p, f, 1.4249322787E-1f);
  p = fmaF(p, f, -1.6668057665E-1f);
  p = fmaF(p, f, 2.0000714765E-1f);
  p = fmaF(p, f, -2.4999993993E-1f);
  p = fmaF(p, f, 3.3333331174E-1f);
  float y = p * f * z;
  y = fmaF(ef, -2.12194440e-4f, y);
  y = fmaF(z, -0.5f, y);
  float r = f + y;
  r = fmaF(ef, 0.693359375f, r);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  r = select(x == 0.0f, -kInf, r);
  r = select(x < 0.0f, std::numeric_limits<float>::quiet_NaN(), r);
  r = select(x == kInf, kInf, r);
  return select(x != x, x, r);
}

COHORT_VM_INLINE float tanh(float x) {
  // Computed on |x| and signed at the end (tanh is odd), which also keeps tanh(-0) = -0.
  const float a = std::fabs(x);
  // |x| < 0.625: odd polynomial (Cephes tanhf).
  const float z = a * a;
  float p = fmaF(-5.70498872745E-3f, z, 2.06390887954E-2f);
  p = fmaF(p, z, -5.37397155531E-2f);
  p = fmaF(p, z, 1.33314422036E-1f);
  p = fmaF(p, z, -3.33332819422E-1f);
  const float small = fmaF(p * z, a, a);
  // Otherwise 1 - 2/(e^{2|x|} + 1). From |x| = 9.1 on that rounds to 1, so clamping there
  // keeps e^{2|x|} in range.
  const float ac = select(a > 9.1f, 9.1f, a);
  const float large = 1.0f - 2.0f / (expInRange(2.0f * ac) + 1.0f);
  return std::copysign(select(a < 0.625f, small, large), x);
}

// 1 / (1 + e^-x), written so neither side overflows: for x < 0 it is e^x / (1 + e^x).
COHORT_VM_INLINE float sigmoid(float x) {
  const float e = exp(-std::fabs(x));
  const float inv = 1.0f / (1.0f + e);
  return select(x >= 0.0f, inv, e * inv);  // NaN takes the second branch: e is NaN
}

COHORT_VM_INLINE float erf(float x) {
  const float a = std::fabs(x);
  // |x| < 0.921875: x * P(x^2) (Cephes erff).
  const float z = x * x;
  float p = fmaF(7.853861353153693E-5f, z, -8.010193625184903E-4f);
  p = fmaF(p, z, 5.188327685732524E-3f);
  p = fmaF(p, z, -2.685381193529856E-2f);
  p = fmaF(p, z, 1.128358514861418E-1f);
  p = fmaF(p, z, -3.761262582423300E-1f);
  p = fmaF(p, z, 1.128379165726710E0f);
  const float small = x * p;
  // Otherwise 1 - erfc(|x|), erfc(a) = exp(q(a) - a^2), with a^2 split in hi + lo so the
  // exponent keeps full precision.
  const float u = a - 2.4234375f;  // beyond 3.925 the result is selected away below
  float q = fmaF(1.635555236e-06f, u, -1.428355699e-05f);
  q = fmaF(q, u, 8.470356261e-05f);
  q = fmaF(q, u, -4.574281920e-04f);
  q = fmaF(q, u, 2.333127428e-03f);
  q = fmaF(q, u, -1.154688559e-02f);
  q = fmaF(q, u, 5.867845938e-02f);
  q = fmaF(q, u, -3.614668846e-01f);
  q = fmaF(q, u, -1.529479384e+00f);
  const float hi = a * a;
  const float lo = fmaF(a, a, -hi);
  const float erfc = expInRange((q - hi) - lo);
  float large = 1.0f - erfc;
  large = select(a >= 3.925f, 1.0f, large);  // erf rounds to 1 in float from here (and for inf)
  large = std::copysign(large, x);
  return select(a < 0.921875f, small, large);  // NaN: `small` is x * p = NaN
}

// x^y with IEEE pow semantics (like std::pow), computed through double-precision log2/exp2
// polynomials so the float result is correctly rounded in all but rare cases; no library call.
// The exponent is taken in double: x^1.7 must not become x^1.7f (a relative error of
// 5e-8 * |log x|, 2e-6 at x = 1e-20).
COHORT_VM_INLINE float pow(float x, double y) {
  const double ax = std::fabs(static_cast<double>(x));
  // log2(ax) = e + log2(m), m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m-1)/(m+1).
  const uint64_t bits = std::bit_cast<uint64_t>(ax);
  uint64_t ub = bits + (0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull);
  const int64_t e = static_cast<int64_t>(ub >> 52) - 1023;
  ub = (ub & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull;
  const double m = std::bit_cast<double>(ub);
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;  // <= 0.0295: the atanh series converges fast
  double t = 1.0 / 19;
  t = t * s2 + 1.0 / 17;
  t = t * s2 + 1.0 / 15;
  t = t * s2 + 1.0 / 13;
  t = t * s2 + 1.0 / 11;
  t = t * s2 + 1.0 / 9;
  t = t * s2 + 1.0 / 7;
  t = t * s2 + 1.0 / 5;
  t = t * s2 + 1.0 / 3;
  t = t * s2 + 1.0;
  const double log2m = 2.0 * s * t * 1.4426950408889634074;
  double l2 = static_cast<double>(e) + log2m;  // ax is a float widened, so never subnormal here
  constexpr double kInfD = std::numeric_limits<double>::infinity();
  l2 = select(ax == 0.0, -kInfD, l2);
  l2 = select(ax == kInfD, kInfD, l2);
  double w = y * l2;
  w = select(w < -400.0, -400.0, w);  // also maps -inf; float results vanish long before
  w = select(w > 400.0, 400.0, w);
  // 2^w = 2^n * 2^f, |f| <= 1/2, 2^f = e^{f ln 2} by its Taylor series (error < 1e-15).
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double tn = w + kMagic;
  const double n = tn - kMagic;
  const int64_t ni = static_cast<int64_t>(std::bit_cast<uint64_t>(tn) - std::bit_cast<uint64_t>(kMagic));
  const double g = (w - n) * 0.69314718055994530942;
  double p = 1.0 / 479001600;
  p = p * g + 1.0 / 39916800;
  p = p * g + 1.0 / 3628800;
  p = p * g + 1.0 / 362880;
  p = p * g + 1.0 / 40320;
  p = p * g + 1.0 / 5040;
  p = p * g + 1.0 / 720;
  p = p * g + 1.0 / 120;
  p = p * g + 1.0 / 24;
  p = p * g + 1.0 / 6;
  p = p * g + 0.5;
  p = p * g + 1.0;
  p = p * g + 1.0;
  const double scale = std::bit_cast<double>(static_cast<uint64_t>(ni + 1023) << 52);
  float r = static_cast<float>(p * scale);
  // Sign and the special cases of IEEE pow.
  const double ay = std::fabs(y);
  const bool yInt = std::trunc(y) == y;  // true for +-inf too
  // Non-short-circuit & and |: a branch here would stop vectorization. Doubles from 2^53 on are
  // even integers.
  const bool yOdd = yInt & (ay < 9007199254740992.0) &
                    ((static_cast<int64_t>(select(ay < 9007199254740992.0, y, 0.0)) & 1) != 0);
  const bool neg = std::signbit(x) & yOdd;
  r = select(neg, -r, r);
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  r = select((x < 0.0f) & (x > -std::numeric_limits<float>::infinity()) & !yInt, kNaN, r);
  r = select((x != x) | (y != y), kNaN, r);
  r = select((x == -1.0f) & (ay == std::numeric_limits<double>::infinity()), 1.0f, r);
  r = select((x == 1.0f) | (y == 0.0), 1.0f, r);
  return r;
}
COHORT_VM_INLINE float pow(float x, float y) { return pow(x, static_cast<double>(y)); }

COHORT_VM_INLINE float rsqrt(float x) { return 1.0f / std::sqrt(x); }

// Activations on top of the primitives, in torch's formulas.
COHORT_VM_INLINE float silu(float x) { return x * sigmoid(x); }
COHORT_VM_INLINE float geluErf(float x) { return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)); }
COHORT_VM_INLINE float geluTanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanh(inner));
}

// ---- double: the C library -------------------------------------------------------------------
COHORT_VM_INLINE double exp(double x) { return std::exp(x); }
COHORT_VM_INLINE double log(double x) { return std::log(x); }
COHORT_VM_INLINE double tanh(double x) { return std::tanh(x); }
COHORT_VM_INLINE double erf(double x) { return std::erf(x); }
COHORT_VM_INLINE double pow(double x, double y) { return std::pow(x, y); }
COHORT_VM_INLINE double rsqrt(double x) { return 1.0 / std::sqrt(x); }
COHORT_VM_INLINE double sigmoid(double x) {
  const double e = std::exp(-std::fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
COHORT_VM_INLINE double silu(double x) { return x * sigmoid(x); }
COHORT_VM_INLINE double geluErf(double x) { return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)); }
COHORT_VM_INLINE double geluTanh(double x) {
  const double inner = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(inner));
}

#undef COHORT_VM_INLINE

}  // namespace cohort::vecmath
