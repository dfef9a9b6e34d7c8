// Fused scaled-dot-product attention (core/ops/attention.cc): forward and backward against the
// unfused formula (matmul, softmax, where) in float64 over causal, bool and additive masks,
// Tq != Tk, lengths that are not multiples of the tile sizes and several head dims; finite
// differences; dropout reproducibility, its keep mask and statistics; half types; fully masked
// rows; memory linear in the sequence length; every argument error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/tensor/allocator.h>

#include "core/gradcheck.h"
#include "core/test_util.h"

using namespace cohort;
using namespace cohort::nn::functional;
using cohort::testing::expectError;
using cohort::testing::gradcheck;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor randn64(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, {.dtype = DType::Float64}, &g);
}

// softmax(q k^T * scale + mask) v written with the ordinary ops, [..., Tq, Tk] materialised.
// keep: the dropout multipliers (0 or 1/(1-p)), or undefined.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                 std::optional<double> scaleOpt = std::nullopt, const Tensor& keep = Tensor()) {
  const double scale = scaleOpt.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  Tensor att = matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t tq = q.size(-2), tk = k.size(-2);
    std::vector<double> m(static_cast<size_t>(tq * tk), 0.0);
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = i + 1; j < tk; ++j) m[static_cast<size_t>(i * tk + j)] = -kInf;
    att = att + fromVector<double>(m, {tq, tk}).to(att.dtype());
  }
  if (mask.defined()) {
    if (mask.dtype() == DType::Bool) att = where(mask, att, full({}, -kInf, {.dtype = att.dtype()}));
    else att = att + mask.to(att.dtype());
  }
  att = softmax(att, -1);
  if (keep.defined()) att = att * keep.to(att.dtype());
  return matmul(att, v);
}

double maxAbsDiff(const Tensor& a, const Tensor& b) {
  return (a.to(DType::Float64) - b.to(DType::Float64)).abs().max().item<double>();
}

struct Grads {
  Tensor out, dq, dk, dv;
};

// Output and input gradients of sum(fn(q, k, v) * w) for fresh leaf copies of q, k, v.
template <typename F>
Grads run(F&& fn, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w) {
  Tensor ql = q.detach().clone().setRequiresGrad(), kl = k.detach().clone().setRequiresGrad();
  Tensor vl = v.detach().clone().setRequiresGrad();
  Tensor out = fn(ql, kl, vl);
  (out.to(DType::Float64) * w).sum().backward();
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

void expectClose(const Grads& a, const Grads& b, double tol, const std::string& what) {
  EXPECT_LE(maxAbsDiff(a.out, b.out), tol) << what << ": output";
  EXPECT_LE(maxAbsDiff(a.dq, b.dq), tol) << what << ": dq";
  EXPECT_LE(maxAbsDiff(a.dk, b.dk), tol) << what << ": dk";
  EXPECT_LE(maxAbsDiff(a.dv, b.dv), tol) << what << ": dv";
}

struct Case {
  Shape batch;
  int64_t tq, tk, e, ev;
  bool causal = false;
  int mask = 0;  // 0 none, 1 bool key padding [B, 1, 1, Tk], 2 bool [Tq, Tk], 3 additive [..., Tq, Tk]
};

std::string describe(const Case& c) {
  return fmt::format("batch {} tq {} tk {} e {} ev {} causal {} mask {}", shapeStr(c.batch), c.tq, c.tk, c.e, c.ev,
                     c.causal, c.mask);
}

// A mask of the given kind that leaves at least one key per query row.
Tensor makeMask(const Case& c, uint64_t seed) {
  Generator g(seed);
  const int64_t B = c.batch.empty() ? 1 : c.batch[0];
  switch (c.mask) {
    case 1: {  // padding: batch entry b keeps its first tk - b keys
      std::vector<uint8_t> m;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < c.tk; ++j) m.push_back(j < std::max<int64_t>(1, c.tk - b * 3) ? 1 : 0);
      Shape s = c.batch;
      for (size_t i = 1; i < s.size(); ++i) s[i] = 1;
      s.push_back(1);
      s.push_back(c.tk);
      return fromVector<uint8_t>(m, s).ne(zeros({}, {.dtype = DType::UInt8}));
    }
    case 2: {  // random, key 0 always kept
      Tensor r = rand({c.tq, c.tk}, {.dtype = DType::Float64}, &g);
      Tensor keep = r.gt(full({}, 0.4, {.dtype = DType::Float64}));
      Tensor first = zeros({c.tq, c.tk}, {.dtype = DType::Float64});
      first.slice(1, 0, 1).fill_(1.0);
      return where(first.gt(zeros({}, {.dtype = DType::Float64})), first.gt(zeros({}, {.dtype = DType::Float64})),
                   keep);
    }
    case 3: {  // arbitrary additive values, some -inf (never a whole row)
      Shape s = c.batch;
      s.push_back(c.tq);
      s.push_back(c.tk);
      Tensor m = randn(s, {.dtype = DType::Float64}, &g) * 2.0;
      Tensor drop = rand(s, {.dtype = DType::Float64}, &g).gt(full({}, 0.8, {.dtype = DType::Float64}));
      drop.slice(-1, 0, 1).fill_(false);
      return m.maskedFill(drop, -kInf);
    }
    default: return Tensor();
  }
}

