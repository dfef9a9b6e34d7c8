// conv2d and 2-D pooling (core/ops/conv.cc): values against PyTorch, gradients against
// PyTorch and finite differences (float64, including non-contiguous inputs), and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include <cohort/cohort.h>

#include "core/gradcheck.h"
#include "core/test_util.h"

using namespace cohort;
using namespace cohort::nn::functional;
using cohort::testing::expectError;
using cohort::testing::gradcheck;
using cohort::testing::randArg;

namespace {

void expectValues(const Tensor& t, const std::vector<double>& want, double tol) {
  std::vector<double> got = t.to(DType::Float64).toVector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// sin(i*a + b) for i in [0, n): the same inputs the Python reference script builds.
Tensor seq(const Shape& shape, double a, double b = 0.0, DType dt = DType::Float64) {
  int64_t n = shapeNumel(shape);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<double>(i) * a + b);
  return fromVector<double>(v, shape).to(dt);
}

// Reference values below come from /usr/bin/python3 (torch 1.13), with
//   def seq(n, a, b=0.0): return torch.tensor([math.sin(i*a + b) for i in range(n)], dtype=torch.float64)
//   x = seq(2*4*7*6, 0.37).view(2,4,7,6); w = seq(6*2*3*3, 0.91, 0.3).view(6,2,3,3); b = seq(6, 1.7, 0.1)
//   y = F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2)
const std::vector<double> kConvRef = {
    1.0632348432,  1.6240619580,  -1.2733552872, -0.5512252485, 3.1295073608,  0.6697546816,  -0.5624567239,
    -2.1684862703, 3.8009442168,  3.4710164199,  -3.1167153347, -2.0207815434, 1.0903014501,  3.0430880703,
    -3.4023131255, -3.6080696991, 3.0217259496,  3.7662211252,  -0.7187388195, -1.7376721868, 0.9483133676,
    1.3496838441,  -1.9278887478, -4.1294983271, 0.2045098931,  -0.3598378200, 0.1614409506,  -0.0175140494,
    -1.0225448618, 1.1934666619,  1.1549228362,  3.0571227449,  -0.4447216961, -0.5660078199, 4.2845490674,
    3.0178557031,  -0.0589275303, 2.2786717911,  0.1807038574,  -0.5848694089, 2.8398400101,  2.1592127859,
    1.8559355744,  -0.9947456983, 1.9281352701,  2.8277940213,  -2.5256279044, -3.0986903354, -1.5725873988,
    0.5514445227,  -1.9252192897, -2.5677113973, 2.3862761462,  3.9638094086,  0.8970085591,  1.0215656323,
    0.1357464413,  -0.0656391136, -1.3199910947, -2.6983371325, 0.2149730011,  -1.8315010783, -0.4937763551,
    0.5853405331,  -0.6708375108, -0.2625378342, -0.4772004629, 2.6012005703,  1.3933327269,  -0.0942189099,
    3.1261905400,  3.8655024595};

Conv2dOptions refOpts() { return {.stride = {2, 2}, .padding = {1, 1}, .dilation = {2, 2}, .groups = 2}; }

}  // namespace

TEST(Conv2d, StridePaddingDilationGroupsMatchTorch) {
  Tensor x = seq({2, 4, 7, 6}, 0.37), w = seq({6, 2, 3, 3}, 0.91, 0.3), b = seq({6}, 1.7, 0.1);
  Tensor y = conv2d(x, w, b, refOpts());
  EXPECT_EQ(y.sizes(), (Shape{2, 6, 3, 2}));
  expectValues(y, kConvRef, 1e-9);
  // float32 and the half types (computed in float32, rounded once).
  expectValues(conv2d(x.to(DType::Float32), w.to(DType::Float32), b.to(DType::Float32), refOpts()), kConvRef, 1e-5);
  expectValues(conv2d(x.to(DType::BFloat16), w.to(DType::BFloat16), b.to(DType::BFloat16), refOpts()), kConvRef, 0.1);
  // Non-contiguous input: the same values from a transposed-back view.
  Tensor xt = x.transpose(2, 3).contiguous().transpose(2, 3);
  ASSERT_FALSE(xt.isContiguous());
  expectValues(conv2d(xt, w, b, refOpts()), kConvRef, 1e-9);
}

