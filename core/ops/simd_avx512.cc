// The AVX-512 loops of core/ops/detail/simd.h. This file alone is compiled with -march=x86-64-v4
// (core/CMakeLists.txt); without that flag it compiles to no kernels and simd.cc never calls in.
//
// Keep it to plain loops over float pointers calling the always-inline vecmath functions, and
// intrinsics: any inline function emitted out of line here (a std:: template, a constructor)
// would be AVX-512 code that the linker may pick for the rest of the library too, which must run
// on AVX2 CPUs; and no dynamic initialisation (the tables below are constants).
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <cohort/core/ops/detail/vec_math.h>

namespace cohort::detail::simd::avx512 {

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512BW__)

bool built() { return true; }

#define COHORT_SIMD_LOOP(name, expr)                                        \
  void name(float* __restrict out, const float* __restrict in, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) {                                       \
      const float x = in[i];                                                \
      out[i] = expr;                                                        \
    }                                                                       \
  }

COHORT_SIMD_LOOP(exp, vecmath::exp(x))
COHORT_SIMD_LOOP(log, vecmath::log(x))
COHORT_SIMD_LOOP(tanh, vecmath::tanh(x))
COHORT_SIMD_LOOP(sigmoid, vecmath::sigmoid(x))
COHORT_SIMD_LOOP(silu, vecmath::silu(x))
COHORT_SIMD_LOOP(geluErf, vecmath::geluErf(x))
COHORT_SIMD_LOOP(geluTanh, vecmath::geluTanh(x))
#undef COHORT_SIMD_LOOP

#define COHORT_SIMD_GRAD_LOOP(name, fn)                                                                \
  void name(float* __restrict out, const float* __restrict g, const float* __restrict in, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) out[i] = vecmath::fn(g[i], in[i]);                                 \
  }

COHORT_SIMD_GRAD_LOOP(geluErfGrad, geluErfGrad<float>)
COHORT_SIMD_GRAD_LOOP(geluTanhGrad, geluTanhGrad<float>)
COHORT_SIMD_GRAD_LOOP(siluGrad, siluGrad<float>)
#undef COHORT_SIMD_GRAD_LOOP

// pow is not the vecmath float-pair algorithm here but a table-driven one in double lanes: the
// magnitude |x|^y is computed in double (log2 from a 16-entry table and a degree-8 polynomial,
// 2^w by a degree-9 polynomial and scalef) and rounded once to float, which makes it faster
// (~1.5 against ~1.8 ns per element per core) and more accurate (0.5001 ulp against 1.2, measured
// against std::pow in double over random bit patterns). IEEE's special cases are applied to the
// float lanes exactly as vecmath::powSpecial does; tests/core/ops/simd_test.cc checks both claims.
// So on AVX-512 CPUs pow's results may differ from the AVX2 kernel's in the last bit.
// |x|^y for 8 doubles: x > 0 finite (anything else is garbage that the special cases replace).
// 1/c and log2(c) for the 16 mantissa intervals of [1, 2) (centres 1 + (i + 1/2)/16; interval 0
// uses c = 1 exactly, so log2(1) comes out 0 and (+-1)^y exact).
alignas(64) static const double kInv[16] = {1.0,
                                            0.9142857142857143,
                                            0.8648648648648649,
                                            0.8205128205128205,
                                            0.7804878048780488,
                                            0.7441860465116279,
                                            0.7111111111111111,
                                            0.6808510638297872,
                                            0.6530612244897959,
                                            0.6274509803921569,
                                            0.6037735849056604,
                                            0.5818181818181818,
                                            0.5614035087719298,
                                            0.5423728813559322,
                                            0.5245901639344263,
                                            0.5079365079365079};
alignas(64) static const double kLog[16] = {0.0,
                                            0.1292830169449665,
                                            0.2094533656289497,
                                            0.28540221886224837,
                                            0.3575520046180836,
                                            0.42626475470209796,
                                            0.49185309632967467,
                                            0.5545888516776374,
                                            0.6147098441152083,
                                            0.6724253419714956,
                                            0.7279204545631992,
                                            0.7813597135246597,
                                            0.8328900141647417,
                                            0.8826430493618412,
                                            0.9307373375628862,
                                            0.9772799234999165};
