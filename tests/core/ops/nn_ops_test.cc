// nn functional ops: softmax, logSoftmax, crossEntropy, nllLoss, mseLoss, layerNorm, embedding,
// dropout. Values against PyTorch, gradients by finite differences (float64), typed errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <cohort/cohort.h>

#include "core/gradcheck.h"

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace cohort::nn::functional;
using cohort::testing::gradcheck;
using cohort::testing::randArg;

namespace {

// Inputs shared with the torch script that printed the expected values (/usr/bin/python3,
// torch 1.13, torch.nn.functional):
//   L = round(2 * cos(0.7 * arange(20)), 4).reshape(4, 5);  t = [1, 0, 4, -100]
//   X = round(3 * sin(1.3 * arange(24)), 4).reshape(2, 3, 4) with X[1, 2, 3] = X[1, 2, 0]
const std::vector<double> kL = {2.0,    1.5297, 0.3399,  -1.0097, -1.8844, -1.8729, -0.9805, 0.373,  1.5511, 1.9997,
                                1.5078, 0.3067, -1.0386, -1.8954, -1.8609, -0.9511, 0.406,   1.5721, 1.9989, 1.4855};
const std::vector<double> kX = {0.0,     2.8907,  1.5465,  -2.0633, -2.6504, 0.6454,  2.9956,  0.9573,
                                -2.4835, -2.286,  1.2605,  2.9603,  0.3233,  -2.7874, -1.8145, 1.8166,
                                2.7864,  -0.3259, -2.9607, -1.2581, 2.2877,  2.482,   -0.9598, 2.2877};

Tensor L(DType dt = DType::Float64) { return fromVector<double>(kL, {4, 5}).to(dt); }
Tensor T() { return fromVector<int64_t>({1, 0, 4, -100}); }
Tensor X() { return fromVector<double>(kX, {2, 3, 4}); }

}  // namespace

// ---- softmax ------------------------------------------------------------------------------

TEST(NnOps, SoftmaxValues) {
  expectNear(softmax(L(), 1),
             {0.530559879661, 0.33150166283,  0.100870026894, 0.026160033985, 0.01090839663,
              0.010911189892, 0.02663400701,  0.10309891408,  0.334885558913, 0.524470330105,
              0.691119695018, 0.207932400392, 0.054158396896, 0.022991234366, 0.023798273327,
              0.020879705874, 0.08111579295,  0.26033719027,  0.398926694295, 0.238740616612});  // torch
  expectNear(L().softmax(0),
             {0.593697228544, 0.588002659213, 0.174997276991, 0.028887029335, 0.012543500929,
              0.01234769583,  0.047776384551, 0.180886617757, 0.373976395746, 0.609904676666,
              0.362915299801, 0.173076115264, 0.044091649631, 0.01191374389,  0.012841764067,
              0.031039775825, 0.191144840973, 0.60002445562,  0.585222831028, 0.364710058339});  // torch
  expectNear(logSoftmax(L(), -1),
             {-0.63382245329,  -1.10412245329,  -2.29392245329,  -3.64352245329,  -4.51822245329,
              -4.517966420706, -3.625566420706, -2.272066420706, -1.093966420706, -0.645366420706,
              -0.369442250218, -1.570542250218, -2.915842250218, -3.772642250218, -3.738142250218,
              -3.868977602544, -2.511877602544, -1.345777602544, -0.918977602544, -1.432377602544});  // torch
  // Stable for huge logits; half types compute in float.
  Tensor big = fromVector<float>({1000, 1000, -1000});
  expectNear(softmax(big, 0), {0.5, 0.5, 0}, 1e-7);
  expectNear(logSoftmax(big, 0), {-std::log(2.0), -std::log(2.0), -2000 - std::log(2.0)}, 1e-6);
  for (DType dt : {DType::Float16, DType::BFloat16, DType::Float32}) {
    Tensor s = softmax(L(dt), 1);
    EXPECT_EQ(s.dtype(), dt);
    expectNear(s, softmax(L(dt).to(DType::Float64), 1).toVector<double>(), dt == DType::Float32 ? 1e-6 : 1e-2);
  }
  // 0-dim and empty.
  EXPECT_EQ(softmax(scalarTensor(3.0), 0).item<float>(), 1.0f);
  EXPECT_EQ(logSoftmax(scalarTensor(3.0), 0).item<float>(), 0.0f);
  EXPECT_EQ(softmax(zeros({0, 4}), 1).sizes(), (Shape{0, 4}));
  // Errors.
  expectError<IndexError>([] { softmax(L(), 2); }, {"softmax", "[4, 5]"});
  expectError<ValueError>([] { logSoftmax(fromVector<int64_t>({1, 2}), 0); }, {"logSoftmax", "int64"});
}