TEST(Conv2d, GradientsMatchTorch) {
  // Same tensors as above; r = cos(0.23 i) shaped like y; (y*r).sum().backward().
  Tensor x = seq({2, 4, 7, 6}, 0.37).setRequiresGrad();
  Tensor w = seq({6, 2, 3, 3}, 0.91, 0.3).setRequiresGrad();
  Tensor b = seq({6}, 1.7, 0.1).setRequiresGrad();
  Tensor y = conv2d(x, w, b, refOpts());
  Tensor r = seq({2, 6, 3, 2}, 0.23, std::numbers::pi / 2);  // sin(t + pi/2) = cos(t)
  (y * r).sum().backward();
  expectValues(b.grad(), {-0.0156904507, -5.9032335736, -2.2232977938, 5.0599774899, 4.1424544688, -3.4888204718},
               1e-9);
  EXPECT_NEAR(w.grad().sum().item<double>(), -1.0275958372, 1e-9);
  EXPECT_NEAR(w.grad().select(0, 1).select(0, 1).select(0, 2).select(0, 0).item<double>(), -1.0799159994, 1e-9);
  EXPECT_NEAR(x.grad().sum().item<double>(), 0.2294373919, 1e-9);
  EXPECT_NEAR(x.grad().select(0, 1).select(0, 3).select(0, 3).select(0, 5).item<double>(), 0.5024139003, 1e-9);
  EXPECT_NEAR(x.grad().select(0, 0).select(0, 2).select(0, 1).select(0, 1).item<double>(), -1.4722225794, 1e-9);
  // Stride 2 with dilation 2 and padding 1 reads only odd rows: even rows get no gradient.
  EXPECT_EQ(x.grad().select(0, 1).select(0, 3).select(0, 4).select(0, 5).item<double>(), 0.0);
}

TEST(Conv2d, PlainMatchesTorch) {
  // x2 = seq(75, 0.5).view(1,3,5,5); w2 = seq(24, 0.3).view(2,3,2,2); F.conv2d(x2, w2)
  Tensor y = conv2d(seq({1, 3, 5, 5}, 0.5), seq({2, 3, 2, 2}, 0.3));
  EXPECT_EQ(y.sizes(), (Shape{1, 2, 4, 4}));
  expectValues(y,
               {1.8789497943,  1.8414657061,  1.3531265897,  0.5334948922,  -1.2649686653, -1.8034739228, -1.9004258656,
                -1.5320872769, 0.1478933458,  1.0482175319,  1.6919015084,  1.9213489885,  1.0280010458,  0.1239283560,
                -0.8104863175, -1.5464656738, -1.5108796575, -1.8672396666, -1.7664342831, -1.2331441805, 0.5346983782,
                1.3364213203,  1.8109417139,  1.8420804171,  0.6541392736,  -0.2740911503, -1.1352145013, -1.7183977504,
                -1.5828173836, -0.8972485700, 0.0079979862,  0.9112863564},
               1e-9);
}

TEST(Conv2d, OneByOneEqualsLinear) {
  // A 1x1 convolution (the no-im2col path) is a linear map over channels at each pixel. The
  // default options here once arrived with padding (1, 0) (a GCC 12 AVX-512 miscompile of a
  // by-value option struct; see functional.h).
  Tensor x = seq({2, 3, 4, 5}, 0.41), w = seq({4, 3, 1, 1}, 0.77);
  Tensor y = conv2d(x, w);
  Tensor ref = linear(x.permute({0, 2, 3, 1}), w.view({4, 3})).permute({0, 3, 1, 2});
  expectValues(y, ref.toVector<double>(), 1e-12);
}