static inline __m512d powMag8(__m512d x, __m512d y) {
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d e = _mm512_getexp_pd(x);
  const __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);  // [1, 2)
  const __m512i idx = _mm512_srli_epi64(_mm512_castpd_si512(m), 48);              // top 4 mantissa bits
  const __m512d inv = _mm512_permutex2var_pd(_mm512_load_pd(kInv), idx, _mm512_load_pd(kInv + 8));
  const __m512d lc = _mm512_permutex2var_pd(_mm512_load_pd(kLog), idx, _mm512_load_pd(kLog + 8));
  const __m512d r = _mm512_fmsub_pd(m, inv, one);  // |r| <= 1/31
  // log2(1 + r), degree 8
  __m512d p = _mm512_set1_pd(-0.18033688011112042);
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.2060992915555662));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(-0.2404491734814939));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.2885390081777927));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(-0.36067376022224085));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.4808983469629878));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(-0.7213475204444817));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.4426950408889634));
  const __m512d l2 = _mm512_fmadd_pd(p, r, _mm512_add_pd(e, lc));
  __m512d w = _mm512_mul_pd(y, l2);
  w = _mm512_min_pd(_mm512_max_pd(w, _mm512_set1_pd(-160.0)), _mm512_set1_pd(160.0));
  const __m512d n = _mm512_roundscale_pd(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512d f = _mm512_sub_pd(w, n);
  __m512d q = _mm512_set1_pd(1.0178086009239699e-07);
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(1.3215486790144309e-06));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(1.5252733804059841e-05));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(1.5403530393381609e-04));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(1.3333558146428443e-03));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(9.6181291076284772e-03));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(5.5504108664821580e-02));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(2.4022650695910071e-01));
  q = _mm512_fmadd_pd(q, f, _mm512_set1_pd(6.9314718055994531e-01));
  q = _mm512_fmadd_pd(q, f, one);
  return _mm512_scalef_pd(q, n);
}

