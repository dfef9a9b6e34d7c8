// The engine's GraphTask as distributed autograd drives it: leaf gradients into a GradStore
// (never .grad, hooks still run and see the store's gradient through gradOf), and nodes that wait
// for a gradient from outside the graph (expectExternal/deliver) before they run.
#include <gtest/gtest.h>

#include <map>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>

#include "core/autograd/grad_test_util.h"

namespace cohort::autograd {
namespace {

using namespace cohort::autograd::testing;

bool allAre(const Tensor& t, double v) { return t.sub(full(t.sizes(), v)).abs().max().itemDouble() == 0.0; }

void runAll(GraphTask& task) {
  GraphTask::ExecScope scope(task);
  std::vector<Tensor> in;
  while (Node* n = task.popReady(in)) task.propagate(n, task.runNode(n, std::move(in)));
  task.runCallbacks();
}

// Identity with one input edge, standing in for distributed autograd's send function.
class Relay final : public Node {
 public:
  explicit Relay(const Tensor& t) {
    next_.push_back(gradientEdge(t));
    inputMeta_.push_back({t.sizes(), t.dtype()});
    outputMeta_.push_back({t.sizes(), t.dtype()});
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {std::move(g.at(0))}; }
  std::string name() const override { return "Relay"; }
};

TEST(GraphTask, LeafGradientsGoToTheStoreAndAccumulateThere) {
  Tensor w = full({3}, 2.0);
  w.setRequiresGrad(true);
  Tensor seenInHook;
  w.registerPostAccumulateGradHook([&](Tensor& leaf) { seenInHook = gradOf(leaf); });
  MapStore store;
  for (int round = 0; round < 2; ++round) {
    Tensor loss = w.mul(w).sum();  // d/dw = 2w = 4
    GraphTask task(false, &store);
    task.addRoot(gradientEdge(loss), onesLike(loss));
    task.discover();
    runAll(task);
    EXPECT_TRUE(task.finished());
  }
  EXPECT_FALSE(w.grad().defined());
  Tensor g = store.get(*w.impl());
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(allAre(g, 8.0));  // two rounds: 4 + 4
  ASSERT_TRUE(seenInHook.defined());
  EXPECT_TRUE(allAre(seenInHook, 8.0));
  EXPECT_EQ(currentGradStore(), nullptr);  // only while the task runs
}

TEST(GraphTask, ANodeWaitingForAnExternalGradientRunsOnlyWhenItArrives) {
  Tensor w = full({2}, 3.0);
  w.setRequiresGrad(true);
  Tensor y = w.mul(w);  // what was "sent"
  auto relay = std::make_shared<Relay>(y);
  MapStore store;
  GraphTask task(false, &store);
  std::vector<Node*> fresh = task.discover(relay);
  EXPECT_EQ(fresh.front(), relay.get());
  EXPECT_GE(fresh.size(), 3u);  // the relay, mul's node, w's accumulator
  task.expectExternal(relay.get());
  runAll(task);
  EXPECT_FALSE(task.finished());  // nothing ran: the relay waits
  EXPECT_FALSE(store.get(*w.impl()).defined());
  task.deliver(relay.get(), 0, full({2}, 0.5));
  runAll(task);
  EXPECT_TRUE(task.finished());
  EXPECT_TRUE(allAre(store.get(*w.impl()), 3.0));  // 0.5 * 2w
}

// Stands in for distributed autograd's receive function: it only takes its gradient.
class InlineSink final : public Node {
 public:
  explicit InlineSink(const Tensor& t) { outputMeta_.push_back({t.sizes(), t.dtype()}); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    got = g.at(0);
    return {};
  }
  std::string name() const override { return "InlineSink"; }
  bool runsInline() const override { return true; }
  Tensor got;
};

TEST(GraphTask, AnEmittedGradientRunsAnInlineNodeBeforeItsProducerReturns) {
  Tensor x = full({3}, 2.0);
  auto sink = std::make_shared<InlineSink>(x);
  AutogradMeta& m = autogradMeta(x);
  m.gradFn = sink;
  m.requiresGrad = true;
  bool took = false, ranEarly = false;
  Tensor y = full({3}, 0.0);
  record("emitter", {x}, {y}, {}, [&](Ctx& ctx, const std::vector<Tensor>& g) -> std::vector<Tensor> {
    Tensor gx = g[0].mul(full({}, 3.0));
    took = ctx.emit(0, gx);
    ranEarly = sink->got.defined();  // before this backward returns
    return {took ? Tensor() : gx};
  });
  y.sum().backward();
  EXPECT_TRUE(took);
  EXPECT_TRUE(ranEarly);
  ASSERT_TRUE(sink->got.defined());
  EXPECT_TRUE(allAre(sink->got, 3.0));
}

TEST(GraphTask, PlainBackwardStillWritesGrad) {
  Tensor w = full({2}, 1.5);
  w.setRequiresGrad(true);
  w.mul(w).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(allAre(w.grad(), 3.0));
}

}  // namespace
}  // namespace cohort::autograd