// A case's float64 q, k, v, an output weighting w (all standard normal) and its mask, from seeds
// seed + 1, seed + 2, ... (seed is advanced past them).
struct CaseInputs {
  Tensor q, k, v, w, mask;
};
CaseInputs caseInputs(const Case& c, uint64_t& seed) {
  auto shape = [&](int64_t t, int64_t e) {
    Shape s = c.batch;
    s.push_back(t);
    s.push_back(e);
    return s;
  };
  CaseInputs in;
  in.q = randn64(shape(c.tq, c.e), ++seed);
  in.k = randn64(shape(c.tk, c.e), ++seed);
  in.v = randn64(shape(c.tk, c.ev), ++seed);
  in.w = randn64(shape(c.tq, c.ev), ++seed);
  in.mask = makeMask(c, ++seed);
  return in;
}

}  // namespace

// ---- against the unfused formula ------------------------------------------------------------------

TEST(Attention, MatchesUnfusedFormulaFloat64) {
  const std::vector<Case> cases = {
      {{2, 3}, 7, 7, 8, 8},
      {{2, 3}, 7, 7, 8, 8, true},
      {{1, 2}, 1, 1, 8, 8, true},
      {{1, 2}, 1, 9, 8, 5},
      {{2, 2}, 65, 65, 64, 64, true},
      {{1, 6}, 130, 130, 64, 64, true},
      {{2, 1}, 130, 65, 8, 5},
      {{2, 1}, 65, 130, 8, 3, true},  // causal with Tq != Tk: aligned at the top left
      {{2, 1}, 130, 65, 8, 3, true},
      {{3, 2}, 65, 130, 16, 16, false, 1},
      {{3, 2}, 130, 7, 8, 8, false, 1},
      {{2, 2}, 65, 130, 8, 8, false, 2},
      {{2, 2}, 130, 65, 64, 32, false, 3},
      {{2}, 7, 130, 8, 8, false, 3},
      {{}, 65, 65, 8, 8, true},  // no batch dims
      {{2, 2, 2}, 9, 70, 4, 6, false, 3},
      // More keys than one forward block holds: the online softmax rescales what earlier blocks summed.
      {{1, 2}, 30, 600, 8, 8},
      {{1, 1}, 600, 600, 8, 4, true},
      {{1, 1}, 20, 1100, 8, 4, false, 3},
  };
  uint64_t seed = 10;
  for (const Case& c : cases) {
    const CaseInputs in = caseInputs(c, seed);
    const Tensor &q = in.q, &k = in.k, &v = in.v, &w = in.w, &mask = in.mask;
    Grads fused =
        run([&](const Tensor& a, const Tensor& b,
                const Tensor& d) { return scaledDotProductAttention(a, b, d, {.mask = mask, .causal = c.causal}); },
            q, k, v, w);
    Grads ref =
        run([&](const Tensor& a, const Tensor& b, const Tensor& d) { return reference(a, b, d, mask, c.causal); }, q, k,
            v, w);
    EXPECT_EQ(fused.out.sizes(), ref.out.sizes()) << describe(c);
    expectClose(fused, ref, 1e-12, describe(c));
    // The op-by-op formula (the path of devices without the fused kernel) agrees too.
    Grads unfused =
        run([&](const Tensor& a, const Tensor& b,
                const Tensor& d) { return scaledDotProductAttentionMath(a, b, d, {.mask = mask, .causal = c.causal}); },
            q, k, v, w);
    expectClose(unfused, ref, 1e-12, describe(c) + " (unfused path)");
  }
}

TEST(Attention, ScaleOption) {
  Tensor q = randn64({2, 9, 8}, 1), k = randn64({2, 11, 8}, 2), v = randn64({2, 11, 4}, 3), w = randn64({2, 9, 4}, 4);
  for (double scale : {0.05, 1.0, 2.5}) {
    Grads fused = run([&](const Tensor& a, const Tensor& b,
                          const Tensor& d) { return scaledDotProductAttention(a, b, d, {.scale = scale}); },
                      q, k, v, w);
    Grads ref = run([&](const Tensor& a, const Tensor& b,
                        const Tensor& d) { return reference(a, b, d, Tensor(), false, scale); },
                    q, k, v, w);
    expectClose(fused, ref, 1e-12, fmt::format("scale {}", scale));
  }
}

