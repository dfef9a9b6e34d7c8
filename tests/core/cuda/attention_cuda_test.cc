// The fused attention kernel on a GPU (core/cuda/attention.cu) against the CPU's fused attention on
// the same 16-bit inputs: outputs and the gradients of q, k and v, causal or not, head sizes 32, 64
// and 128, sequence lengths that are and are not multiples of the kernel's 64-row blocks, Tq != Tk,
// broadcast-free batch dims. The CPU reference computes in float32 from the same inputs; the GPU
// rounds P to the input type before P V (as FlashAttention does), so the comparison is by relative
// error norm. Also: the fused path holds no [Tq, Tk] matrix (the allocator's peak says so), and
// masks and dropout still take the unfused formula. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

namespace F = nn::functional;

// ||got - want|| / ||want|| over all elements (both moved to the CPU in float64).
double relError(const Tensor& got, const Tensor& want) {
  std::vector<double> g = got.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  std::vector<double> w = want.to(Device::cpu()).to(DType::Float64).contiguous().toVector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Case {
  int64_t tq, tk, e;
  bool causal;
};

struct Result {
  Tensor out, dq, dk, dv;
};

Result run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& go, bool causal) {
  Tensor qq = q.detach().setRequiresGrad(true), kk = k.detach().setRequiresGrad(true),
         vv = v.detach().setRequiresGrad(true);
  Tensor out = F::scaledDotProductAttention(qq, kk, vv, {.causal = causal});
  (out * go).sum().backward();
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

TEST(CudaAttention, FusedKernelMatchesTheCpuForwardAndBackward) {
  COHORT_REQUIRE_GPU();
  const std::vector<Case> cases = {{64, 64, 64, true},   {64, 64, 64, false},   {17, 17, 64, true},
                                   {130, 130, 64, true}, {100, 100, 32, false}, {50, 77, 64, true},
                                   {77, 50, 128, true},  {1, 1, 128, false},    {200, 130, 32, true}};
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    // Relative error norms allowed: 16-bit inputs, float accumulation; bfloat16 keeps 8 bits.
    const double tol = dt == DType::BFloat16 ? 1.5e-2 : 5e-3;
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << dtypeName(dt) << " tq " << c.tq << " tk " << c.tk << " e " << c.e
                                        << (c.causal ? " causal" : ""));
      Tensor q = testing::values({2, 3, c.tq, c.e}, DType::Float32, 1, -2, 2).to(dt);
      Tensor k = testing::values({2, 3, c.tk, c.e}, DType::Float32, 2, -2, 2).to(dt);
      Tensor v = testing::values({2, 3, c.tk, c.e}, DType::Float32, 3, -2, 2).to(dt);
      Tensor go = testing::values({2, 3, c.tq, c.e}, DType::Float32, 4, -1, 1).to(dt);
      // Reference: the CPU's fused attention in float32 on the same (rounded) values.
      Result want =
          run(q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), go.to(DType::Float32), c.causal);
      const Device dev = Device::cuda();
      Result got = run(q.to(dev), k.to(dev), v.to(dev), go.to(dev), c.causal);
      ASSERT_EQ(got.out.dtype(), dt);
      ASSERT_EQ(got.out.sizes(), want.out.sizes());
      ASSERT_EQ(got.dq.dtype(), dt);
      std::printf("%s tq %3lld tk %3lld e %3lld%s: relative error out %.2e dq %.2e dk %.2e dv %.2e\n", dtypeName(dt),
                  static_cast<long long>(c.tq), static_cast<long long>(c.tk), static_cast<long long>(c.e),
                  c.causal ? " causal" : "       ", relError(got.out, want.out), relError(got.dq, want.dq),
                  relError(got.dk, want.dk), relError(got.dv, want.dv));
      EXPECT_LT(relError(got.out, want.out), tol) << "output";
      // With one key the softmax is constant: dq and dk are zero in exact arithmetic, and what both
      // sides compute is rounding noise (the GPU's delta = rowsum(dO * O) reads the 16-bit output, as
      // FlashAttention's does), so there is nothing to compare relatively.
      if (c.tk > 1) {
        EXPECT_LT(relError(got.dq, want.dq), 2 * tol) << "dq";
        EXPECT_LT(relError(got.dk, want.dk), 2 * tol) << "dk";
      }
      EXPECT_LT(relError(got.dv, want.dv), 2 * tol) << "dv";
    }
  }
}

