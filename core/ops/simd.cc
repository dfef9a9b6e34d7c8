#include <cohort/core/ops/detail/simd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <string>

#include <fmt/format.h>

#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/iter.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/parallel.h>

namespace cohort::detail::simd {

// simd_avx512.cc
namespace avx512 {
bool built();
void exp(float*, const float*, int64_t);
void log(float*, const float*, int64_t);
void tanh(float*, const float*, int64_t);
void sigmoid(float*, const float*, int64_t);
void silu(float*, const float*, int64_t);
void geluErf(float*, const float*, int64_t);
void geluTanh(float*, const float*, int64_t);
void powScalar(float*, const float*, int64_t, const vecmath::PowExponent&);
void powTensor(float*, const float*, const float*, int64_t);
void geluErfGrad(float*, const float*, const float*, int64_t);
void geluTanhGrad(float*, const float*, const float*, int64_t);
void siluGrad(float*, const float*, const float*, int64_t);
void expShiftRows(float*, int64_t, int64_t, int64_t, const float*, int64_t);
void bf16ToFloat(float*, const uint16_t*, int64_t);
void floatToBf16(uint16_t*, const float*, int64_t);
void floatToBf16Cvt(uint16_t*, const float*, int64_t);
}  // namespace avx512

namespace {

COHORT_ENV_KNOB(kSimdKnob, "COHORT_SIMD", "auto",
                "Which vector code the compute-bound float32 kernels (pow, gelu, exp, log, tanh, sigmoid, silu) "
                "run: auto (AVX-512 where the CPU has it) or avx2.");

// What the CPU and COHORT_SIMD allow, decided once.
bool allowed() {
  static const bool kOk = [] {
    std::string mode = kSimdKnob.str();
    std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
    if (mode != "auto" && mode != "avx2" && mode != "avx512")
      throw ValueError(
          fmt::format("environment variable COHORT_SIMD='{}' is not one of auto, avx2, avx512", kSimdKnob.str()));
    if (mode == "avx2" || !avx512::built()) return false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#else
    return false;  // the kernels exist only for x86-64 (built() is false elsewhere anyway)
#endif
  }();
  return kOk;
}

std::atomic<bool> gSwitchedOff{false};

// The AVX-512 float32 -> bfloat16 loop: AVX512-BF16's conversion instruction where the CPU has it
// (Zen 4, Cooper Lake, Sapphire Rapids), else integer rounding; the same bits either way.
using RoundBf16 = void (*)(uint16_t*, const float*, int64_t);
RoundBf16 roundBf16() {
#if defined(__x86_64__)
  static const RoundBf16 kFn = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") ? avx512::floatToBf16Cvt : avx512::floatToBf16;
  }();
  return kFn;
#else
  return avx512::floatToBf16;
#endif
}

bool applies(const Tensor& t) {
  return t.defined() && t.dtype() == DType::Float32 && t.device().isCpu() && t.isContiguous();
}

// A contiguous bfloat16 or float16 CPU tensor, which the kernels take through halfBlocks.
bool appliesHalf(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::BFloat16 || t.dtype() == DType::Float16) && t.device().isCpu() &&
         t.isContiguous();
}

// bfloat16 / float16: the N inputs (of out's dtype and size) widened a block at a time into
// buffers that stay in L1, computed by a float32 kernel, compute(res, in, n), and the result
// rounded back into `out` once (what the portable kernels do element by element). bfloat16 is
// widened and rounded by AVX-512 loops too (the AVX2 ones made a bfloat16 gelu a third slower than
// a float32 one); float16 by F16C's conversions.
template <size_t N, typename F>
void halfBlocks(Tensor& out, const std::array<const Tensor*, N>& ins, F&& compute) {
  const bool bf16 = out.dtype() == DType::BFloat16;
  auto* o = static_cast<uint16_t*>(out.dataPtr());
  std::array<const uint16_t*, N> x;
  for (size_t j = 0; j < N; ++j) x[j] = static_cast<const uint16_t*>(ins[j]->dataPtr());
  parallelFor(out.numel(), kComputeBoundGrain, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 1024;
    alignas(64) float in[N][kBlock], res[kBlock];
    float* inPtr[N];
    for (size_t j = 0; j < N; ++j) inPtr[j] = in[j];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t n = std::min(kBlock, e - i);
      for (size_t j = 0; j < N; ++j) {
        if (bf16) avx512::bf16ToFloat(in[j], x[j] + i, n);
        else halfToFloatN(reinterpret_cast<const Half*>(x[j] + i), in[j], n);
      }
      compute(res, inPtr, n);
      if (bf16) roundBf16()(o + i, res, n);
      else floatToHalfN(res, reinterpret_cast<Half*>(o + i), n);
    }
  });
}

}  // namespace