// Strided head views of one projection (as CausalSelfAttention makes them) and batch dims that
// broadcast (one key/value head for every query head): read in place, gradients summed back.
TEST(Attention, StridedAndBroadcastInputs) {
  const int64_t B = 2, T = 33, H = 3, hs = 8, C = H * hs;
  Tensor qkv = randn64({B, T, 3 * C}, 5);
  Tensor w = randn64({B, H, T, hs}, 6);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, hs}).transpose(1, 2); };
  auto viaViews = [&](auto&& attn) {
    Tensor x = qkv.detach().clone().setRequiresGrad();
    std::vector<Tensor> parts = x.split(C, 2);
    Tensor out = attn(heads(parts[0]), heads(parts[1]), heads(parts[2]));
    (out * w).sum().backward();
    return std::pair<Tensor, Tensor>{out.detach(), x.grad()};
  };
  auto fused = viaViews([](const Tensor& q, const Tensor& k, const Tensor& v) {
    return scaledDotProductAttention(q, k, v, {.causal = true});
  });
  auto ref =
      viaViews([](const Tensor& q, const Tensor& k, const Tensor& v) { return reference(q, k, v, Tensor(), true); });
  EXPECT_LE(maxAbsDiff(fused.first, ref.first), 1e-12);
  EXPECT_LE(maxAbsDiff(fused.second, ref.second), 1e-12);

  // k, v [B, 1, Tk, E] broadcast over the heads of q [B, H, Tq, E]; a transposed (column-major) q.
  Tensor q = randn64({B, H, hs, T}, 7).transpose(-2, -1), k = randn64({B, 1, 20, hs}, 8), v = randn64({B, 1, 20, 5}, 9);
  Tensor w2 = randn64({B, H, T, 5}, 10);
  Grads f = run([](const Tensor& a, const Tensor& b, const Tensor& d) { return scaledDotProductAttention(a, b, d); }, q,
                k, v, w2);
  Grads r = run([](const Tensor& a, const Tensor& b, const Tensor& d) { return reference(a, b, d, Tensor(), false); },
                q, k, v, w2);
  EXPECT_EQ(f.dk.sizes(), k.sizes());
  expectClose(f, r, 1e-12, "broadcast key/value heads");
}

TEST(Attention, FiniteDifferences) {
  Tensor q = cohort::testing::randArg({1, 2, 5, 3}, 1), k = cohort::testing::randArg({1, 2, 7, 3}, 2);
  Tensor v = cohort::testing::randArg({1, 2, 7, 4}, 3);
  Tensor additive = randn64({5, 7}, 4);
  Tensor boolMask = randn64({1, 1, 5, 7}, 5).gt(zeros({}, {.dtype = DType::Float64}));
  boolMask.select(-1, 2).fill_(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return scaledDotProductAttention(in[0], in[1], in[2]); },
                        {q, k, v}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) { return scaledDotProductAttention(in[0], in[1], in[2], {.causal = true}); },
      {q, k, v}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return scaledDotProductAttention(in[0], in[1], in[2], {.mask = additive, .scale = 0.7});
      },
      {q, k, v}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return scaledDotProductAttention(in[0], in[1], in[2], {.mask = boolMask}); },
      {q, k, v}));
  // Dropout: a generator in the same state for every evaluation gives the same mask each time.
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        Generator g(77);
        return scaledDotProductAttention(in[0], in[1], in[2], {.dropout = 0.4, .generator = &g});
      },
      {q, k, v}));
}

// ---- dropout -----------------------------------------------------------------------------------