TEST(CudaAttention, TransposedHeadViewsAreReadCorrectly) {
  COHORT_REQUIRE_GPU();
  // As a GPT makes them: q, k, v split from one projection and transposed to [B, H, T, E].
  const Device dev = Device::cuda();
  Tensor qkv = testing::values({2, 96, 3 * 4 * 32}, DType::Float32, 9, -2, 2).to(DType::BFloat16);
  auto heads = [](const Tensor& x, int i) { return x.narrow(2, i * 128, 128).reshape({2, 96, 4, 32}).transpose(1, 2); };
  Tensor gq = testing::values({2, 4, 96, 32}, DType::Float32, 5, -1, 1).to(DType::BFloat16);
  Tensor onGpu = qkv.to(dev);
  Result got = run(heads(onGpu, 0), heads(onGpu, 1), heads(onGpu, 2), gq.to(dev), true);
  Result want = run(heads(qkv, 0).to(DType::Float32), heads(qkv, 1).to(DType::Float32),
                    heads(qkv, 2).to(DType::Float32), gq.to(DType::Float32), true);
  EXPECT_LT(relError(got.out, want.out), 1.5e-2);
  EXPECT_LT(relError(got.dq, want.dq), 3e-2);
  EXPECT_LT(relError(got.dk, want.dk), 3e-2);
  EXPECT_LT(relError(got.dv, want.dv), 3e-2);
}

TEST(CudaAttention, TheFusedPathHoldsNoScoreMatrix) {
  COHORT_REQUIRE_GPU();
  const Device dev = Device::cuda();
  const int64_t t = 2048;
  Tensor q = testing::values({1, 2, t, 64}, DType::Float32, 1).to(DType::BFloat16).to(dev);
  Tensor k = testing::values({1, 2, t, 64}, DType::Float32, 2).to(DType::BFloat16).to(dev);
  Tensor v = testing::values({1, 2, t, 64}, DType::Float32, 3).to(DType::BFloat16).to(dev);
  cuda::synchronize();
  resetPeakMemory(dev);
  const int64_t before = memoryStats(dev).bytesLive;
  Tensor out = F::scaledDotProductAttention(q, k, v, {.causal = true});
  cuda::synchronize();
  const int64_t grew = memoryStats(dev).peakBytes - before;
  // The output (512 KiB) and lse (16 KiB); a [2, 2048, 2048] bf16 score matrix alone would be 16 MiB.
  EXPECT_LT(grew, 2 << 20) << "the forward allocated " << grew << " bytes";
  EXPECT_EQ(out.dtype(), DType::BFloat16);
}

TEST(CudaAttention, MasksDropoutAndOtherHeadSizesTakeTheUnfusedFormula) {
  COHORT_REQUIRE_GPU();
  const Device dev = Device::cuda();
  Tensor q = testing::values({2, 33, 48}, DType::Float32, 1, -2, 2).to(DType::BFloat16);  // e = 48: no kernel
  Tensor k = testing::values({2, 40, 48}, DType::Float32, 2, -2, 2).to(DType::BFloat16);
  Tensor v = testing::values({2, 40, 48}, DType::Float32, 3, -2, 2).to(DType::BFloat16);
  Tensor mask = gt(testing::values({33, 40}, DType::Float32, 4, 0, 1), scalarTensor(0.3));
  for (bool withMask : {false, true}) {
    F::SdpaOptions o;
    if (withMask) o.mask = mask;
    Tensor want = F::scaledDotProductAttention(q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), o);
    if (withMask) o.mask = mask.to(dev);
    Tensor got = F::scaledDotProductAttention(q.to(dev), k.to(dev), v.to(dev), o);
    EXPECT_LT(relError(got, want), 2e-2) << (withMask ? "mask" : "e = 48");
  }
}

}  // namespace
}  // namespace cohort
