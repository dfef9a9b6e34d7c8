// Gradient sinks and gradient targets (autograd/engine.h, Ctx::gradSink): linear's backward writes
// its weight gradient straight into .grad (accumulating) or into the leaf's gradient target
// (overwriting) when that is the leaf's only gradient still to come and no hook must see it first.
// Every case is checked against the same gradient computed the plain way, and the cases where a
// sink must not be used (a leaf reached twice, a leaf with a hook) against their sums.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <cohort/cohort.h>
#include <cohort/core/autograd/engine.h>

#include "core/test_util.h"

using namespace cohort;
using cohort::testing::contains;
using cohort::testing::messageOf;

namespace {

std::vector<float> values(const Tensor& t) { return t.contiguous().toVector<float>(); }

void expectClose(const Tensor& got, const Tensor& want, float tol = 1e-5f) {
  ASSERT_EQ(got.sizes(), want.sizes());
  auto g = values(got), w = values(want);
  for (size_t i = 0; i < w.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * std::max(1.0f, std::abs(w[i]))) << "element " << i;
}

struct Case {
  Tensor x = randn({5, 4});
  Tensor c = randn({5, 3});  // loss = sum(linear(x, w, b) * c): dW = c^T x, db = sum of c's rows
  Tensor w = randn({3, 4}).setRequiresGrad();
  Tensor b = randn({3}).setRequiresGrad();
  Tensor dW() const { return mm(c.t(), x); }
  void backward() const { (linear(x, w, b) * c).sum().backward(); }
};

bool sameMemory(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dataPtr() == b.dataPtr() && a.sizes() == b.sizes();
}

}  // namespace

TEST(GradSink, FirstGradientWithoutTargetIsAFreshTensor) {
  Case k;
  k.backward();
  expectClose(k.w.grad(), k.dW());
  expectClose(k.b.grad(), k.c.sum({0}));
}

TEST(GradSink, LinearAccumulatesIntoAnExistingGradInPlace) {
  Case k;
  Tensor before = randn({3, 4});
  k.w.setGrad(before.clone());
  Tensor grad = k.w.grad();
  const uint32_t version = grad.version();
  k.backward();
  EXPECT_TRUE(sameMemory(k.w.grad(), grad)) << ".grad stays the same tensor";
  EXPECT_GT(grad.version(), version) << "the in-place write bumps .grad's version";
  expectClose(k.w.grad(), before + k.dW());
  // A second backward adds once more, not twice.
  k.backward();
  expectClose(k.w.grad(), before + k.dW() * 2.0);
}

TEST(GradSink, FirstGradientOverwritesTheTarget) {
  Case k;
  // NaN in the target: a sink that accumulated instead of overwriting would leave NaN.
  Tensor target = full({3, 4}, std::numeric_limits<double>::quiet_NaN());
  autograd::setGradTarget(k.w, target);
  k.backward();
  EXPECT_TRUE(sameMemory(k.w.grad(), target)) << ".grad is the target itself";
  expectClose(k.w.grad(), k.dW());
  // Later backwards accumulate into it; after .grad is set to none the target is overwritten again.
  k.backward();
  expectClose(target, k.dW() * 2.0);
  k.w.setGrad(Tensor());
  k.backward();
  EXPECT_TRUE(sameMemory(k.w.grad(), target));
  expectClose(target, k.dW());
}

TEST(GradSink, OpsWithoutASinkCopyIntoTheTarget) {
  // mul's backward takes no sink: AccumulateGrad copies the gradient into the target.
  Tensor w = randn({3, 4}).setRequiresGrad();
  Tensor c = randn({3, 4});
  Tensor target = full({3, 4}, std::numeric_limits<double>::quiet_NaN());
  autograd::setGradTarget(w, target);
  (w * c).sum().backward();
  EXPECT_TRUE(sameMemory(w.grad(), target));
  expectClose(w.grad(), c);
  // A broadcast use of the leaf: the gradient is summed back to its shape, then lands in the target.
  Tensor v = randn({4}).setRequiresGrad();
  Tensor vt = full({4}, std::numeric_limits<double>::quiet_NaN());
  autograd::setGradTarget(v, vt);
  (v * c).sum().backward();
  EXPECT_TRUE(sameMemory(v.grad(), vt));
  expectClose(v.grad(), c.sum({0}));
}