// The fused float32 row kernel (last dim): lane tails (lengths around the 32/64-lane widths),
// several rows (the next row is prefetched), against float64; -inf entries, an all -inf row
// (NaN, as torch) and a NaN entry (its row NaN, the others untouched). Tolerance: x - max is
// rounded to float before exp, a relative error up to |x - max| * 6e-8 in tiny probabilities.
TEST(NnOps, SoftmaxRowKernel) {
  Generator g(17);
  for (int64_t R : {1, 2, 31, 32, 33, 63, 64, 65, 100, 4096, 5003}) {
    Tensor x = randn({3, R}, {.dtype = DType::Float32}, &g) * 8;
    Tensor x64 = x.to(DType::Float64);
    std::vector<double> want = softmax(x64, 1).toVector<double>();
    std::vector<float> got = softmax(x, 1).toVector<float>();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 5e-6 * want[i] + 1e-30) << R << " " << i;
    std::vector<double> wantL = logSoftmax(x64, -1).toVector<double>();
    std::vector<float> gotL = logSoftmax(x, -1).toVector<float>();
    for (size_t i = 0; i < gotL.size(); ++i)
      ASSERT_NEAR(gotL[i], wantL[i], 1e-6 * std::abs(wantL[i]) + 2e-6) << R << " " << i;
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(3 * 40, 0.0f);
  v[3] = -inf;                                // row 0: one -inf -> 0 there
  for (int k = 40; k < 80; ++k) v[k] = -inf;  // row 1: all -inf -> NaN
  v[80 + 39] = nan;                           // row 2: NaN -> NaN row
  Tensor t = fromVector(v, {3, 40});
  std::vector<float> s = softmax(t, 1).toVector<float>();
  EXPECT_EQ(s[3], 0.0f);
  EXPECT_NEAR(s[0], 1.0 / 39, 1e-7);
  for (int k = 40; k < 120; ++k) EXPECT_TRUE(std::isnan(s[k])) << k;
  std::vector<float> ls = logSoftmax(t, 1).toVector<float>();
  EXPECT_EQ(ls[3], -inf);
  EXPECT_NEAR(ls[0], -std::log(39.0), 1e-6);
  for (int k = 80; k < 120; ++k) EXPECT_TRUE(std::isnan(ls[k])) << k;
}

TEST(NnOpsGrad, Softmax) {
  Tensor a = randArg({3, 4, 5}, 1);
  for (int64_t d : {0, 1, 2}) {
    EXPECT_TRUE(gradcheck([d](const std::vector<Tensor>& in) { return softmax(in[0], d); }, {a}));
    EXPECT_TRUE(gradcheck([d](const std::vector<Tensor>& in) { return logSoftmax(in[0], d); }, {a}));
  }
  // Non-contiguous inputs.
  Tensor b = randArg({5, 4}, 2);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0].t(), 1); }, {b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return logSoftmax(in[0].slice(0, 0, 5, 2), 0); }, {b}));
  Tensor c = randArg({1, 4}, 3);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return logSoftmax(in[0].expand({3, 4}), 1); }, {c}));
}

// ---- losses -----------------------------------------------------------------------------------