// 16 results: the magnitude in double, rounded once to float, then IEEE pow's special cases
// exactly as vecmath::powSpecial. yInt / yOdd: lanes whose exponent is an integer / an odd one.
static inline __m512 pow16(__m512 x, __m512 yf, __m512d ylo, __m512d yhi, __mmask16 yInt, __mmask16 yOdd) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512d mlo = powMag8(_mm512_cvtps_pd(_mm512_castps512_ps256(ax)), ylo);
  const __m512d mhi = powMag8(_mm512_cvtps_pd(_mm512_extractf32x8_ps(ax, 1)), yhi);
  __m512 r = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(mlo)), _mm512_cvtpd_ps(mhi), 1);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  // The common case, decided for all 16 lanes at once: every x positive and finite, every y
  // finite. Then no special case applies (x == 1 and y == 0 already give exactly 1 above: log2 1
  // is 0 and 2^0 is 1), and the selects below can be skipped.
  const __mmask16 plain =
      _kand_mask16(_kand_mask16(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), _mm512_cmp_ps_mask(x, inf, _CMP_LT_OQ)),
                   _mm512_cmp_ps_mask(_mm512_abs_ps(yf), inf, _CMP_LT_OQ));
  if (plain == 0xffff) return r;
  const __m512 ay = _mm512_abs_ps(yf);
  const __mmask16 yNeg = _mm512_cmp_ps_mask(yf, zero, _CMP_LT_OQ);
  const __mmask16 yPos = _mm512_cmp_ps_mask(yf, zero, _CMP_GT_OQ);
  // ax == 0: y < 0 ? inf : 0
  const __mmask16 ax0 = _mm512_cmp_ps_mask(ax, zero, _CMP_EQ_OQ);
  r = _mm512_mask_blend_ps(ax0, r, _mm512_mask_blend_ps(yNeg, zero, inf));
  // ax == inf: y < 0 ? 0 : inf
  const __mmask16 axInf = _mm512_cmp_ps_mask(ax, inf, _CMP_EQ_OQ);
  r = _mm512_mask_blend_ps(axInf, r, _mm512_mask_blend_ps(yNeg, inf, zero));
  // ay == inf: (ax > 1) == (y > 0) ? inf : 0
  const __mmask16 ayInf = _mm512_cmp_ps_mask(ay, inf, _CMP_EQ_OQ);
  const __mmask16 axGt1 = _mm512_cmp_ps_mask(ax, one, _CMP_GT_OQ);
  const __mmask16 same = _knot_mask16(_kxor_mask16(axGt1, yPos));
  r = _mm512_mask_blend_ps(ayInf, r, _mm512_mask_blend_ps(same, zero, inf));
  // signbit(x) & yOdd: -r
  const __mmask16 xNegSign = _mm512_movepi32_mask(_mm512_castps_si512(x));
  r = _mm512_mask_xor_ps(r, _kand_mask16(xNegSign, yOdd), r, _mm512_set1_ps(-0.0f));
  // x < 0, finite, y not an integer: NaN
  const __m512 nan = _mm512_set1_ps(__builtin_nanf(""));
  const __mmask16 xNegFinite = _kand_mask16(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ),
                                            _mm512_cmp_ps_mask(x, _mm512_set1_ps(-__builtin_inff()), _CMP_GT_OQ));
  r = _mm512_mask_blend_ps(_kandn_mask16(yInt, xNegFinite), r, nan);
  // NaN in x or y: NaN
  const __mmask16 anyNaN =
      _kor_mask16(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_cmp_ps_mask(yf, yf, _CMP_UNORD_Q));
  r = _mm512_mask_blend_ps(anyNaN, r, nan);
  // x == -1 and |y| == inf: 1
  const __mmask16 xm1 = _kand_mask16(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-1.0f), _CMP_EQ_OQ), ayInf);
  r = _mm512_mask_blend_ps(xm1, r, one);
  // x == 1 or y == 0: 1
  const __mmask16 ones = _kor_mask16(_mm512_cmp_ps_mask(x, one, _CMP_EQ_OQ), _mm512_cmp_ps_mask(yf, zero, _CMP_EQ_OQ));
  return _mm512_mask_blend_ps(ones, r, one);
}

// Per-lane integer / odd tests of float exponents, as vecmath::pow(float, float) decides them.
static inline void yKinds(__m512 yf, __mmask16& yInt, __mmask16& yOdd) {
  const __m512 ay = _mm512_abs_ps(yf);
  const __mmask16 small = _mm512_cmp_ps_mask(ay, _mm512_set1_ps(16777216.0f), _CMP_LT_OQ);
  const __m512 yr = _mm512_roundscale_ps(yf, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 isInt = _mm512_cmp_ps_mask(yr, yf, _CMP_EQ_OQ);
  yInt = _kor_mask16(_kand_mask16(isInt, small), _knot_mask16(small));
  const __m512 half = _mm512_mul_ps(yf, _mm512_set1_ps(0.5f));
  const __mmask16 halfInt =
      _mm512_cmp_ps_mask(_mm512_roundscale_ps(half, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), half, _CMP_EQ_OQ);
  yOdd = _kandn_mask16(halfInt, _kand_mask16(isInt, small));
}

void powScalar(float* out, const float* in, int64_t n, const vecmath::PowExponent& p) {
  const __m512d y = _mm512_set1_pd(static_cast<double>(p.yh) + static_cast<double>(p.yl));
  const __m512 yf = _mm512_set1_ps(p.y);
  const __mmask16 yInt = p.yInt ? 0xffff : 0, yOdd = p.yOdd ? 0xffff : 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, pow16(_mm512_loadu_ps(in + i), yf, y, y, yInt, yOdd));
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, k, pow16(_mm512_maskz_loadu_ps(k, in + i), yf, y, y, yInt, yOdd));
  }
}