TEST(Attention, DropoutIsReproducibleAndMatchesItsKeepMask) {
  const Shape qs = {2, 3, 70, 16}, ks = {2, 3, 90, 16}, vs = {2, 3, 90, 8};
  Tensor q = randn64(qs, 1), k = randn64(ks, 2), v = randn64(vs, 3), w = randn64({2, 3, 70, 8}, 4);
  for (bool causal : {false, true}) {
    auto withSeed = [&](uint64_t seed) {
      return run(
          [&](const Tensor& a, const Tensor& b, const Tensor& d) {
            Generator g(seed);
            return scaledDotProductAttention(a, b, d, {.causal = causal, .dropout = 0.3, .generator = &g});
          },
          q, k, v, w);
    };
    Grads a = withSeed(11), b = withSeed(11), c = withSeed(12);
    expectClose(a, b, 0.0, "same seed");  // bit for bit
    EXPECT_GT(maxAbsDiff(a.out, c.out), 1e-3) << "a different seed must drop other weights";
    EXPECT_GT(maxAbsDiff(a.dq, c.dq), 1e-3);

    // The keep mask the op applies, from a generator in the same state.
    Generator gm(11);
    Tensor keep = scaledDotProductAttentionDropoutMask({2, 3, 70, 90}, 0.3, &gm);
    EXPECT_EQ(keep.dtype(), DType::Bool);
    Tensor z = where(keep, full({}, 1.0 / 0.7, {.dtype = DType::Float64}), zeros({}, {.dtype = DType::Float64}));
    Grads ref = run([&](const Tensor& x, const Tensor& y,
                        const Tensor& d) { return reference(x, y, d, Tensor(), causal, std::nullopt, z); },
                    q, k, v, w);
    expectClose(a, ref, 1e-12, causal ? "dropout, causal, against its keep mask" : "dropout against its keep mask");
    // The unfused path draws the same mask.
    Grads unfused = run(
        [&](const Tensor& x, const Tensor& y, const Tensor& d) {
          Generator g(11);
          return scaledDotProductAttentionMath(x, y, d, {.causal = causal, .dropout = 0.3, .generator = &g});
        },
        q, k, v, w);
    expectClose(unfused, ref, 1e-12, "unfused dropout");
  }
  // Each call with dropout takes one draw from the generator; without dropout none.
  Generator g(3);
  scaledDotProductAttention(q, k, v, {.generator = &g});
  EXPECT_EQ(g.state().offset, 0u);
  scaledDotProductAttention(q, k, v, {.dropout = 0.1, .generator = &g});
  EXPECT_EQ(g.state().offset, 1u);
  // The default generator follows manualSeed.
  manualSeed(5);
  Tensor d1 = scaledDotProductAttention(q, k, v, {.dropout = 0.5});
  manualSeed(5);
  Tensor d2 = scaledDotProductAttention(q, k, v, {.dropout = 0.5});
  EXPECT_EQ(maxAbsDiff(d1, d2), 0.0);
}

TEST(Attention, DropoutMaskStatistics) {
  for (double p : {0.1, 0.5, 0.9}) {
    Generator g(21);
    Tensor keep = scaledDotProductAttentionDropoutMask({4, 3, 128, 200}, p, &g).to(DType::Float64);
    const double n = static_cast<double>(keep.numel());
    const double kept = keep.sum().item<double>() / n;
    EXPECT_NEAR(kept, 1.0 - p, 5.0 * std::sqrt(p * (1 - p) / n)) << "p " << p;
    // Neighbours along keys, queries and batch entries are independent: both kept with (1-p)^2.
    const double q2 = (1 - p) * (1 - p), tol = 0.01;
    EXPECT_NEAR((keep.slice(-1, 0, 199) * keep.slice(-1, 1, 200)).mean().item<double>(), q2, tol) << "p " << p;
    EXPECT_NEAR((keep.slice(-2, 0, 127) * keep.slice(-2, 1, 128)).mean().item<double>(), q2, tol) << "p " << p;
    EXPECT_NEAR((keep.slice(1, 0, 2) * keep.slice(1, 1, 3)).mean().item<double>(), q2, tol) << "p " << p;
    EXPECT_NEAR((keep.slice(0, 0, 3) * keep.slice(0, 1, 4)).mean().item<double>(), q2, tol) << "p " << p;
  }
  // The output's expectation is the dropout-free output: average over many seeds.
  Tensor q = randn64({1, 1, 4, 8}, 1), k = randn64({1, 1, 6, 8}, 2), v = randn64({1, 1, 6, 3}, 3);
  Tensor acc = zeros({1, 1, 4, 3}, {.dtype = DType::Float64});
  const int draws = 4000;
  Generator g(9);
  for (int i = 0; i < draws; ++i) acc = acc + scaledDotProductAttention(q, k, v, {.dropout = 0.25, .generator = &g});
  EXPECT_LE(maxAbsDiff(acc / static_cast<double>(draws), scaledDotProductAttention(q, k, v)), 0.05);
  EXPECT_EQ(scaledDotProductAttentionDropoutMask({2, 3}, 0.0).to(DType::Float64).sum().item<double>(), 6.0);
}

// ---- dtypes, special rows, memory ----------------------------------------------------------------