TEST(NnOps, CrossEntropyValues) {
  // torch: F.cross_entropy(L, t, reduction=...) and with label_smoothing=0.1; t[3] is ignored.
  expectNear(crossEntropy(L(), T()), {3.120077041405});
  expectNear(crossEntropy(L(), T(), {.reduction = Reduction::Sum}), {9.360231124214});
  expectNear(crossEntropy(L(), T(), {.reduction = Reduction::None}),
             {1.10412245329, 4.517966420706, 3.738142250218, 0.0});
  expectNear(crossEntropy(L(), T(), {.labelSmoothing = 0.1}), {3.052837041405});
  expectNear(crossEntropy(L(), T(), {.reduction = Reduction::Sum, .labelSmoothing = 0.1}), {9.158511124214});
  expectNear(crossEntropy(L(), T(), {.reduction = Reduction::None, .labelSmoothing = 0.1}),
             {1.23758245329, 4.309268420706, 3.611660250218, 0.0});
  // All targets ignored: the mean is NaN, as torch.
  EXPECT_TRUE(std::isnan(crossEntropy(L(), full({4}, -100, {.dtype = DType::Int64})).item<double>()));
  // A custom ignoreIndex; int32 targets.
  expectNear(crossEntropy(L(), fromVector<int32_t>({1, 0, 4, 2}), {.ignoreIndex = 2}), {3.120077041405});
  // Spatial: input [2, 3, 2] (L's first 12 values), target [[0, 2], [1, 1]].
  Tensor L3 = L().flatten().slice(0, 0, 12).reshape({2, 3, 2});
  Tensor t3 = fromVector<int64_t>({0, 2, 1, 1}, {2, 2});
  expectNear(crossEntropy(L3, t3), {1.1835387124});                           // torch
  expectNear(crossEntropy(L3, t3, {.labelSmoothing = 0.2}), {1.3030937124});  // torch
  expectNear(crossEntropy(L3, t3, {.reduction = Reduction::None}),
             {0.19118229121, 3.508940346859, 0.711554583765, 0.322477627767});  // torch
  // Unbatched: input [C], target [].
  expectNear(crossEntropy(L().select(0, 0), scalarTensor(1, {.dtype = DType::Int64})), {1.10412245329});
  // float32 and half inputs.
  expectNear(crossEntropy(L(DType::Float32), T()), {3.120077041405}, 1e-6);
  expectNear(crossEntropy(L(DType::BFloat16), T()), {3.120077041405}, 2e-2);
}

TEST(NnOps, NllMseValues) {
  // torch: F.nll_loss(L, t, reduction=...)
  expectNear(nllLoss(L(), T()), {0.7347});
  expectNear(nllLoss(L(), T(), Reduction::Sum), {2.2041});
  expectNear(nllLoss(L(), T(), Reduction::None), {-1.5297, 1.8729, 1.8609, 0.0});
  // torch: F.mse_loss(L, L.flip(0)) and reduction='sum'.
  Tensor Lf = cat({L().select(0, 3), L().select(0, 2), L().select(0, 1), L().select(0, 0)}).reshape({4, 5});
  expectNear(mseLoss(L(), Lf), {7.375913521});
  expectNear(mseLoss(L(), Lf, Reduction::Sum), {147.51827042});
  EXPECT_EQ(mseLoss(L(), Lf, Reduction::None).sizes(), (Shape{4, 5}));
}

TEST(NnOps, LossErrors) {
  expectError<IndexError>(
      [] {
        crossEntropy(L(), fromVector<int64_t>({1, 5, 0, 0}));
      },
      {"crossEntropy", "label 5", "5 classes"});
  expectError<IndexError>([] { crossEntropy(L(), fromVector<int64_t>({-1, 0, 0, 0})); }, {"label -1"});
  expectError<IndexError>([] { nllLoss(L(), fromVector<int64_t>({1, 7, 0, 0})); }, {"nllLoss", "label 7"});
  expectError<ValueError>([] { crossEntropy(L(), fromVector<int64_t>({1, 2, 3})); }, {"crossEntropy", "[4, 5]", "[3]"});
  expectError<ValueError>(
      [] {
        crossEntropy(L(), fromVector<int64_t>({1, 2, 3, 0}, {2, 2}));
      },
      {"crossEntropy", "[4, 5]", "[2, 2]"});
  expectError<ValueError>([] { crossEntropy(L(), fromVector<float>({1, 2, 3, 0})); }, {"crossEntropy", "float32"});
  expectError<ValueError>([] { crossEntropy(L(), T(), {.labelSmoothing = 1.5}); }, {"labelSmoothing", "1.5"});
  expectError<ValueError>([] { mseLoss(L(), zeros({3}, {.dtype = DType::Float64})); }, {"mseLoss", "[4, 5]", "[3]"});
  EXPECT_THROW(crossEntropy(Tensor(), T()), ValueError);
}

