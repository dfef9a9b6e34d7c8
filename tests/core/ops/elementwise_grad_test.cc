// Finite-difference gradient checks (float64) for every differentiable elementwise op, with
// broadcast and non-contiguous (transposed, sliced, expanded) inputs.
#include <gtest/gtest.h>

#include <cohort/cohort.h>

#include "core/gradcheck.h"

using namespace cohort;
using cohort::testing::gradcheck;
using cohort::testing::randArg;
using In = std::vector<Tensor>;

namespace {

// A positive float64 leaf in [0.5, 2.5).
Tensor posArg(const Shape& shape, uint64_t seed) {
  Tensor t = randArg(shape, seed).detach() + 1.5;
  return t.setRequiresGrad();
}

// Three layouts of the same kind of input: contiguous, transposed, and a strided slice.
struct Layouts {
  Tensor contiguous, transposed, sliced;
};
Layouts layouts(bool positive, uint64_t seed) {
  auto arg = [&](const Shape& s, uint64_t k) { return positive ? posArg(s, k) : randArg(s, k); };
  return {arg({3, 4}, seed), arg({4, 3}, seed + 1), arg({3, 8}, seed + 2)};
}

template <typename F>
void checkUnary(const char* name, F f, bool positive = false) {
  SCOPED_TRACE(name);
  Layouts l = layouts(positive, 11);
  EXPECT_TRUE(gradcheck([&](const In& in) { return f(in[0]); }, {l.contiguous}));
  EXPECT_TRUE(gradcheck([&](const In& in) { return f(in[0].t()); }, {l.transposed}));
  EXPECT_TRUE(gradcheck([&](const In& in) { return f(in[0].slice(1, 1, 8, 2)); }, {l.sliced}));
  // Expanded: one row broadcast to four, so its gradient sums over them.
  Tensor row = positive ? posArg({1, 3}, 17) : randArg({1, 3}, 17);
  EXPECT_TRUE(gradcheck([&](const In& in) { return f(in[0].expand({4, 3})); }, {row}));
}

}  // namespace

TEST(ElementwiseGrad, UnaryMath) {
  checkUnary("exp", [](const Tensor& x) { return exp(x); });
  checkUnary(
      "log", [](const Tensor& x) { return log(x); }, true);
  checkUnary(
      "sqrt", [](const Tensor& x) { return sqrt(x); }, true);
  checkUnary(
      "rsqrt", [](const Tensor& x) { return rsqrt(x); }, true);
  checkUnary("abs", [](const Tensor& x) { return abs(x); });
  checkUnary("pow scalar 3", [](const Tensor& x) { return pow(x, 3); });
  checkUnary("pow scalar 2", [](const Tensor& x) { return pow(x, 2); });
  checkUnary(
      "pow scalar -1.5", [](const Tensor& x) { return pow(x, -1.5); }, true);
  checkUnary(
      "pow scalar 0.5", [](const Tensor& x) { return pow(x, 0.5); }, true);
  checkUnary("clamp", [](const Tensor& x) { return clamp(x, -0.4, 0.5); });
  checkUnary("clamp min", [](const Tensor& x) { return clamp(x, -0.4, std::nullopt); });
}

TEST(ElementwiseGrad, Activations) {
  checkUnary("relu", [](const Tensor& x) { return relu(x); });
  checkUnary("sigmoid", [](const Tensor& x) { return sigmoid(x); });
  checkUnary("tanh", [](const Tensor& x) { return tanh(x); });
  checkUnary("silu", [](const Tensor& x) { return silu(x * 3.0); });
  checkUnary("gelu", [](const Tensor& x) { return gelu(x * 3.0); });
  checkUnary("gelu tanh", [](const Tensor& x) { return gelu(x * 3.0, true); });
}

TEST(ElementwiseGrad, PowTensorBroadcastAndViews) {
  Tensor a = posArg({3, 4}, 21), b = randArg({4}, 22);
  EXPECT_TRUE(gradcheck([](const In& in) { return pow(in[0], in[1]); }, {a, b}));
  Tensor at = posArg({4, 3}, 23), bc = randArg({3, 1}, 24);
  EXPECT_TRUE(gradcheck([](const In& in) { return pow(in[0].t(), in[1] * 2.0); }, {at, bc}));
}

TEST(ElementwiseGrad, MaximumMinimumWhere) {
  Tensor a = randArg({3, 4}, 31), b = randArg({4}, 32), c = randArg({4, 3}, 33);
  EXPECT_TRUE(gradcheck([](const In& in) { return maximum(in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const In& in) { return minimum(in[0].t().t(), in[1].t()); }, {a, c}));
  Tensor cond = gt(randArg({3, 1}, 34).detach(), zeros({}, {.dtype = DType::Float64}));
  Tensor cond2 =
      fromVector<bool>({true, false, false, true, true, false, true, false, true, true, false, false}, {3, 4});
  EXPECT_TRUE(gradcheck([&](const In& in) { return where(cond, in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([&](const In& in) { return where(cond2, in[0].t(), in[1].slice(1, 0, 4, 1)); },
                        {c, randArg({3, 4}, 35)}));
  // Ties split the gradient in half (as torch): d max(x, x) / dx = 1/2 + 1/2.
  Tensor x = fromVector<double>({1.0, 2.0}).setRequiresGrad();
  Tensor y = fromVector<double>({1.0, 3.0}).setRequiresGrad();
  maximum(x, y).sum().backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0.5, 0.0}));
  EXPECT_EQ(y.grad().toVector<double>(), (std::vector<double>{0.5, 1.0}));
}

TEST(ElementwiseGrad, ClampAtBoundsPassesGradient) {
  // torch: the gradient passes where min <= x <= max, bounds included.
  Tensor x = fromVector<double>({-1.0, 0.0, 1.0, 2.0}).setRequiresGrad();
  clamp(x, 0.0, 1.0).sum().backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0, 1, 1, 0}));
}

TEST(ElementwiseGrad, Float32GradientsMatchTorch) {
  // x = torch.tensor([-2., -0.5, 0.3, 1.7], requires_grad=True); f(x).sum().backward(); x.grad
  // (torch 1.13, float32)
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    std::vector<double> want;
  };
  std::vector<Case> cases = {
      {"gelu",
       [](const Tensor& x) { return gelu(x); },
       {-0.08523187041282654, 0.1325049102306366, 0.7323277592658997, 1.115317940711975}},
      {"gelu tanh",
       [](const Tensor& x) { return gelu(x, true); },
       {-0.08609922230243683, 0.1326301097869873, 0.7322955131530762, 1.1159145832061768}},
      {"silu",
       [](const Tensor& x) { return silu(x); },
       {-0.09078425168991089, 0.260038822889328, 0.6477800607681274, 1.0675644874572754}},
      {"sigmoid",
       [](const Tensor& x) { return sigmoid(x); },
       {0.10499358177185059, 0.23500370979309082, 0.24445831775665283, 0.13060569763183594}},
      {"tanh",
       [](const Tensor& x) { return tanh(x); },
       {0.07065081596374512, 0.7864477038383484, 0.9151369333267212, 0.12500987946987152}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = fromVector<float>({-2.0f, -0.5f, 0.3f, 1.7f}).setRequiresGrad();
    c.f(x).sum().backward();
    std::vector<float> g = x.grad().toVector<float>();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], c.want[i], 2e-6 * std::max(1.0, std::abs(c.want[i])));
  }
}
