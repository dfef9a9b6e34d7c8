/*
 * Vectorizable float math for elementwise kernels (internal to core/ops).
 *
 * Why: std::exp/std::log/std::tanh/std::erf on float are library calls the compiler cannot
 * vectorize, and a scalar call per element is far below memory bandwidth. These are plain inline
 * functions with no branches and no table lookups (range reduction, a polynomial, a bit-level
 * rescale, and selects for the special values), so inside mapKernel's contiguous loop GCC/Clang
 * turn them into AVX2/AVX-512 code. Accuracy (checked against double-precision std:: functions
 * in tests/core/ops/vec_math_test.cc): a few ulp over the whole float range, with IEEE special values
 * (inf, nan, +-0, subnormals) handled like the C library.
 *
 * The double overloads call the C library: float64 kernels are about accuracy, not the bandwidth
 * bar. Half and bfloat16 kernels compute in float, so they use the float versions.
 *
 * Polynomial sources: exp, log and tanh use the Cephes single-precision minimax coefficients;
 * erf on |x| < 0.921875 uses Cephes' erff polynomial, and above it erfc(x) = exp(q(x) - x^2)
 * with q a degree-8 Chebyshev fit of log(erfc(x)) + x^2 made for this file (numpy, 4000 nodes).
 * gelu and its derivative use fits of their own, described where they are defined.
 */
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

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

// ---- pow ---------------------------------------------------------------------------------------
// x^y in float arithmetic only, so 8 lanes vectorize (the previous version computed in double,
// whose int64 <-> double conversions AVX2 cannot vectorize: it ran one element at a time).
// Accuracy needs log2(x) to about 2^-32 relative (an error d in y log2 x is a relative error
// d ln2 in the result, and |y log2 x| reaches 150), so log2 is carried as a float pair hi + lo
// (error-free products via FMA, two-sums): x = 2^e m, m in [sqrt(1/2), sqrt(2)),
// s = (m-1)/(m+1) as a pair (one division), log m = 2s + (2/3)s^3 + s^5 P(s^2) with the first two
// terms in pairs, times 1/ln2 as a pair, plus e. Then w = y log2 x as a pair (y itself may be a
// pair: a double exponent keeps its low part), w = n + r with |r| <= 1/2, 2^r = e^{r ln2} by the
// Cephes expf polynomial, and 2^n applied in two factors (subnormal results). Max error 1.2 ulp
// (1.16 measured over every 97th float bit pattern for 13 exponents and 6.9e8 random (x, y) bit
// patterns; tests/core/ops/vec_math_test.cc bounds it at 1.25 ulp); IEEE pow special cases exactly
// like std::pow (all combinations of 0, -0, +-1, +-inf, NaN, subnormals, negative bases with
// integer and non-integer exponents are tested).

// e^g for |g| <= ln2/2 (a little beyond is fine): the polynomial of expCore.
COHORT_VM_INLINE float expPoly(float g) {
  const float g2 = g * g;
  float q = fmaF(1.9875691500E-4f, g, 1.3981999507E-3f);
  q = fmaF(q, g, 8.3334519073E-3f);
  q = fmaF(q, g, 4.1665795894E-2f);
  q = fmaF(q, g, 1.6666665459E-1f);
  q = fmaF(q, g, 5.0000001201E-1f);
  return fmaF(q, g2, g) + 1.0f;
}