TEST(NnOpsGrad, Losses) {
  Tensor a = randArg({4, 5}, 5);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    EXPECT_TRUE(
        gradcheck([r](const std::vector<Tensor>& in) { return crossEntropy(in[0], T(), {.reduction = r}); }, {a}));
    EXPECT_TRUE(gradcheck(
        [r](const std::vector<Tensor>& in) {
          return crossEntropy(in[0], T(), {.reduction = r, .labelSmoothing = 0.3});
        },
        {a}));
    EXPECT_TRUE(gradcheck([r](const std::vector<Tensor>& in) { return nllLoss(in[0], T(), r); }, {a}));
    EXPECT_TRUE(
        gradcheck([r](const std::vector<Tensor>& in) { return mseLoss(in[0], in[1], r); }, {a, randArg({4, 5}, 6)}));
  }
  // Spatial targets and a transposed (non-contiguous) input.
  Tensor s = randArg({2, 2, 3}, 7);  // viewed as [2, 3, 2] through transpose(1, 2)
  Tensor t3 = fromVector<int64_t>({0, 2, 1, -100}, {2, 2});
  EXPECT_TRUE(gradcheck(
      [t3](const std::vector<Tensor>& in) { return crossEntropy(in[0].transpose(1, 2), t3, {.labelSmoothing = 0.1}); },
      {s}));
  // Broadcast target in mse.
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mseLoss(in[0], in[1]); }, {a, randArg({5}, 8)}));
}

// ---- layer norm -------------------------------------------------------------------------------

TEST(NnOps, LayerNormValues) {
  Tensor w = fromVector<double>({0.5, 1.0, 1.5, 2.0, -1.0, 0.25, 0.75, 1.25, -0.5, 0.1, 0.2, 0.3}, {3, 4});
  Tensor b = arange(12, {.dtype = DType::Float64}).reshape({3, 4}) * 0.1;
  // torch: F.layer_norm(X, (3, 4), w, b) and F.layer_norm(X, (4,)).
  expectNear(layerNorm(X(), {3, 4}, w, b),
             {-0.074880227378, 1.327078367108,  1.080254968407,  -1.965018222381, 1.812144518641,  0.539410802666,
              1.557781634607,  1.082751261635,  1.466325070167,  0.776141900116,  1.090123000546,  1.478068642661,
              0.040896127038,  -1.343041175989, -1.249203270345, 1.927585383269,  -0.889178765662, 0.440890257977,
              -0.54599330205,  -0.16674238176,  0.277639445339,  1.013996498866,  0.890565942755,  1.413416332797},
             1e-8);
  expectNear(layerNorm(X(), {4}),
             {-0.321901920311, 1.24601902167,   0.516922494804,  -1.441039596164, -1.550258592007, 0.078281913204,
              1.239576862942,  0.232399815861,  -1.008051985876, -0.923200029216, 0.600483334303,  1.330768680789,
              0.521731781306,  -1.207018806794, -0.666336180002, 1.35162320549,   1.544699180169,  0.054431196555,
              -1.207194637467, -0.391935739256, 0.531379868262,  0.666643995608,  -1.729403732132, 0.531379868262},
             1e-8);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor y = layerNorm(X().to(dt), {4}, ones({4}, {.dtype = dt}), zeros({4}, {.dtype = dt}));
    EXPECT_EQ(y.dtype(), dt);
    expectNear(y, layerNorm(X(), {4}).toVector<double>(), dt == DType::Float32 ? 1e-5 : 2e-2);
  }
  EXPECT_EQ(layerNorm(zeros({0, 4}), {4}).sizes(), (Shape{0, 4}));
  expectError<ValueError>([] { layerNorm(X(), {3}); }, {"layerNorm", "[3]", "[2, 3, 4]"});
  expectError<ValueError>([] { layerNorm(X(), {}); }, {"layerNorm"});
  expectError<ValueError>([] { layerNorm(X(), {4}, ones({3}, {.dtype = DType::Float64})); },
                          {"layerNorm", "weight", "[3]", "[4]"});
  expectError<ValueError>([] { layerNorm(X(), {4}, ones({4})); }, {"layerNorm", "float32", "float64"});
}

TEST(NnOpsGrad, LayerNorm) {
  Tensor x = randArg({3, 2, 4}, 11), w = randArg({2, 4}, 12), b = randArg({2, 4}, 13);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return layerNorm(in[0], {2, 4}, in[1], in[2]);
      },
      {x, w, b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0], {4}); }, {x}));
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0], {4}, in[1]); }, {x, randArg({4}, 14)}));
  // Transposed input, bias only.
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return layerNorm(in[0].transpose(0, 2), {3}, Tensor(), in[1]); },
                {x, randArg({3}, 15)}));
}

// ---- embedding ---------------------------------------------------------------------------------