TEST(Conv2d, Gradcheck) {
  Tensor x = randArg({2, 4, 5, 6}), w = randArg({6, 2, 3, 2}, 2), b = randArg({6}, 3);
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], refOpts()); }, {x, w, b}));
  Conv2dOptions o{.stride = {1, 2}, .padding = {2, 0}, .dilation = {1, 1}, .groups = 1};
  Tensor w1 = randArg({3, 4, 2, 3}, 4);
  EXPECT_TRUE(gradcheck([o](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], Tensor(), o); }, {x, w1}));
  // Non-contiguous input and weight (transposed views), 1x1 kernel path.
  Tensor xt = randArg({2, 3, 4, 3}, 5), wt = randArg({1, 1, 3, 2}, 6);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0].transpose(2, 3), in[1].permute({3, 2, 0, 1}));
      },
      {xt, wt}));
  // Expanded bias.
  Tensor bs = randArg({1}, 7);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0].slice(3, 0, 6, 2), in[1], in[2].expand({6}), {.padding = {1, 1}, .groups = 2});
      },
      {x, w, bs}));
}

TEST(Conv2d, BadInputs) {
  Tensor x = zeros({1, 4, 5, 5}), w = zeros({6, 2, 3, 3});
  expectError<ValueError>([&] { conv2d(x, w); }, {"conv2d", "channel", "[1, 4, 5, 5]", "[6, 2, 3, 3]"});
  expectError<ValueError>([&] { conv2d(x, w, Tensor(), {.groups = 3}); }, {"conv2d", "divisible", "groups 3"});
  expectError<ValueError>(
      [&] {
        conv2d(x, zeros({6, 2, 6, 3}), Tensor(), {.groups = 2});
      },
      {"conv2d", "larger than the padded input", "[1, 4, 5, 5]", "[6, 2, 6, 3]"});
  expectError<ValueError>(
      [&] {
        conv2d(x, w, Tensor(), {.dilation = {3, 1}, .groups = 2});
      },
      {"conv2d", "larger than the padded input", "(7, 3)"});
  expectError<ValueError>([&] { conv2d(zeros({4, 5, 5}), w); }, {"conv2d", "4-D", "[4, 5, 5]"});
  expectError<ValueError>([&] { conv2d(x, w, zeros({5}), {.groups = 2}); }, {"conv2d", "bias", "[6]", "[5]"});
  expectError<ValueError>([&] { conv2d(x, w.to(DType::Float64), Tensor(), {.groups = 2}); },
                          {"conv2d", "float32", "float64"});
  expectError<ValueError>(
      [&] {
        conv2d(x, w, Tensor(), {.stride = {0, 1}, .groups = 2});
      },
      {"conv2d", "stride (0, 1)"});
}

// ---- pooling ------------------------------------------------------------------------------------

// p = seq(60, 0.77).view(1,2,5,6)
//   F.max_pool2d(p, kernel_size=(3,2), stride=(2,2), padding=(1,1))
//   F.avg_pool2d(p, kernel_size=(3,2), stride=(2,2), padding=(1,1)) and (3, stride=1, padding=1)
TEST(MaxPool2d, MatchesTorch) {
  Tensor p = seq({1, 2, 5, 6}, 0.77);
  Tensor m = maxPool2d(p, {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(m.sizes(), (Shape{1, 2, 3, 4}));
  expectValues(m, {0.0000000000, 0.9995258306,  0.9881682339,  0.8161854685, 0.9618345123, 0.8809960087,
                   0.9881682339, 0.8161854685,  0.9618345123,  0.9209237649, 0.9324546662, -0.3324040478,
                   0.5263770496, -0.2139981622, 0.8660560122,  0.9697815625, 0.7980627991, 0.9924109920,
                   0.9999999958, 0.1534646050,  -0.6736317698, 0.7179745928, 0.9999999958, 0.9924335591},
               1e-9);
  // 3-D input and float32; stride defaults to the kernel.
  Tensor q = fromVector<float>({1, 5, 2, 0, 3, 4, 9, 8, 7, 6, 1, 2, 0, 0, -1, -2}, {1, 4, 4});
  EXPECT_EQ(maxPool2d(q, {.kernel = {2, 2}}).toVector<float>(), (std::vector<float>{5, 9, 7, 2}));
  // NaN propagates.
  Tensor n = fromVector<float>({1, NAN, 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(maxPool2d(n, {.kernel = {2, 2}}).item<float>()));
}

TEST(MaxPool2d, BackwardRoutesToArgmax) {
  Tensor q = fromVector<double>({1, 5, 2, 0, 3, 4, 9, 8, 7, 6, 1, 2, 0, 0, -1, -2}, {1, 1, 4, 4}).setRequiresGrad();
  maxPool2d(q, {.kernel = {2, 2}}).sum().backward();
  EXPECT_EQ(q.grad().toVector<double>(), (std::vector<double>{0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0}));
  // Overlapping windows accumulate on a shared maximum.
  Tensor s = fromVector<double>({0, 0, 0, 0, 9, 0, 0, 0, 0}, {1, 1, 3, 3}).setRequiresGrad();
  maxPool2d(s, {.kernel = {2, 2}, .stride = {1, 1}}).sum().backward();
  EXPECT_EQ(s.grad().toVector<double>()[4], 4.0);
}

TEST(MaxPool2d, Gradcheck) {
  // Distinct values keep the argmax stable under the finite-difference step.
  std::vector<double> v(180);
  for (int64_t i = 0; i < 180; ++i) v[i] = static_cast<double>((i * 97) % 180) * 0.1;  // a permutation
  Tensor x = fromVector<double>(v, {2, 3, 5, 6}).setRequiresGrad();
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return maxPool2d(in[0], {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}});
      },
      {x}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return maxPool2d(in[0].transpose(2, 3), {.kernel = {2, 2}});
      },
      {x}));
}