// float16 is converted to float32 and computed there. bfloat16, where blas::hgemm runs natively,
// stays bfloat16 in the tile products (accumulated in float32), with the weights and score
// gradients rounded to bfloat16 before the products that take them, as FlashAttention kernels do;
// scores, softmax and gradients are float32. Against the float64 formula on the same rounded
// inputs, every case (causal, masks, dropout, lengths across tile edges) is within a few bfloat16
// roundings of the largest value; and where bfloat16 runs natively it differs from computing in
// float32, so the bfloat16 products really ran.
TEST(Attention, HalfTypes) {
  struct HalfCase {
    Case c;
    double dropout;
  };
  const std::vector<HalfCase> cases = {
      {{{2, 2}, 40, 70, 16, 8, true}, 0.0},       {{{1, 3}, 130, 200, 16, 8, true}, 0.0},
      {{{3, 2}, 65, 130, 16, 16, false, 1}, 0.0}, {{{2, 2}, 130, 65, 16, 8, false, 2}, 0.0},
      {{{2, 2}, 130, 65, 64, 32, false, 3}, 0.0}, {{{2, 2}, 70, 90, 16, 8, true}, 0.3},
      {{{1, 2}, 40, 600, 16, 8, false}, 0.0},     {{{1, 1}, 600, 600, 16, 8, true}, 0.0},
  };
  uint64_t seed = 70;
  for (const HalfCase& hc : cases) {
    const Case& c = hc.c;
    const double p = hc.dropout;
    const CaseInputs in = caseInputs(c, seed);
    const Tensor &q = in.q, &k = in.k, &v = in.v, &w = in.w, &mask = in.mask;
    const uint64_t dropSeed = ++seed;
    auto fused = [&](const Tensor& a, const Tensor& b, const Tensor& d) {
      Generator g(dropSeed);
      return scaledDotProductAttention(a, b, d, {.mask = mask, .causal = c.causal, .dropout = p, .generator = &g});
    };
    Shape attn = c.batch;
    attn.push_back(c.tq);
    attn.push_back(c.tk);
    Generator gm(dropSeed);
    Tensor z = p > 0 ? where(scaledDotProductAttentionDropoutMask(attn, p, &gm),
                             full({}, 1.0 / (1.0 - p), {.dtype = DType::Float64}), zeros({}, {.dtype = DType::Float64}))
                     : Tensor();
    for (DType dt : {DType::Float16, DType::BFloat16}) {
      const std::string what = describe(c) + fmt::format(" dropout {} {}", p, dtypeName(dt));
      Tensor qh = q.to(dt), kh = k.to(dt), vh = v.to(dt);
      Grads h = run(fused, qh, kh, vh, w);
      EXPECT_EQ(h.out.dtype(), dt);
      EXPECT_EQ(h.dq.dtype(), dt);
      EXPECT_EQ(h.dk.dtype(), dt);
      EXPECT_EQ(h.dv.dtype(), dt);
      Tensor q64 = qh.to(DType::Float64), k64 = kh.to(DType::Float64), v64 = vh.to(DType::Float64);
      Grads ref = run([&](const Tensor& a, const Tensor& b,
                          const Tensor& d) { return reference(a, b, d, mask, c.causal, std::nullopt, z); },
                      q64, k64, v64, w);
      const double rounding = dt == DType::BFloat16 ? 1.0 / 256 : 1.0 / 2048;
      for (auto [got, want, name] :
           {std::tuple{h.out, ref.out, "output"}, {h.dq, ref.dq, "dq"}, {h.dk, ref.dk, "dk"}, {h.dv, ref.dv, "dv"}}) {
        const double scale = want.abs().max().item<double>();
        EXPECT_LE(maxAbsDiff(got, want), 4 * rounding * scale) << what << ": " << name;
      }
      if (dt == DType::BFloat16 && blas::hgemmNative(blas::HalfType::BFloat16)) {
        Grads f32 = run(fused, qh.to(DType::Float32), kh.to(DType::Float32), vh.to(DType::Float32), w);
        EXPECT_GT(maxAbsDiff(h.out.to(DType::Float32), f32.out.to(DType::Float32)), 0.0) << what;
      }
    }
  }
}

// Under bfloat16 autocast the fused op computes scores and weights in float32, while the math
// formula runs op by op, each by autocast's policy: the matrix products in bfloat16, so the scores
// and weights are rounded to bfloat16 (PyTorch 1.13's explicit attention under torch.autocast).
// It must equal those ops written out, bit for bit, forward and backward, and differ from the
// fused op by more than the output's own rounding.
TEST(Attention, MathFormulaUnderAutocastRoundsEachOpByThePolicy) {
  Generator g(7);
  Tensor q = randn({2, 3, 37, 16}, {}, &g), k = randn({2, 3, 37, 16}, {}, &g), v = randn({2, 3, 37, 16}, {}, &g);
  Tensor w = randn({2, 3, 37, 16}, {}, &g);
  auto written = [](const Tensor& a, const Tensor& b, const Tensor& d) {
    Tensor att = matmul(a, b.transpose(-2, -1)) * (1.0 / 4.0);
    EXPECT_EQ(att.dtype(), DType::BFloat16);
    Tensor rows = arange(37, {.dtype = DType::Int64}).unsqueeze(1),
           cols = arange(37, {.dtype = DType::Int64}).unsqueeze(0);
    att = where(le(cols, rows), att, full({}, -kInf, {.dtype = att.dtype()}));
    return matmul(softmax(att, -1), d);
  };
  auto math = [](const Tensor& a, const Tensor& b, const Tensor& d) {
    return scaledDotProductAttentionMath(a, b, d, {.causal = true});
  };
  auto fused = [](const Tensor& a, const Tensor& b, const Tensor& d) {
    return scaledDotProductAttention(a, b, d, {.causal = true});
  };
  auto runAutocast = [&](auto fn) {
    amp::Autocast ac(DeviceType::CPU, DType::BFloat16);
    return run(fn, q, k, v, w);
  };
  Grads byHand = runAutocast(written), m = runAutocast(math), f = runAutocast(fused);
  EXPECT_EQ(m.out.dtype(), DType::BFloat16);
  EXPECT_EQ(m.dq.dtype(), DType::Float32);  // gradients come back in the leaves' dtype
  expectClose(m, byHand, 0.0, "math formula against the ops written out");
  const double diff = (m.out.to(DType::Float32) - f.out.to(DType::Float32)).abs().max().item<double>();
  EXPECT_GT(diff, 0.0) << "the math formula under autocast should round the scores, the fused op does not";
}