// |x|^y for finite nonzero ax = |x| and |yh + yl| <= 2^34; other inputs give garbage that
// powSpecial selects away. Callers clamp |y| to 2^34: from there on every x != 1 is at least
// 2^-24 away from 1, |y log2 x| > 1400 and the result is 0 or inf either way.
COHORT_VM_INLINE float powMagnitude(float ax, float yh, float yl) {
  const bool sub = ax < 1.17549435e-38f;  // subnormal: scale up by 2^23 first
  const float xs = select(sub, ax * 8388608.0f, ax);
  uint32_t u = bitsOf(xs) + (0x3f800000u - 0x3f3504f3u);
  const float e = static_cast<float>(static_cast<int32_t>(u >> 23) - 127 - 23 * static_cast<int32_t>(sub));
  u = (u & 0x007fffffu) + 0x3f3504f3u;
  const float m = floatOf(u);
  const float f = m - 1.0f;  // exact
  const float th = m + 1.0f;
  const float tl = m - (th - 1.0f);  // m + 1 = th + tl exactly
  const float inv = 1.0f / th;
  const float sh = f * inv;
  float r = fmaF(-sh, th, f);  // f - sh th, exact
  r = fmaF(-sh, tl, r);
  const float sl = r * inv;  // s = sh + sl
  // log m = 2s + (2/3) s^3 + s^5 (2/5 + 2/7 s^2 + 2/9 s^4 + 2/11 s^6); s^2 <= 0.0295.
  const float s2h = sh * sh;
  const float s2l = fmaF(sh, sh, -s2h);
  const float s3h = s2h * sh;
  const float s3l = fmaF(s2h, sh, -s3h) + fmaF(s2l, sh, 3.0f * s2h * sl);
  constexpr float kC3h = 0.666666686534881591796875f;  // float(2/3)
  constexpr float kC3l = -1.9868215517249297e-08f;     // 2/3 - kC3h
  const float t3h = kC3h * s3h;
  const float t3l = fmaF(kC3h, s3h, -t3h) + fmaF(kC3h, s3l, kC3l * s3h);
  float p = fmaF(0.181818181818f, s2h, 0.2222222222f);
  p = fmaF(p, s2h, 0.285714285714f);
  p = fmaF(p, s2h, 0.4f);
  const float tail = p * s2h * s2h * sh;
  const float a = 2.0f * sh;
  const float lh = a + t3h;  // |a| >= |t3h|: fast two-sum
  const float ll = (t3h - (lh - a)) + (t3l + (2.0f * sl + tail));
  // log2 x = e + (lh + ll) / ln2
  constexpr float kIlnh = 1.44269502162933349609375f;  // float(1/ln2)
  constexpr float kIlnl = 1.925963033500011079e-08f;   // 1/ln2 - kIlnh
  const float ph = lh * kIlnh;
  const float pl = fmaF(lh, kIlnh, -ph) + fmaF(lh, kIlnl, ll * kIlnh);
  const float l2h = e + ph;  // two-sum (either may be larger)
  const float bb = l2h - e;
  const float l2l = ((e - (l2h - bb)) + (ph - bb)) + pl;
  // w = y log2 x
  float wh = yh * l2h;
  float wl = fmaF(yh, l2h, -wh) + fmaF(yh, l2l, yl * l2h);
  const bool big = !(std::fabs(wh) <= 160.0f);  // the result is 0 or inf from |w| > 150 on
  wh = select(wh > 160.0f, 160.0f, wh);
  wh = select(wh < -160.0f, -160.0f, wh);
  wl = select(big, 0.0f, wl);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float tn = wh + kMagic;
  const float n = tn - kMagic;
  const int32_t ni = static_cast<int32_t>(bitsOf(tn) - bitsOf(kMagic));
  const float rr = (wh - n) + wl;
  const float g = fmaF(rr, 0.693145751953125f, rr * 1.428606765330187045e-06f);  // rr ln2, ln2 as a pair
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  return expPoly(g) * floatOf(static_cast<uint32_t>(n1 + 127) << 23) * floatOf(static_cast<uint32_t>(n2 + 127) << 23);
}