TEST(GradSink, ALeafReachedTwiceGetsBothGradients) {
  // Two linears share w: neither may write into .grad alone (the engine sums them first).
  Case k;
  Tensor x2 = randn({5, 4});
  auto run = [&] { ((linear(k.x, k.w, k.b) + linear(x2, k.w, k.b)) * k.c).sum().backward(); };
  Tensor want = k.dW() + mm(k.c.t(), x2);
  Tensor target = full({3, 4}, std::numeric_limits<double>::quiet_NaN());
  autograd::setGradTarget(k.w, target);
  run();
  EXPECT_TRUE(sameMemory(k.w.grad(), target));
  expectClose(k.w.grad(), want);
  run();  // now .grad is defined: the accumulating path, still both gradients once
  expectClose(k.w.grad(), want * 2.0);
}

TEST(GradSink, AGradientHookSeesTheWholeGradientAndCanReplaceIt) {
  Case k;
  Tensor seen;
  k.w.registerHook([&](const Tensor& g) -> std::optional<Tensor> {
    seen = g.clone();
    return g * 3.0;
  });
  Tensor before = randn({3, 4});
  k.w.setGrad(before.clone());
  k.backward();
  expectClose(seen, k.dW());
  expectClose(k.w.grad(), before + k.dW() * 3.0);
}

TEST(GradSink, PostAccumulateHooksRunOnceAfterTheSinkWasFilled) {
  Case k;
  Tensor target = zeros({3, 4});
  autograd::setGradTarget(k.w, target);
  int calls = 0;
  Tensor seen;
  k.w.registerPostAccumulateGradHook([&](Tensor& leaf) {
    ++calls;
    seen = leaf.grad().clone();
  });
  k.backward();
  EXPECT_EQ(calls, 1);
  expectClose(seen, k.dW());
  k.backward();
  EXPECT_EQ(calls, 2);
  expectClose(seen, k.dW() * 2.0);
}

TEST(GradSink, RetainedGraphRunTwiceAccumulatesTwice) {
  Case k;
  Tensor loss = (linear(k.x, k.w, k.b) * k.c).sum();
  loss.backward(Tensor(), /*retainGraph=*/true);
  loss.backward();
  expectClose(k.w.grad(), k.dW() * 2.0);
}

TEST(GradSink, BadTargetsAreRefusedWithTheReason) {
  Tensor w = randn({3, 4}).setRequiresGrad();
  EXPECT_TRUE(contains(messageOf<ValueError>([&] { autograd::setGradTarget(w, zeros({4, 3})); }), "shape [3, 4]"));
  EXPECT_TRUE(contains(messageOf<ValueError>([&] {
                         autograd::setGradTarget(w, zeros({4, 3}).t());
                       }),
                       "not contiguous"));
  EXPECT_TRUE(contains(messageOf<ValueError>([&] {
                         autograd::setGradTarget(w, zeros({3, 4}, {.dtype = DType::Float64}));
                       }),
                       "float32"));
  Tensor plain = randn({3, 4});
  EXPECT_TRUE(contains(messageOf<ValueError>([&] {
                         autograd::setGradTarget(plain, zeros({3, 4}));
                       }),
                       "does not require grad"));
  Tensor nonLeaf = w * 2.0;
  EXPECT_TRUE(contains(messageOf<ValueError>([&] {
                         autograd::setGradTarget(nonLeaf, zeros({3, 4}));
                       }),
                       "is not a leaf"));
  // Clearing: the next first gradient is a fresh tensor again.
  Tensor target = zeros({3, 4});
  autograd::setGradTarget(w, target);
  autograd::setGradTarget(w, Tensor());
  (w * 2.0).sum().backward();
  EXPECT_FALSE(sameMemory(w.grad(), target));
  expectClose(w.grad(), full({3, 4}, 2.0));
}