// A query row whose keys are all masked out gives NaN, as PyTorch's softmax over -inf does, and
// the gradients it reaches are NaN too; other rows are untouched. No keys at all gives zeros.
TEST(Attention, FullyMaskedRowsAndEmptyKeys) {
  Tensor q = randn64({1, 2, 4, 8}, 1), k = randn64({1, 2, 5, 8}, 2), v = randn64({1, 2, 5, 3}, 3);
  std::vector<uint8_t> m(4 * 5, 1);
  for (int j = 0; j < 5; ++j) m[static_cast<size_t>(2 * 5 + j)] = 0;  // row 2 attends to nothing
  Tensor mask = fromVector<uint8_t>(m, {4, 5}).ne(zeros({}, {.dtype = DType::UInt8}));
  for (bool additive : {false, true}) {
    Tensor mk = additive ? zeros({4, 5}, {.dtype = DType::Float64})
                               .maskedFill(mask.eq(full({}, false, {.dtype = DType::Bool})), -kInf)
                         : mask;
    Grads f = run([&](const Tensor& a, const Tensor& b,
                      const Tensor& d) { return scaledDotProductAttention(a, b, d, {.mask = mk}); },
                  q, k, v, zeros({1, 2, 4, 3}, {.dtype = DType::Float64}) + 1.0);
    Grads r = run([&](const Tensor& a, const Tensor& b, const Tensor& d) { return reference(a, b, d, mk, false); }, q,
                  k, v, zeros({1, 2, 4, 3}, {.dtype = DType::Float64}) + 1.0);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 4; ++i) {
        std::vector<double> row = f.out.select(1, h).select(1, i).contiguous().toVector<double>();
        std::vector<double> rrow = r.out.select(1, h).select(1, i).contiguous().toVector<double>();
        for (size_t e = 0; e < row.size(); ++e) {
          EXPECT_EQ(std::isnan(row[e]), i == 2) << "head " << h << " row " << i;
          EXPECT_EQ(std::isnan(rrow[e]), i == 2);
          if (i != 2) {
            EXPECT_NEAR(row[e], rrow[e], 1e-12);
          }
        }
        std::vector<double> dq = f.dq.select(1, h).select(1, i).contiguous().toVector<double>();
        for (double x : dq) EXPECT_EQ(std::isnan(x), i == 2);
      }
  }
  // Tk == 0: an empty sum of values (zeros), and zero gradients for the query.
  Tensor k0 = zeros({1, 2, 0, 8}, {.dtype = DType::Float64}), v0 = zeros({1, 2, 0, 3}, {.dtype = DType::Float64});
  Grads e = run([](const Tensor& a, const Tensor& b, const Tensor& d) { return scaledDotProductAttention(a, b, d); }, q,
                k0, v0, zeros({1, 2, 4, 3}, {.dtype = DType::Float64}) + 1.0);
  EXPECT_EQ(e.out.sizes(), (Shape{1, 2, 4, 3}));
  EXPECT_EQ(e.out.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(e.dq.abs().sum().item<double>(), 0.0);
  // Tq == 0: an empty result.
  EXPECT_EQ(scaledDotProductAttention(zeros({1, 0, 8}), zeros({1, 5, 8}), zeros({1, 5, 2})).sizes(), (Shape{1, 0, 2}));
}