TEST(NnOps, Embedding) {
  Tensor w = arange(12, {.dtype = DType::Float64}).reshape({4, 3});
  Tensor idx = fromVector<int64_t>({3, 0, 3, 1}, {2, 2});
  Tensor e = embedding(idx, w);
  EXPECT_EQ(e.sizes(), (Shape{2, 2, 3}));
  EXPECT_EQ(e.toVector<double>(), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5}));
  EXPECT_EQ(embedding(fromVector<int32_t>({2}), w).toVector<double>(), (std::vector<double>{6, 7, 8}));
  EXPECT_EQ(embedding(scalarTensor(1, {.dtype = DType::Int64}), w).sizes(), (Shape{3}));
  EXPECT_EQ(embedding(zeros({0}, {.dtype = DType::Int64}), w).sizes(), (Shape{0, 3}));
  // Backward scatter-adds: row 3 is used twice.
  Tensor wg = w.clone().setRequiresGrad();
  embedding(idx, wg).sum().backward();
  EXPECT_EQ(wg.grad().toVector<double>(), (std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0, 0, 2, 2, 2}));
  Tensor ww = randArg({5, 3}, 21);
  EXPECT_TRUE(gradcheck([idx](const std::vector<Tensor>& in) { return embedding(idx, in[0]); }, {ww}));
  EXPECT_TRUE(
      gradcheck([idx](const std::vector<Tensor>& in) { return embedding(idx, in[0].t()); }, {randArg({3, 5}, 22)}));
  expectError<IndexError>([&] { embedding(fromVector<int64_t>({0, 4}), w); }, {"embedding", "index 4", "[4, 3]"});
  expectError<IndexError>([&] { embedding(fromVector<int64_t>({-1}), w); }, {"embedding", "-1"});
  expectError<ValueError>([&] { embedding(fromVector<float>({0, 1}), w); }, {"embedding", "float32"});
  expectError<ValueError>([&] { embedding(idx, zeros({4})); }, {"embedding", "[4]"});
}

// ---- dropout -----------------------------------------------------------------------------------

TEST(NnOps, Dropout) {
  Tensor x = ones({10000});
  Generator g1(42), g2(42);
  Tensor a = dropout(x, 0.3, true, &g1), b = dropout(x, 0.3, true, &g2);
  EXPECT_EQ(a.toVector<float>(), b.toVector<float>());  // same seed, same mask
  std::vector<float> v = a.toVector<float>();
  int kept = 0;
  for (float f : v) {
    EXPECT_TRUE(f == 0.0f || std::abs(f - 1.0f / 0.7f) < 1e-6f) << f;
    kept += f != 0.0f;
  }
  EXPECT_NEAR(kept / 10000.0, 0.7, 0.03);
  EXPECT_NE(dropout(x, 0.3, true, &g1).toVector<float>(), v);  // the generator advanced
  // Identity when p = 0 or not training; zeros when p = 1.
  EXPECT_TRUE(dropout(x, 0.0, true).isSameAs(x));
  EXPECT_TRUE(dropout(x, 0.5, false).isSameAs(x));
  EXPECT_EQ(sum(dropout(x, 1.0, true)).item<float>(), 0.0f);
  // The default generator is used when none is given, and is reproducible through manualSeed.
  manualSeed(7);
  Tensor d1 = dropout(x, 0.5, true);
  manualSeed(7);
  EXPECT_EQ(dropout(x, 0.5, true).toVector<float>(), d1.toVector<float>());
  // Backward: the gradient is the mask times the scale.
  Tensor xg = ones({1000}, {.dtype = DType::Float64}).setRequiresGrad();
  Generator g3(5);
  Tensor y = dropout(xg, 0.25, true, &g3);
  y.sum().backward();
  EXPECT_EQ(xg.grad().toVector<double>(), y.detach().toVector<double>());
  Tensor xg1 = ones({4}, {.dtype = DType::Float64}).setRequiresGrad();
  dropout(xg1, 1.0, true).sum().backward();
  EXPECT_EQ(xg1.grad().toVector<double>(), (std::vector<double>{0, 0, 0, 0}));
  expectError<ValueError>([&] { dropout(x, 1.5, true); }, {"dropout", "1.5"});
  expectError<ValueError>([&] { dropout(x, -0.1, true); }, {"dropout", "-0.1"});
  EXPECT_THROW(dropout(x, std::nan(""), true), ValueError);
}