bool enabled() { return !gSwitchedOff.load(std::memory_order_relaxed) && allowed(); }
void setEnabled(bool on) { gSwitchedOff.store(!on, std::memory_order_relaxed); }
const char* describe() { return enabled() ? "avx512" : "avx2"; }

namespace {
// `out` can take the result of a kernel over `ins` in place of the portable loop: all of one
// dtype and shape, and contiguous (out may be one of the inputs).
template <size_t N>
bool sameLayout(const Tensor& out, const std::array<const Tensor*, N>& ins) {
  for (const Tensor* t : ins)
    if (!t->defined() || t->dtype() != out.dtype() || t->sizes() != out.sizes() || !t->isContiguous()) return false;
  return out.isContiguous();
}
}  // namespace

bool unary(Tensor& out, const Tensor& a, Unary k) {
  if ((!applies(out) && !appliesHalf(out)) || !sameLayout<1>(out, {&a}) || !enabled()) return false;
  void (*kernel)(float*, const float*, int64_t) = nullptr;
  switch (k) {
    case Unary::Exp: kernel = avx512::exp; break;
    case Unary::Log: kernel = avx512::log; break;
    case Unary::Tanh: kernel = avx512::tanh; break;
    case Unary::Sigmoid: kernel = avx512::sigmoid; break;
    case Unary::Silu: kernel = avx512::silu; break;
    case Unary::GeluErf: kernel = avx512::geluErf; break;
    case Unary::GeluTanh: kernel = avx512::geluTanh; break;
  }
  if (out.dtype() == DType::Float32) {
    float* o = out.data<float>();
    const float* x = a.data<float>();
    parallelFor(a.numel(), kComputeBoundGrain, [&](int64_t b, int64_t e) { kernel(o + b, x + b, e - b); });
    return true;
  }
  halfBlocks<1>(out, {&a}, [kernel](float* res, float* const* in, int64_t n) { kernel(res, in[0], n); });
  return true;
}

namespace {
// An elementwise kernel of two float32 operands of out's shape, all contiguous, split across the
// intra-op threads; with `halves`, also bfloat16 (or float16) operands, through halfBlocks. False
// when it does not apply.
using BinaryKernel = void (*)(float*, const float*, const float*, int64_t);
bool binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryKernel kernel, bool halves = false) {
  if (!enabled() || !sameLayout<2>(out, {&a, &b})) return false;
  if (halves && appliesHalf(out)) {
    halfBlocks<2>(out, {&a, &b}, [kernel](float* res, float* const* in, int64_t n) { kernel(res, in[0], in[1], n); });
    return true;
  }
  if (!applies(out)) return false;
  float* o = out.data<float>();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  parallelFor(a.numel(), kComputeBoundGrain, [&](int64_t lo, int64_t hi) { kernel(o + lo, x + lo, y + lo, hi - lo); });
  return true;
}
}  // namespace

bool unaryGrad(Tensor& out, const Tensor& g, const Tensor& x, UnaryGrad k) {
  switch (k) {
    case UnaryGrad::GeluErf: return binary(out, g, x, avx512::geluErfGrad, true);
    case UnaryGrad::GeluTanh: return binary(out, g, x, avx512::geluTanhGrad, true);
    case UnaryGrad::Silu: return binary(out, g, x, avx512::siluGrad, true);
  }
  return false;
}

bool powScalar(Tensor& out, const Tensor& a, const vecmath::PowExponent& p) {
  if (!applies(out) || !sameLayout<1>(out, {&a}) || !enabled()) return false;
  float* o = out.data<float>();
  const float* x = a.data<float>();
  parallelFor(a.numel(), kComputeBoundGrain, [&](int64_t b, int64_t e) { avx512::powScalar(o + b, x + b, e - b, p); });
  return true;
}

bool powTensor(Tensor& out, const Tensor& a, const Tensor& b) { return binary(out, a, b, avx512::powTensor); }

bool expShiftedRows(float* x, int64_t rows, int64_t cols, int64_t ld, const float* shift, int64_t diag) {
  if (!enabled()) return false;
  avx512::expShiftRows(x, rows, cols, ld, shift, diag);
  return true;
}

void widenBFloat16(const BFloat16* src, float* dst, int64_t n) {
  if (enabled()) avx512::bf16ToFloat(dst, reinterpret_cast<const uint16_t*>(src), n);
  else bfloat16ToFloatN(src, dst, n);
}

void roundToBFloat16(const float* src, BFloat16* dst, int64_t n) {
  if (enabled()) roundBf16()(reinterpret_cast<uint16_t*>(dst), src, n);
  else floatToBFloat16N(src, dst, n);
}

}  // namespace cohort::detail::simd