// The IEEE pow special cases (as std::pow) around mag = |x|^y for finite nonzero x.
COHORT_VM_INLINE float powSpecial(float x, float y, float mag, bool yInt, bool yOdd) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float ax = std::fabs(x), ay = std::fabs(y);
  // Non-short-circuit & and |: a branch here would stop vectorization.
  float r = mag;
  r = select(ax == 0.0f, select(y < 0.0f, kInf, 0.0f), r);
  r = select(ax == kInf, select(y < 0.0f, 0.0f, kInf), r);
  r = select(ay == kInf, select((ax > 1.0f) == (y > 0.0f), kInf, 0.0f), r);
  r = select(std::signbit(x) & yOdd, -r, r);
  r = select((x < 0.0f) & (x > -kInf) & !yInt, kNaN, r);
  r = select((x != x) | (y != y), kNaN, r);
  r = select((x == -1.0f) & (ay == kInf), 1.0f, r);
  r = select((x == 1.0f) | (y == 0.0f), 1.0f, r);
  return r;
}

// A constant exponent prepared once per kernel (pow(tensor, scalar)): the double exponent is
// kept as a float pair, so x^1.7 does not become x^1.7f.
struct PowExponent {
  float y = 0, yh = 0, yl = 0;  // y: the float value, for the special cases only
  bool yInt = false, yOdd = false;
  explicit PowExponent(double yd) {
    const double ay = std::fabs(yd);
    y = static_cast<float>(yd);
    if (y == 0.0f && yd != 0.0) y = std::copysign(1e-45f, static_cast<float>(yd));  // not the y == 0 case
    if (std::isinf(y) && !std::isinf(yd)) y = std::copysign(3.4028235e38f, static_cast<float>(yd));
    yInt = std::trunc(yd) == yd;  // true for +-inf too
    yOdd = yInt && ay < 9007199254740992.0 && (static_cast<int64_t>(yd) & 1) != 0;
    const double yc = ay > 17179869184.0 ? std::copysign(17179869184.0, yd) : yd;
    yh = static_cast<float>(yc);
    yl = std::isfinite(yc) ? static_cast<float>(yc - static_cast<double>(yh)) : 0.0f;
  }
};

COHORT_VM_INLINE float pow(float x, const PowExponent& p) {
  return powSpecial(x, p.y, powMagnitude(std::fabs(x), p.yh, p.yl), p.yInt, p.yOdd);
}

COHORT_VM_INLINE float pow(float x, float y) {
  const float ay = std::fabs(y);
  // Integer and odd tests through an int32 conversion of y clamped below 2^24 (floats from 2^24
  // on, and +-inf, are even integers). Float compares only: GCC vectorizes neither truncf here
  // nor a bool mixing an int compare with a float compare.
  const bool small = ay < 16777216.0f;
  const float yr = select(small, y, 0.0f);
  const int32_t yi = static_cast<int32_t>(yr);
  const bool yInt = (static_cast<float>(yi) == yr) | !small;
  const bool yOdd = (static_cast<float>(yi) == y) & (static_cast<float>(yi & 1) != 0.0f);
  const float yc = select(ay > 17179869184.0f, std::copysign(17179869184.0f, y), y);
  return powSpecial(x, y, powMagnitude(std::fabs(x), yc, 0.0f), yInt, yOdd);
}
COHORT_VM_INLINE float pow(float x, double y) { return pow(x, PowExponent(y)); }

COHORT_VM_INLINE float rsqrt(float x) { return 1.0f / std::sqrt(x); }

