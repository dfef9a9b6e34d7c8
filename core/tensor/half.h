/*
 * Half-width float storage types: Half (IEEE binary16) and BFloat16. They store 16 bits and
 * convert to/from float with round-to-nearest-even; kernels load them as float, compute in
 * float, and round once on store.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cohort {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(fromFloat(f)) {}  // NOLINT(google-explicit-constructor): numeric type
  operator float() const { return bitsFloat(static_cast<uint32_t>(bits) << 16); }
  static uint16_t fromFloat(float f) {
    uint32_t u = floatBits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
  static BFloat16 fromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(fromFloat(f)) {}  // NOLINT(google-explicit-constructor): numeric type
  operator float() const { return toFloat(bits); }
  static Half fromBits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }

  static float toFloat(uint16_t h) {
#if defined(__F16C__)
    return hardwareToFloat(h);
#else
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
      if (man == 0) {
        out = sign;
      } else {  // subnormal: normalise
        int e = -1;
        do {
          ++e;
          man <<= 1;
        } while ((man & 0x400u) == 0);
        out = sign | ((127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
      }
    } else if (exp == 31) {
      out = sign | 0x7f800000u | (man << 13);
    } else {
      out = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return bitsFloat(out);
#endif
  }

  static uint16_t fromFloat(float f) {
    uint32_t u = floatBits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf (>= 65520)
    if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
      // Add 0.5 so the float adder's round-to-nearest-even produces the half subnormal bits.
      float r = bitsFloat(a) + 0.5f;
      return static_cast<uint16_t>(sign | (floatBits(r) - 0x3f000000u));
    }
    uint32_t mantOdd = (a >> 13) & 1u;
    a += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantOdd;
    return static_cast<uint16_t>(sign | (a >> 13));
  }

 private:
#if defined(__F16C__)
  static float hardwareToFloat(uint16_t h);
#endif
};

}  // namespace cohort

#if defined(__F16C__)
#include <immintrin.h>
inline float cohort::Half::hardwareToFloat(uint16_t h) { return _cvtsh_ss(h); }
#endif

namespace cohort {

// Bulk conversions between contiguous float and Half arrays, bit-identical to the scalar
// Half(float) / float(Half) above for every input (tests/core/tensor/half_test.cc checks all 65536 half
// patterns and float boundaries). The scalar float->half code branches per element and does not
// vectorize; with F16C (x86-64-v3) these convert 8 elements per instruction: VCVTPS2PH rounds to
// nearest-even with IEEE overflow to inf and half subnormals exactly like Half::fromFloat, and
// only NaN payloads differ (the scalar path returns the canonical quiet NaN sign|0x7e00), so NaN
// lanes are replaced by a canonical quiet NaN of the same sign before converting.
inline void floatToHalfN(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  const __m256 signMask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 quietNaN = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    const __m256 isNaN = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    v = _mm256_blendv_ps(v, _mm256_or_ps(_mm256_and_ps(v, signMask), quietNaN), isNaN);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) dst[i] = Half(src[i]);
}

inline void halfToFloatN(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Bulk conversions between contiguous float and BFloat16 arrays, bit-identical to BFloat16(float)
// and float(BFloat16) for every input (NaN included: the same quiet NaN). Branch-free, so the
// compiler vectorizes them (the scalar constructor's NaN branch keeps it from doing so).
inline void bfloat16ToFloatN(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bitsFloat(static_cast<uint32_t>(src[i].bits) << 16);
}

inline void floatToBFloat16N(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = floatBits(src[i]);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quietNaN = (u >> 16) | 0x40u;
    dst[i].bits = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quietNaN : rounded);
  }
}

// The pair above for either half type T (BFloat16 or Half), for code templated on it.
template <typename T>
inline void halfTypeToFloatN(const T* src, float* dst, int64_t n) {
  static_assert(std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>);
  if constexpr (std::is_same_v<T, BFloat16>) bfloat16ToFloatN(src, dst, n);
  else halfToFloatN(src, dst, n);
}
template <typename T>
inline void floatToHalfTypeN(const float* src, T* dst, int64_t n) {
  static_assert(std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>);
  if constexpr (std::is_same_v<T, BFloat16>) floatToBFloat16N(src, dst, n);
  else floatToHalfN(src, dst, n);
}

}  // namespace cohort
