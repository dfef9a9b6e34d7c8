// float16 and bfloat16 conversions: round-to-nearest-even against IEEE, exhaustively for float16.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/tensor/allocator.h>
#include <cohort/core/tensor/half.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;

// ---- float16 ---------------------------------------------------------------------------------

namespace {

// An IEEE binary16 value decoded independently of Half (exact in double).
double halfValue(uint16_t h) {
  int sign = (h & 0x8000) ? -1 : 1;
  int exp = (h >> 10) & 0x1f;
  int man = h & 0x3ff;
  if (exp == 31) return man ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(man, -24);
  return sign * std::ldexp(1024 + man, exp - 25);
}

bool isHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

// Reference float -> half with round-to-nearest-even: the nearest of all finite halves, ties to
// the even bit pattern; magnitudes from 65520 (halfway to the next power of two) become inf.
uint16_t referenceHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  // Binary search over the 0x7c00 non-negative finite halves, which are ordered like their bits.
  uint16_t lo = 0, hi = 0x7bff;
  while (hi - lo > 1) {
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (halfValue(mid) <= a) lo = mid;
    else hi = mid;
  }
  double dl = a - halfValue(lo), dh = halfValue(hi) - a;
  uint16_t pick;
  if (dl < dh) pick = lo;
  else if (dh < dl) pick = hi;
  else pick = (lo & 1) ? hi : lo;
  if (a >= halfValue(hi)) pick = hi;  // a == 65504 exactly
  return sign | pick;
}

}  // namespace

TEST(Half, DecodesEveryBitPatternExactly) {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = Half::fromBits(h);
    double want = halfValue(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << b;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << b;  // -0 stays -0
    }
  }
}

TEST(Half, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = Half::toFloat(h);
    uint16_t back = Half::fromFloat(f);
    if (isHalfNan(h)) {
      EXPECT_TRUE(isHalfNan(back)) << std::hex << b;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << b;
    } else {
      ASSERT_EQ(back, h) << std::hex << b << " -> " << f;
    }
  }
}

TEST(Half, TiesRoundToEvenEverywhere) {
  // Between every pair of adjacent finite halves (subnormals included) the midpoint is a float;
  // it must round to the neighbour with the even bit pattern, and the floats just either side of
  // it to the nearer neighbour.
  for (uint16_t lo = 0; lo < 0x7bff; ++lo) {
    uint16_t hi = lo + 1;
    float mid = static_cast<float>((halfValue(lo) + halfValue(hi)) / 2);
    ASSERT_EQ(static_cast<double>(mid), (halfValue(lo) + halfValue(hi)) / 2);  // exact
    uint16_t even = (lo & 1) ? hi : lo;
    ASSERT_EQ(Half::fromFloat(mid), even) << "midpoint of " << std::hex << lo;
    ASSERT_EQ(Half::fromFloat(-mid), 0x8000 | even) << "midpoint of -" << std::hex << lo;
    ASSERT_EQ(Half::fromFloat(std::nextafter(mid, 0.0f)), lo) << std::hex << lo;
    ASSERT_EQ(Half::fromFloat(std::nextafter(mid, 1e9f)), hi) << std::hex << lo;
  }
}