// Activations on top of the primitives, in torch's formulas.
COHORT_VM_INLINE float silu(float x) { return x * sigmoid(x); }
// gelu(x) = x Phi(x) with Phi(x) = erfc(-x/sqrt2) / 2, computed through erfc of |x| so the
// negative tail keeps its relative accuracy (torch's 0.5 x (1 + erf(x/sqrt2)) cancels there:
// gelu(-5) would be 4% off, and 0 from x = -5.54 on). For x >= 0 it is x (1 - erfc(x/sqrt2)/2), no cancellation.
// erfc(|x|/sqrt2)/2 = t e^{-x^2/2 + P(t)}, t = 1/(1 + 0.32|x|), P a degree-9 polynomial in t - 1/2
// (weighted least-squares fit of log(erfcx(|x|/sqrt2)/(2t)) on |x| in [0, 14.5], max fit error 1.2e-8,
// made for this file with numpy/scipy), evaluated by Estrin's scheme (shorter dependency chain);
// x^2 is split in hi + lo so the exponent keeps full precision. Max error 6.8 ulp over normal
// results (measured on a 1e-5 grid over [-13.1, 16]; tests/core/ops/vec_math_test.cc bounds it at 8).
// Results below FLT_MIN (x < -13.1) are flushed to -0; +inf -> inf, -inf -> NaN, as torch.
// e^{-a^2/2 + extra} for 0 <= a <= 13.1 and a small `extra`, as p * 2^n with p = e^r, |r| <= ln2/2:
// Cody-Waite reduction on the high part of -a^2/2 (a^2 split in hi + lo so the exponent keeps full
// precision), then the low part and `extra` are added to r. The scale 2^n (n >= -126: one normal
// float) is left to the caller, which applies it last so no intermediate goes subnormal.
COHORT_VM_INLINE float expNegHalfSquare(float a, float extra, int32_t& ni) {
  const float x2h = a * a;
  const float ah = -0.5f * x2h;
  const float al = fmaF(-0.5f, fmaF(a, a, -x2h), extra);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float tn = fmaF(ah + al, 1.44269504088896341f, kMagic);
  const float n = tn - kMagic;
  ni = static_cast<int32_t>(bitsOf(tn) - bitsOf(kMagic));
  float r = fmaF(n, -0.693359375f, ah);
  r = r + al;
  r = fmaF(n, 2.12194440e-4f, r);
  // The expCore polynomial by Estrin's scheme.
  const float r2 = r * r;
  const float q45 = fmaF(1.6666665459E-1f, r, 5.0000001201E-1f);
  const float q23 = fmaF(8.3334519073E-3f, r, 4.1665795894E-2f);
  const float q01 = fmaF(1.9875691500E-4f, r, 1.3981999507E-3f);
  const float q = fmaF(fmaF(q01, r2, q23), r2, q45);
  return fmaF(q, r2, r) + 1.0f;
}

// The variable of gelu's fits: |x| clamped to 13.1 (NaN passes), t = 1/(1 + 0.32|x|), u = t - 1/2.
struct GeluArg {
  float a, t, u;
};
COHORT_VM_INLINE GeluArg geluArg(float x) {
  const float ax = std::fabs(x);
  const float a = select(ax > 13.1f, 13.1f, ax);
  const float t = 1.0f / fmaF(0.32f, a, 1.0f);
  return {a, t, t - 0.5f};
}

// c[0] + c[1] u + ... + c[9] u^9 by Estrin's scheme (a shorter dependency chain than Horner's).
COHORT_VM_INLINE float estrin9(float u, const float (&c)[10]) {
  const float u2 = u * u;
  const float u4 = u2 * u2;
  const float p03 = fmaF(fmaF(c[3], u, c[2]), u2, fmaF(c[1], u, c[0]));
  const float p47 = fmaF(fmaF(c[7], u, c[6]), u2, fmaF(c[5], u, c[4]));
  return fmaF(fmaF(c[9], u, c[8]), u4 * u4, fmaF(p47, u4, p03));
}