// Forward + backward keeps q, k, v, the output, one float per query row and tiles: memory grows
// with the sequence length, not with its square (the [T, T] weights are never held).
TEST(Attention, PeakMemoryIsLinearInSequenceLength) {
  auto peakFor = [](int64_t T) {
    Tensor q = randn({1, 2, T, 32}).setRequiresGrad(), k = randn({1, 2, T, 32}).setRequiresGrad();
    Tensor v = randn({1, 2, T, 32}).setRequiresGrad(), w = randn({1, 2, T, 32});
    resetPeakMemory();
    const int64_t base = memoryStats().bytesLive;
    Tensor out = scaledDotProductAttention(q, k, v, {.causal = true});
    (out * w).sum().backward();
    return memoryStats().peakBytes - base;
  };
  const int64_t small = peakFor(512), large = peakFor(2048);
  const int64_t weights = 2 * 2048 * 2048 * 4;  // one float32 [H, T, T] attention matrix
  EXPECT_LT(large, weights / 4) << "peak " << large << " bytes at T = 2048";
  EXPECT_LT(static_cast<double>(large) / static_cast<double>(small), 4.0 * 1.5)
      << "peak " << small << " bytes at T = 512, " << large << " at T = 2048";
}

TEST(Attention, ThreadCountDoesNotChangeResults) {
  Tensor q = randn64({2, 3, 100, 16}, 1), k = randn64({2, 3, 100, 16}, 2), v = randn64({2, 3, 100, 16}, 3);
  Tensor w = randn64({2, 3, 100, 16}, 4);
  auto fused = [](const Tensor& a, const Tensor& b, const Tensor& d) {
    return scaledDotProductAttention(a, b, d, {.causal = true});
  };
  const int before = blas::numThreads();
  blas::setNumThreads(1);
  Grads one = run(fused, q, k, v, w);
  blas::setNumThreads(2);
  Grads two = run(fused, q, k, v, w);
  blas::setNumThreads(before);
  expectClose(one, two, 1e-13, "1 vs 2 threads");
}

// The softmax rows' exp runs 16 lanes at a time where the CPU has AVX-512, else the portable loop;
// float32 and bfloat16 results are the same bits either way (forward and backward, causal and
// masked rows of odd lengths).
TEST(Attention, AvxWidthDoesNotChangeResults) {
  if (!detail::simd::enabled()) GTEST_SKIP() << "no AVX-512 here: only the portable loop runs";
  Generator g(5);
  Tensor q = randn({2, 3, 77, 16}, {}, &g), k = randn({2, 3, 77, 16}, {}, &g), v = randn({2, 3, 77, 16}, {}, &g);
  Tensor w = randn({2, 3, 77, 16}, {.dtype = DType::Float64}, &g);
  Tensor mask = rand({77, 77}, {}, &g).gt(full({}, 0.3));
  mask.slice(1, 0, 1).fill_(true);
  for (DType dt : {DType::Float32, DType::BFloat16})
    for (bool causal : {true, false}) {
      auto fused = [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return scaledDotProductAttention(a, b, d, {.mask = causal ? Tensor() : mask, .causal = causal});
      };
      Grads wide = run(fused, q.to(dt), k.to(dt), v.to(dt), w);
      detail::simd::setEnabled(false);
      Grads portable = run(fused, q.to(dt), k.to(dt), v.to(dt), w);
      detail::simd::setEnabled(true);
      expectClose(wide, portable, 0.0, std::string(dtypeName(dt)) + (causal ? " causal" : " masked"));
    }
}

// With [B, H, T, E] inputs the output is laid out [B, T, H, E] (returned permuted), so putting the
// heads side by side again, transpose(1, 2) then a view, copies nothing; values are unaffected.
TEST(Attention, OutputLaysTheHeadsSideBySide) {
  Generator g(9);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float64}) {
    Tensor q = randn({2, 3, 9, 4}, {}, &g).to(dt), k = randn({2, 3, 9, 4}, {}, &g).to(dt),
           v = randn({2, 3, 9, 4}, {}, &g).to(dt);
    Tensor y = scaledDotProductAttention(q, k, v, {.causal = true});
    EXPECT_EQ(y.sizes(), (Shape{2, 3, 9, 4}));
    EXPECT_TRUE(y.transpose(1, 2).isContiguous()) << dtypeName(dt);
    Tensor side = y.transpose(1, 2).view({2, 9, 12});
    EXPECT_EQ(maxAbsDiff(side, y.transpose(1, 2).contiguous().reshape({2, 9, 12})), 0.0);
    // The gradients of q, k and v are laid out like q, k and v: for a multi-head layer's transposed
    // head views of [B, T, H, E] data (heads side by side) the gradient reaching that data is
    // contiguous, no copy made on the way; for contiguous [B, H, T, E] inputs it is contiguous.
    for (bool views : {true, false}) {
      std::vector<Tensor> leaves(3), seen(3);
      for (size_t i = 0; i < 3; ++i) {
        leaves[i] = (views ? randn({2, 9, 3, 4}, {}, &g) : randn({2, 3, 9, 4}, {}, &g)).to(dt).setRequiresGrad();
        leaves[i].registerHook([&seen, i](const Tensor& grad) -> std::optional<Tensor> {
          seen[i] = grad;
          return std::nullopt;
        });
      }
      auto in = [&](size_t i) { return views ? leaves[i].transpose(1, 2) : leaves[i]; };
      Tensor w = randn({2, 3, 9, 4}, {}, &g).to(dt);
      (scaledDotProductAttention(in(0), in(1), in(2), {.causal = true}) * w).sum().backward();
      for (const Tensor& grad : seen) {
        ASSERT_TRUE(grad.defined());
        EXPECT_EQ(grad.sizes(), leaves[0].sizes());
        EXPECT_TRUE(grad.isContiguous()) << dtypeName(dt) << (views ? " head views" : " contiguous inputs");
      }
    }
    // One batch dim, or three: contiguous as before.
    EXPECT_TRUE(
        scaledDotProductAttention(q.select(0, 0), k.select(0, 0), v.select(0, 0), {.causal = true}).isContiguous());
  }
}