TEST(Half, SpecialValues) {
  EXPECT_EQ(Half(0.0f).bits, 0x0000);
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(0.1f).bits, 0x2e66);      // torch.tensor(0.1, dtype=torch.half).view(torch.int16) == 0x2e66
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);  // largest finite
  // Subnormals: 2^-24 is the smallest; half of it is a tie that rounds to (even) zero,
  // three halves of it a tie that rounds to (even) 2 * 2^-24.
  EXPECT_EQ(Half(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(Half(std::ldexp(1.0f, -25)).bits, 0x0000);
  EXPECT_EQ(Half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(Half(3 * std::ldexp(1.0f, -25)).bits, 0x0002);
  EXPECT_EQ(Half(-std::ldexp(1.0f, -26)).bits, 0x8000);  // underflow keeps the sign
  EXPECT_EQ(Half(std::ldexp(1.0f, -14)).bits, 0x0400);   // smallest normal
  EXPECT_EQ(Half(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  // Overflow: up to 65519.99 rounds down to 65504; from 65520 (the tie with 2^16) it is inf.
  EXPECT_EQ(Half(65519.0f).bits, 0x7bff);
  EXPECT_EQ(Half(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);
  EXPECT_EQ(Half(-1e6f).bits, 0xfc00);
  EXPECT_EQ(Half(std::numeric_limits<float>::max()).bits, 0x7c00);
  EXPECT_EQ(Half(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_EQ(Half(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_TRUE(isHalfNan(Half(std::numeric_limits<float>::quiet_NaN()).bits));
  EXPECT_TRUE(isHalfNan(Half(bitsFloat(0x7f800001u)).bits));  // a signalling NaN must not become inf
  EXPECT_TRUE(std::isnan(static_cast<float>(Half::fromBits(0x7e00))));
  EXPECT_TRUE(std::isinf(static_cast<float>(Half::fromBits(0xfc00))));
}

TEST(Half, MatchesReferenceOnManyFloats) {
  std::mt19937 rng(12345);
  std::vector<float> samples;
  // Random bit patterns (every exponent) and random floats within the half range.
  for (int i = 0; i < 200000; ++i) samples.push_back(bitsFloat(static_cast<uint32_t>(rng())));
  std::uniform_int_distribution<uint32_t> exp(100, 143), man(0, (1u << 23) - 1);
  for (int i = 0; i < 400000; ++i) samples.push_back(bitsFloat((rng() & 0x80000000u) | exp(rng) << 23 | man(rng)));
  for (float f : samples) {
    uint16_t got = Half::fromFloat(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(isHalfNan(got));
      continue;
    }
    ASSERT_EQ(got, referenceHalf(f)) << std::hexfloat << f;
#if defined(__F16C__)
    // The CPU's own conversion (IEEE, round to nearest even) agrees too.
    ASSERT_EQ(got, static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))) << std::hexfloat << f;
#endif
  }
}

// ---- bfloat16 --------------------------------------------------------------------------------

namespace {

bool isBf16Nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Reference float -> bfloat16 with round-to-nearest-even, choosing between the two neighbours
// by exact distance in double (past the largest finite value the upper neighbour is 2^128).
uint16_t referenceBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint16_t t = static_cast<uint16_t>((u >> 16) & 0x7fff);  // truncated magnitude
  if (t == 0x7f80) return sign | 0x7f80;                   // inf
  double a = std::fabs(static_cast<double>(f));
  double lo = bitsFloat(static_cast<uint32_t>(t) << 16);
  double hi =
      (t + 1) == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(bitsFloat(static_cast<uint32_t>(t + 1) << 16));
  uint16_t pick;
  if (a - lo < hi - a) pick = t;
  else if (hi - a < a - lo) pick = t + 1;
  else pick = (t & 1) ? t + 1 : t;
  return sign | pick;
}

}  // namespace

TEST(BFloat16, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = BFloat16::fromBits(h);
    EXPECT_EQ(floatBits(f), b << 16);  // decoding is exact: the high half of a float
    uint16_t back = BFloat16::fromFloat(f);
    if (isBf16Nan(h)) {
      ASSERT_TRUE(isBf16Nan(back)) << std::hex << b;
    } else {
      ASSERT_EQ(back, h) << std::hex << b;
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  // For every bfloat16 pattern, the low 16 float bits decide: below half, exactly half (a tie,
  // to even), above half.
  for (uint32_t hiBits = 0; hiBits < 65536; ++hiBits) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      float f = bitsFloat(hiBits << 16 | low);
      uint16_t got = BFloat16::fromFloat(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(isBf16Nan(got)) << std::hex << (hiBits << 16 | low);
      } else {
        ASSERT_EQ(got, referenceBf16(f)) << std::hex << (hiBits << 16 | low);
      }
    }
  }
  EXPECT_EQ(BFloat16(bitsFloat(0x3f808000u)).bits, 0x3f80);  // tie, even below
  EXPECT_EQ(BFloat16(bitsFloat(0x3f818000u)).bits, 0x3f82);  // tie, even above
  EXPECT_EQ(BFloat16(bitsFloat(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds past the largest finite
  EXPECT_EQ(BFloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(BFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  EXPECT_TRUE(isBf16Nan(BFloat16(bitsFloat(0x7f800001u)).bits));  // signalling NaN stays NaN
  EXPECT_TRUE(isBf16Nan(BFloat16(bitsFloat(0xffffffffu)).bits));
  // torch.tensor(0.1, dtype=torch.bfloat16).view(torch.int16) == 0x3dcd
  EXPECT_EQ(BFloat16(0.1f).bits, 0x3dcd);
}

TEST(HalfTensors, StoreHalfWidthAndConvertOnce) {
  // to(dtype) rounds each element once; back to float32 is exact.
  std::vector<float> v = {0.1f, 1.0f / 3, 65519.0f, 70000.0f, -std::ldexp(3.0f, -25), 1e-8f};
  Tensor f32 = fromVector<float>(v);
  Tensor h = f32.to(DType::Float16);
  Tensor b = f32.to(DType::BFloat16);
  EXPECT_EQ(h.dtype(), DType::Float16);
  EXPECT_EQ(h.nbytes(), v.size() * 2);
  EXPECT_EQ(b.nbytes(), v.size() * 2);
  auto hv = h.to(DType::Float32).toVector<float>();
  auto bv = b.to(DType::Float32).toVector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(floatBits(hv[i]), floatBits(static_cast<float>(Half(v[i])))) << v[i];
    EXPECT_EQ(floatBits(bv[i]), floatBits(static_cast<float>(BFloat16(v[i])))) << v[i];
  }
  const Half* hp = h.data<Half>();
  EXPECT_EQ(hp[0].bits, 0x2e66);
  EXPECT_EQ(hp[3].bits, 0x7c00);  // 70000 overflows to inf
}

// ---- bulk (vectorized) conversions -------------------------------------------------------------

namespace {

uint32_t bitsOfFloat(float f) { return floatBits(f); }

}  // namespace

// halfToFloatN must give exactly float(Half) for every one of the 65536 patterns (NaN payloads
// included), at every position of the 8-wide loop and its scalar tail.
TEST(HalfBulk, HalfToFloatMatchesScalarOnEveryBitPattern) {
  std::vector<Half> src(65536 + 5);
  for (uint32_t u = 0; u < src.size(); ++u) src[u] = Half::fromBits(static_cast<uint16_t>(u & 0xffffu));
  for (int64_t offset : {0, 1, 3}) {
    const int64_t n = static_cast<int64_t>(src.size()) - offset;
    std::vector<float> dst(static_cast<size_t>(n));
    halfToFloatN(src.data() + offset, dst.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(bitsOfFloat(dst[i]), bitsOfFloat(static_cast<float>(src[i + offset])))
          << "half bits 0x" << std::hex << src[i + offset].bits;
  }
}

// floatToHalfN against the scalar Half::fromFloat: every float within +-2 ulp of each half value
// and of each midpoint between neighbouring halves (rounding boundaries, ties, the subnormal and
// overflow thresholds), NaNs with assorted payloads, and 2^24 random bit patterns.
TEST(HalfBulk, FloatToHalfMatchesScalar) {
  std::vector<float> in;
  auto around = [&](float f) {
    const uint32_t b = floatBits(f);
    for (int d = -2; d <= 2; ++d) in.push_back(bitsFloat(b + static_cast<uint32_t>(d)));
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float v = static_cast<float>(Half::fromBits(static_cast<uint16_t>(h)));
    const float next = h + 1 < 0x7c00 ? static_cast<float>(Half::fromBits(static_cast<uint16_t>(h + 1))) : 65536.0f;
    const float mid = static_cast<float>((static_cast<double>(v) + next) / 2);  // exact in float
    for (float s : {1.0f, -1.0f}) {
      around(s * v);
      around(s * mid);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, -0.0f, inf, -inf, 65504.0f, 65519.99f, 65520.0f, 1e10f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 5.9604645e-8f,
                  2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f})
    for (float s : {1.0f, -1.0f}) around(s * f);
  for (uint32_t payload : {0x1u, 0x2000u, 0x3fffffu, 0x400000u, 0x400001u, 0x7fffffu, 0x12345u})
    for (uint32_t sign : {0u, 0x80000000u}) in.push_back(bitsFloat(sign | 0x7f800000u | payload));
  std::mt19937 rng(1234);
  for (int k = 0; k < (1 << 24); ++k) in.push_back(bitsFloat(static_cast<uint32_t>(rng())));
  std::vector<Half> out(in.size());
  floatToHalfN(in.data(), out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i].bits, Half::fromFloat(in[i])) << "float bits 0x" << std::hex << floatBits(in[i]);
  // A tail shorter than the vector width goes through the scalar path with the same results.
  floatToHalfN(in.data() + 1, out.data(), 5);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i].bits, Half::fromFloat(in[i + 1]));
}

// to(float16) / to(float32) on contiguous tensors take the bulk path; strided ones the
// per-element path; both give the same bits.
TEST(HalfBulk, TensorConversionsAgreeWithStridedPath) {
  std::mt19937 rng(7);
  std::vector<float> v(4099);
  for (float& f : v) f = bitsFloat(static_cast<uint32_t>(rng()) & 0xc7ffffffu);  // magnitudes up to ~2^16
  v[5] = std::numeric_limits<float>::quiet_NaN();
  v[9] = -std::numeric_limits<float>::infinity();
  v[10] = 70000.0f;
  v[11] = 1e-7f;
  Tensor a = fromVector(v, {static_cast<int64_t>(v.size())});
  Tensor h = a.to(DType::Float16);
  Tensor a2 = stack({a, a}, 1);  // [n, 2]; column 0 is a strided copy of a
  Tensor hs = a2.select(1, 0).to(DType::Float16);
  const Half* hp = h.data<Half>();
  Tensor hsc = hs.contiguous();
  const Half* hsp = hsc.data<Half>();
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(hp[i].bits, Half::fromFloat(v[i])) << i;
    ASSERT_EQ(hsp[i].bits, hp[i].bits) << i;
  }
  Tensor back = h.to(DType::Float32);
  Tensor backStrided = stack({h, h}, 1).select(1, 1).to(DType::Float32);
  const float* bp = back.data<float>();
  std::vector<float> bs = backStrided.contiguous().toVector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(floatBits(bp[i]), floatBits(static_cast<float>(hp[i]))) << i;
    ASSERT_EQ(floatBits(bs[i]), floatBits(bp[i])) << i;
  }
}

TEST(BFloat16, BulkConversionsMatchTheScalarOnesBitForBit) {
  // Every bfloat16 pattern with every interesting low half: floatToBFloat16N must give exactly
  // BFloat16(float) (NaNs included), and bfloat16ToFloatN exactly float(BFloat16); odd lengths
  // cover the vector loops' tails.
  std::vector<float> in;
  for (uint32_t hiBits = 0; hiBits < 65536; ++hiBits)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      in.push_back(bitsFloat(hiBits << 16 | low));
  in.push_back(1.5f);  // an odd count
  std::vector<BFloat16> out(in.size());
  floatToBFloat16N(in.data(), out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i].bits, BFloat16(in[i]).bits) << std::hex << floatBits(in[i]);
  std::vector<float> back(out.size());
  bfloat16ToFloatN(out.data(), back.data(), static_cast<int64_t>(out.size()));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(floatBits(back[i]), floatBits(static_cast<float>(out[i]))) << i;
  // The AVX-512 loops (Tensor::to and the activations' blocks take them where the CPU has AVX-512)
  // give the same bits, and so does a tensor conversion.
  std::vector<BFloat16> out512(in.size());
  std::vector<float> back512(in.size());
  detail::simd::roundToBFloat16(in.data(), out512.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out512[i].bits, out[i].bits) << std::hex << floatBits(in[i]);
  detail::simd::widenBFloat16(out.data(), back512.data(), static_cast<int64_t>(out.size()));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(floatBits(back512[i]), floatBits(back[i])) << i;
  Tensor t = fromVector(in, {static_cast<int64_t>(in.size())}).to(DType::BFloat16);
  const BFloat16* tp = t.data<BFloat16>();
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(tp[i].bits, out[i].bits) << std::hex << floatBits(in[i]);
  std::vector<float> tb = t.to(DType::Float32).toVector<float>();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(floatBits(tb[i]), floatBits(back[i])) << i;
}

// A strided copy within one dtype moves each element's bits unchanged: bfloat16 and float16 are not
// widened and rounded back (which would quiet a signalling NaN), as the contiguous memcpy path.
TEST(HalfTensors, StridedCopiesKeepEveryBitPattern) {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    std::vector<uint16_t> bits(3 * 70);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
    bits[1] = dt == DType::BFloat16 ? 0x7f81 : 0x7c01;  // signalling NaNs
    bits[2] = dt == DType::BFloat16 ? 0xff81 : 0xfc01;
    Tensor t = empty({3, 70}, {.dtype = dt});
    std::memcpy(t.dataPtr(), bits.data(), bits.size() * 2);
    Tensor tt = t.transpose(0, 1).contiguous();  // [70, 3], a strided read
    ASSERT_EQ(tt.sizes(), (Shape{70, 3}));
    const auto* p = static_cast<const uint16_t*>(tt.dataPtr());
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 70; ++j)
        ASSERT_EQ(p[j * 3 + i], bits[i * 70 + j]) << dtypeName(dt) << " " << i << "," << j;
  }
}