COHORT_VM_INLINE float geluErf(float x) {
  const float ax = std::fabs(x);
  static constexpr float kP[10] = {-1.449425177e+00f, 1.431482666e+00f, 3.533550949e-01f, -2.985539554e-01f,
                                   -2.881804856e-01f, 1.634086061e-01f, 2.626377428e-01f, -1.565846454e-01f,
                                   -2.083416692e-01f, 1.819250091e-01f};
  const auto [a, t, u] = geluArg(x);
  int32_t ni;
  const float pe = expNegHalfSquare(a, estrin9(u, kP), ni);
  // n >= -126 while |x| <= 13.1, so 2^n is one normal float; beyond, s = 0 flushes the tail.
  const float s = select(ax > 13.1f, 0.0f, floatOf(static_cast<uint32_t>(ni + 127) << 23));
  const float m = t * pe;  // erfc(|x|/sqrt2) / 2 = m s; x is applied before s (no subnormal m)
  return select(x < 0.0f, (x * m) * s, x * (1.0f - m * s));
}
// gelu'(x) = Phi(x) + x phi(x), phi(x) = E / sqrt(2 pi) with E = e^{-x^2/2}, from one exponential:
// erfc(|x|/sqrt2) / 2 = t E R(t), t = 1/(1 + 0.32|x|) as in geluErf, and R a degree-9 polynomial in
// t - 1/2 (relative least-squares fit of erfcx(|x|/sqrt2) / (2t) on |x| in [0, 13.1], max fit error
// 1.2e-8, made for this file with numpy/mpmath). Then for x < 0 the derivative is E (tR + x/sqrt(2 pi))
// and for x >= 0 it is 1 - E (tR - x/sqrt(2 pi)): E is applied last, so the negative tail keeps its
// relative accuracy down to E's underflow. Beyond |x| = 13.1, E is 0; x = +-inf gives NaN, as torch.
COHORT_VM_INLINE float geluErfGradFloat(float g, float x) {
  const float ax = std::fabs(x);
  static constexpr float kR[10] = {2.3470516503e-01f,  3.3597639203e-01f,  3.2340753078e-01f,  1.6339054704e-01f,
                                   -2.7317877859e-02f, -8.1749677658e-02f, -6.2194286147e-04f, 4.4465817511e-02f,
                                   -3.7954838481e-03f, -1.5287384390e-02f};
  const auto [a, t, u] = geluArg(x);
  const float R = estrin9(u, kR);
  int32_t ni;
  const float pe = expNegHalfSquare(a, 0.0f, ni);
  const float s = select(ax > 13.1f, 0.0f, floatOf(static_cast<uint32_t>(ni + 127) << 23));
  const float e = pe * s;  // E
  const float k = t * R;   // erfc(|x|/sqrt2) / (2E)
  const float xphi = x * 0.39894228040143267794f;
  return g * select(x < 0.0f, (k + xphi) * e, fmaF(-(k - xphi), e, 1.0f));
}
// 0.5 x (1 + tanh(u)) = x / (1 + e^{-2u}) exactly: one exp and a division instead of tanh's two
// branches, and no cancellation in 1 + tanh(u) for negative x. x = -inf gives NaN, as torch.
COHORT_VM_INLINE float geluTanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return x / (1.0f + exp(-2.0f * inner));
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

// Backward formulas of the activations (the upstream gradient g times the derivative at x), in
// torch's formulas; one definition for the portable kernels and the AVX-512 loops, so the two give
// the same bits. Templates over float and double, after both types' exp, erf, tanh and sigmoid (a
// template's unqualified calls see only what is declared before it).
template <typename A>
COHORT_VM_INLINE A geluErfGrad(A g, A x) {
  if constexpr (std::is_same_v<A, float>) {
    return geluErfGradFloat(g, x);
  } else {
    const A cdf = A(0.5) * (A(1) + erf(x * A(0.70710678118654752440)));
    const A pdf = exp(A(-0.5) * x * x) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
    return g * (cdf + x * pdf);
  }
}
template <typename A>
COHORT_VM_INLINE A geluTanhGrad(A g, A x) {
  const A kBeta = A(0.79788456080286535588), kKappa = A(0.044715);
  const A x2 = x * x;
  const A t = tanh(kBeta * (x + kKappa * x2 * x));
  const A left = A(0.5) * x;
  const A right = A(1) + t;
  const A dRight = left * (A(1) - t * t) * kBeta * (A(1) + A(3) * kKappa * x2);
  return g * (A(0.5) * right + dRight);
}
template <typename A>
COHORT_VM_INLINE A siluGrad(A g, A x) {
  const A s = sigmoid(x);
  return g * s * (A(1) + x * (A(1) - s));
}

#undef COHORT_VM_INLINE

}  // namespace cohort::vecmath