// ---- errors ------------------------------------------------------------------------------------

TEST(Attention, ArgumentErrors) {
  Tensor q = zeros({2, 5, 8}), k = zeros({2, 6, 8}), v = zeros({2, 6, 4});
  for (bool math : {false, true}) {
    SCOPED_TRACE(math ? "scaledDotProductAttentionMath" : "scaledDotProductAttention");
    auto sdpa = [math](const Tensor& a, const Tensor& b, const Tensor& c, const SdpaOptions& o = {}) {
      return math ? scaledDotProductAttentionMath(a, b, c, o) : scaledDotProductAttention(a, b, c, o);
    };
    expectError<ValueError>([&] { sdpa(Tensor(), k, v); }, {"scaledDotProductAttention", "query is undefined"});
    expectError<ValueError>([&] { sdpa(q, Tensor(), v); }, {"key is undefined"});
    expectError<ValueError>([&] { sdpa(q.to(DType::Int64), k, v); }, {"query must be a floating-point", "int64"});
    expectError<ValueError>([&] { sdpa(zeros({8}), k, v); }, {"query must have at least 2 dims", "[8]"});
    expectError<ValueError>([&] { sdpa(q, zeros({6}), v); }, {"key must have at least 2 dims"});
    expectError<ValueError>([&] { sdpa(q, k, zeros({4})); }, {"value must have at least 2 dims"});
    expectError<ValueError>([&] { sdpa(q, k.to(DType::Float64), v); }, {"one dtype", "float32", "float64"});
    expectError<ValueError>([&] { sdpa(q, zeros({2, 6, 7}), v); }, {"key's last dim (7) must equal query's (8)"});
    expectError<ValueError>(
        [&] {
          sdpa(q, k, zeros({2, 9, 4}));
        },
        {"value's sequence length (9) must equal key's (6)"});
    expectError<ValueError>(
        [&] {
          sdpa(q, zeros({3, 6, 8}), zeros({3, 6, 4}));
        },
        {"batch dims", "cannot be broadcast", "[2, 5, 8]", "[3, 6, 8]"});
    for (double p : {-0.1, 1.0, std::nan("")})
      expectError<ValueError>([&] { sdpa(q, k, v, {.dropout = p}); }, {"dropout must be in [0, 1)"});
    expectError<ValueError>([&] { sdpa(q, k, v, {.scale = kInf}); }, {"scale must be finite"});
    expectError<ValueError>(
        [&] {
          sdpa(q, k, v, {.mask = zeros({5, 6}), .causal = true});
        },
        {"mask and causal cannot both be given"});
    expectError<ValueError>(
        [&] {
          sdpa(q, k, v, {.mask = zeros({5, 6}, {.dtype = DType::Int64})});
        },
        {"mask must be bool", "int64"});
    expectError<ValueError>(
        [&] {
          sdpa(q, k, v, {.mask = zeros({5, 7})});
        },
        {"mask of shape [5, 7] cannot be broadcast to the attention shape [2, 5, 6]"});
    expectError<ValueError>([&] { sdpa(q, k, v, {.mask = zeros({3, 5, 6})}); }, {"mask of shape [3, 5, 6]"});
    expectError<ValueError>([&] { sdpa(q, k, v, {.mask = zeros({1, 2, 5, 6})}); }, {"mask of shape [1, 2, 5, 6]"});
  }
  expectError<ValueError>([&] { scaledDotProductAttentionDropoutMask({5}, 0.1); }, {"at least 2 dims"});
  expectError<ValueError>([&] { scaledDotProductAttentionDropoutMask({5, 5}, 1.0); }, {"p must be in [0, 1)"});
}
