// The AVX-512 loops of core/ops/simd.h. This file alone is compiled with -march=x86-64-v4
// (core/CMakeLists.txt); without that flag it compiles to no kernels and simd.cc never calls in.
//
// Keep it to plain loops over float pointers calling the always-inline vecmath functions: any
// inline function emitted out of line here (a std:: template, a constructor) would be AVX-512
// code that the linker may pick for the rest of the library too, which must run on AVX2 CPUs.
#include <cstdint>

#include <cohort/core/ops/vec_math.h>

namespace cohort::detail::simd::avx512 {

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512BW__)

bool built() { return true; }

#define COHORT_SIMD_LOOP(name, expr)                                                   \
  void name(float* __restrict out, const float* __restrict in, int64_t n) {            \
    for (int64_t i = 0; i < n; ++i) {                                                  \
      const float x = in[i];                                                           \
      out[i] = expr;                                                                   \
    }                                                                                  \
  }

COHORT_SIMD_LOOP(exp, vecmath::exp(x))
COHORT_SIMD_LOOP(log, vecmath::log(x))
COHORT_SIMD_LOOP(tanh, vecmath::tanh(x))
COHORT_SIMD_LOOP(sigmoid, vecmath::sigmoid(x))
COHORT_SIMD_LOOP(silu, vecmath::silu(x))
COHORT_SIMD_LOOP(geluErf, vecmath::geluErf(x))
COHORT_SIMD_LOOP(geluTanh, vecmath::geluTanh(x))
#undef COHORT_SIMD_LOOP

void powScalar(float* __restrict out, const float* __restrict in, int64_t n, const vecmath::PowExponent& e) {
  const vecmath::PowExponent p = e;  // trivially copied: no constructor is emitted here
  for (int64_t i = 0; i < n; ++i) out[i] = vecmath::pow(in[i], p);
}

void powTensor(float* __restrict out, const float* __restrict a, const float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = vecmath::pow(a[i], b[i]);
}

#else

bool built() { return false; }
void exp(float*, const float*, int64_t) {}
void log(float*, const float*, int64_t) {}
void tanh(float*, const float*, int64_t) {}
void sigmoid(float*, const float*, int64_t) {}
void silu(float*, const float*, int64_t) {}
void geluErf(float*, const float*, int64_t) {}
void geluTanh(float*, const float*, int64_t) {}
void powScalar(float*, const float*, int64_t, const vecmath::PowExponent&) {}
void powTensor(float*, const float*, const float*, int64_t) {}

#endif

}  // namespace cohort::detail::simd::avx512