TEST(AvgPool2d, MatchesTorch) {
  Tensor p = seq({1, 2, 5, 6}, 0.77);
  Tensor a = avgPool2d(p, {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(a.sizes(), (Shape{1, 2, 3, 4}));
  expectValues(a, {-0.1659558622, 0.1322857336,  0.3985624663,  0.0275933886,  0.0249712696,  -0.2078450830,
                   -0.1487021164, 0.0679606693,  0.1001055237,  0.4158109096,  -0.0064284324, -0.2068086683,
                   -0.0614683864, -0.4122677017, -0.0701498475, 0.1872076946,  0.1084680132,  0.2200820952,
                   -0.1157727242, -0.1356556397, -0.2245665443, -0.1680984818, 0.3754476230,  0.1705222052},
               1e-9);
  Tensor a2 = avgPool2d(p, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}});
  EXPECT_EQ(a2.sizes(), (Shape{1, 2, 5, 6}));
  expectValues(a2.select(1, 1).select(1, 4),  // the last row of channel 1
               {-0.2571806045, -0.2617766841, -0.0111952287, 0.2457023358, 0.3639798855, 0.2631094597}, 1e-9);
  expectValues(a2.select(1, 0).select(1, 0),
               {-0.1198525119, -0.0224467524, 0.2372630276, 0.3631140704, 0.2841039032, 0.1350313648}, 1e-9);
  Tensor h = avgPool2d(p.to(DType::Float16), {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(h.dtype(), DType::Float16);
  expectValues(h, a.toVector<double>(), 2e-3);
}

TEST(AvgPool2d, Gradcheck) {
  Tensor x = randArg({2, 2, 5, 4});
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return avgPool2d(in[0], {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}});
      },
      {x}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return avgPool2d(in[0].permute({1, 0, 3, 2}).slice(3, 0, 5, 2),
                         {.kernel = {2, 2}, .stride = {1, 1}, .padding = {1, 1}});
      },
      {x}));
}

TEST(Pool2d, BadInputs) {
  Tensor x = zeros({1, 1, 3, 3});
  expectError<ValueError>(
      [&] {
        maxPool2d(x, {.kernel = {4, 4}});
      },
      {"maxPool2d", "larger than the padded input", "[1, 1, 3, 3]"});
  expectError<ValueError>(
      [&] {
        avgPool2d(x, {.kernel = {2, 2}, .padding = {2, 0}});
      },
      {"avgPool2d", "padding (2, 0)", "half"});
  expectError<ValueError>([&] { avgPool2d(zeros({3, 3}), {.kernel = {2, 2}}); }, {"avgPool2d", "[3, 3]"});
  expectError<ValueError>([&] { maxPool2d(x, {.kernel = {0, 2}}); }, {"maxPool2d", "positive"});
  expectError<ValueError>(
      [&] {
        maxPool2d(zeros({1, 1, 3, 3}, {.dtype = DType::Int64}), {.kernel = {2, 2}});
      },
      {"maxPool2d", "int64"});
}
