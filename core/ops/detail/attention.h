// Internal to core/ops/attention.cc and its tests.
#pragma once

#include <cmath>
#include <cstdint>

#include <cohort/core/ops/functional.h>

namespace cohort::detail {

// Kernel signatures of the fused attention on devices other than the CPU (internal to core/ops),
// registered under "scaledDotProductAttention" (all three, each its own signature). q [nb, tq, e],
// k and v [nb, tk, e] are dense, of one 16-bit dtype, tq and tk > 0.
// Whether the device's kernel computes this dtype and head size (else the op runs the unfused formula,
// scaledDotProductAttentionMath).
using SdpaSupportsKernel = bool(DType dtype, int64_t e);
// out [nb, tq, e] (q's dtype) and lse [nb, tq] (float32, the rows' log-sum-exp of the scaled
// scores), both allocated by the caller.
using SdpaForwardKernel = void(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               double scale, bool causal);
// dq, dk, dv (q's dtype, allocated by the caller) from the forward's inputs, output and lse and
// the output's gradient dout (dense, q's dtype).
using SdpaBackwardKernel = void(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, bool causal);

// ---- the CPU kernel (core/ops/attention_cpu.cc) --------------------------------------------------

// Shapes of one attention call: q [batch..., tq, e], k [batch..., tk, e], v [batch..., tk, ev]
// (batch dims broadcast), nb batch entries in all.
struct SdpaDims {
  Shape batch;
  int64_t nb = 1, tq = 0, tk = 0, e = 0, ev = 0;
};

// [batch..., a, b].
inline Shape sdpaShape(const Shape& batch, int64_t a, int64_t b) {
  Shape s = batch;
  s.push_back(a);
  s.push_back(b);
  return s;
}

// Dropout without a stored mask: one 64-bit key per call; whether weight (b, i, j) is kept is a hash
// of (key, b, i, j) (splitmix64 per row, a 32-bit finaliser per column), so forward and backward
// regenerate the same mask, and the same generator state gives the same result.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct SdpaDropout {
  bool on = false;
  uint64_t key = 0;
  uint32_t threshold = 0;  // keep when the hash's top 24 bits are below this
  double scale = 1.0;      // 1 / (1 - p)
  int64_t tq = 0;

  SdpaDropout() = default;
  SdpaDropout(double p, uint64_t k, int64_t rows) : on(p > 0.0), key(k), tq(rows) {
    threshold = static_cast<uint32_t>(std::ceil((1.0 - p) * 16777216.0));
    scale = 1.0 / (1.0 - p);
  }
  // The per-row part of the hash for batch entry b, query row i.
  uint64_t row(int64_t b, int64_t i) const {
    return splitmix64(key + static_cast<uint64_t>(b * tq + i) * 0xD1B54A32D192ED03ull);
  }
  // Whether key column j of the row with hash rk is kept. Vectorizes over j.
  static bool keep(uint64_t rk, int64_t j, uint32_t threshold) {
    uint32_t x = static_cast<uint32_t>(rk) + static_cast<uint32_t>(j) * 0x9E3779B9u;
    x ^= static_cast<uint32_t>(rk >> 32);
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return (x >> 8) < threshold;
  }
};

// One call's arguments. mask: bool (true = attend) or floating (added), broadcastable to
// [batch..., tq, tk], or undefined; never together with causal.
struct SdpaCpuArgs {
  SdpaDims d;
  Tensor mask;
  double scale = 1.0;
  bool causal = false;
  SdpaDropout drop;
};

// out [batch..., tq, ev] in q's dtype and lse [batch..., tq] (float32; float64 for float64 inputs).
void sdpaCpuForward(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, Tensor& out, Tensor& lse);
// dq, dk, dv (q's dtype, allocated here) from the forward's inputs, its out and lse, and the output
// gradient dout ([batch..., tq, ev], any dtype, any strides).
void sdpaCpuBackward(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, const Tensor& out,
                     const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace cohort::detail