void powTensor(float* out, const float* a, const float* b, int64_t n) {
  auto block = [&](int64_t i, __mmask16 k) {
    const __m512 x = _mm512_maskz_loadu_ps(k, a + i);
    const __m512 yf = _mm512_maskz_loadu_ps(k, b + i);
    __mmask16 yInt, yOdd;
    yKinds(yf, yInt, yOdd);
    const __m512d ylo = _mm512_cvtps_pd(_mm512_castps512_ps256(yf));
    const __m512d yhi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(yf, 1));
    _mm512_mask_storeu_ps(out + i, k, pow16(x, yf, ylo, yhi, yInt, yOdd));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) block(i, 0xffff);
  if (i < n) block(i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

// The fused attention's weight tiles (simd::expShiftedRows), 16 lanes at a time; the rows are walked
// here, so a tile of short rows costs one call.
void expShiftRows(float* x, int64_t rows, int64_t cols, int64_t ld, const float* shift, int64_t diag) {
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict r = x + i * ld;
    const int64_t kept = diag + i < 0 ? 0 : (diag + i > cols ? cols : diag + i);
    const float sh = shift[i];
    for (int64_t j = 0; j < kept; ++j) r[j] = vecmath::exp(r[j] - sh);
    for (int64_t j = kept; j < cols; ++j) r[j] = 0.0f;
  }
}

// bfloat16 <-> float32 for halfBlocks, bit-identical to bfloat16ToFloatN / floatToBFloat16N
// (core/tensor/half.h): widening shifts the 16 bits up; narrowing rounds to nearest even by
// integer arithmetic (AVX512-BF16's instruction flushes subnormal inputs to zero: floatToBf16Cvt
// below) and turns a NaN into the quiet NaN of its sign and top bits, 16 lanes at a time with one
// vpmovdw.
void bf16ToFloat(float* out, const uint16_t* in, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(k, in + i);
    _mm512_mask_storeu_ps(out + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

void floatToBf16(uint16_t* out, const float* in, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
  const __m512i absMask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  auto block = [&](int64_t i, __mmask16 k) {
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, in + i));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absMask), inf);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
    _mm256_mask_storeu_epi16(out + i, k, _mm512_cvtepi32_epi16(r));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) block(i, 0xffff);
  if (i < n) block(i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

// floatToBf16 by AVX512-BF16's vcvtne2ps2bf16, 32 values per instruction, for CPUs that have it
// (simd.cc decides). The instruction rounds to nearest even and quiets a NaN exactly as floatToBf16
// does, but flushes subnormal inputs to zero: a block of 32 holding one takes floatToBf16 instead,
// and so does the tail, so the bits are the same.
__attribute__((target("avx512bf16"))) void floatToBf16Cvt(uint16_t* out, const float* in, int64_t n) {
  constexpr int kSubnormal = 0x20;  // vfpclassps: denormal inputs
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
    if ((_mm512_fpclass_ps_mask(lo, kSubnormal) | _mm512_fpclass_ps_mask(hi, kSubnormal)) != 0) {
      floatToBf16(out + i, in + i, 32);
      continue;
    }
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  if (i < n) floatToBf16(out + i, in + i, n - i);
}

#else

bool built() { return false; }
void expShiftRows(float*, int64_t, int64_t, int64_t, const float*, int64_t) {}
void bf16ToFloat(float*, const uint16_t*, int64_t) {}
void floatToBf16(uint16_t*, const float*, int64_t) {}
void floatToBf16Cvt(uint16_t*, const float*, int64_t) {}
void exp(float*, const float*, int64_t) {}
void log(float*, const float*, int64_t) {}
void tanh(float*, const float*, int64_t) {}
void sigmoid(float*, const float*, int64_t) {}
void silu(float*, const float*, int64_t) {}
void geluErf(float*, const float*, int64_t) {}
void geluTanh(float*, const float*, int64_t) {}
void powScalar(float*, const float*, int64_t, const vecmath::PowExponent&) {}
void powTensor(float*, const float*, const float*, int64_t) {}
void geluErfGrad(float*, const float*, const float*, int64_t) {}
void geluTanhGrad(float*, const float*, const float*, int64_t) {}
void siluGrad(float*, const float*, const float*, int64_t) {}

#endif

}  // namespace cohort::detail::simd::avx512
