// Split backward (autograd/split_backward.h): backwardInput's gradients of the inputs plus the
// weight half's leaf gradients must equal one plain backward (an MLP, a transformer block, a GPT
// with tied weights cut at a non-leaf activation, shared weights, an input reaching the loss twice,
// nodes shared by the input and the weight paths); the input half computes no weight gradient;
// hooks, callbacks, GradStores, saved tensors, errors, and DDP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/autograd/split_backward.h>
#include <cohort/core/tensor/allocator.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>

#include "core/autograd/grad_test_util.h"
#include "core/test_util.h"
#include "distributed/pg_test_util.h"

namespace cohort::autograd {
namespace {

namespace F = nn::functional;
using cohort::testing::contains;
using cohort::testing::messageOf;
using namespace cohort::autograd::testing;

// A graph built afresh each time (same values): roots with their gradients, and the inputs whose
// gradients the input half returns.
struct Graph {
  std::vector<Tensor> roots, grads, inputs;
};
using Build = std::function<Graph()>;

// Runs `build` twice: plain backward, then backwardInput + run(); every input's gradient and
// every leaf gradient in `params` must agree.
void expectSplitMatchesBackward(const Build& build, const std::vector<Tensor>& params) {
  clearGrads(params);
  Graph a = build();
  for (Tensor x : a.inputs)
    if (!x.isLeaf()) x.retainGrad();
  backward(a.roots, a.grads);
  std::vector<Tensor> wantInputs = gradsOf(a.inputs);
  std::vector<Tensor> wantParams = gradsOf(params);
  for (const Tensor& g : wantParams) ASSERT_TRUE(g.defined()) << "the case should give every parameter a gradient";

  clearGrads(params);
  Graph b = build();
  WeightBackward rest;
  std::vector<Tensor> got = backwardInput(b.roots, b.grads, b.inputs, rest);
  ASSERT_EQ(got.size(), b.inputs.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i;
  EXPECT_TRUE(rest.pending());
  rest.run();
  EXPECT_FALSE(rest.pending());
  for (size_t i = 0; i < got.size(); ++i) {
    expectSameGrad(got[i], wantInputs[i], "input " + std::to_string(i));
    EXPECT_FALSE(b.inputs[i].grad().defined()) << "input " << i << ": never accumulated";
  }
  std::vector<Tensor> gotParams = gradsOf(params);
  for (size_t i = 0; i < params.size(); ++i)
    expectSameGrad(gotParams[i], wantParams[i], "parameter " + std::to_string(i));
}

Tensor leafLike(const Tensor& data) { return data.clone().setRequiresGrad(); }

TEST(SplitBackward, MlpMatchesBackward) {
  manualSeed(1);
  nn::Linear l1(16, 32), l2(32, 32), l3(32, 4);
  Tensor x0 = randn({8, 16}), target = randn({8, 4});
  std::vector<Tensor> params;
  for (auto* l : {&l1, &l2, &l3})
    for (const Tensor& p : l->parameters()) params.push_back(p);
  expectSplitMatchesBackward(
      [&] {
        Tensor x = leafLike(x0);
        Tensor out = l3(l2(l1(x).gelu()).tanh());
        return Graph{{F::mseLoss(out, target)}, {Tensor()}, {x}};
      },
      params);
}

TEST(SplitBackward, TransformerBlockWithDropoutMatchesBackward) {
  manualSeed(2);
  nn::TransformerBlock block(16, 2, 8, /*dropout=*/0.1);
  Tensor x0 = randn({2, 8, 16}), c = randn({2, 8, 16});
  expectSplitMatchesBackward(
      [&] {
        manualSeed(7);  // the same dropout masks in both runs
        Tensor x = leafLike(x0);
        return Graph{{(block(x) * c).sum()}, {Tensor()}, {x}};
      },
      block.parameters());
}

// A GPT with tied embedding / lm_head weights, cut after its first block: the input is a non-leaf
// activation, and the weight half carries its gradient on into the embeddings.
TEST(SplitBackward, GptWithTiedWeightsCutAtAnActivationMatchesBackward) {
  manualSeed(3);
  nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 8, .nLayer = 2, .nHead = 2, .nEmbd = 16, .dropout = 0.0};
  auto gpt = std::make_shared<nn::GPT>(cfg);
  auto transformer = std::dynamic_pointer_cast<nn::ModuleDict>(gpt->child("transformer"));
  auto blocks = std::dynamic_pointer_cast<nn::ModuleList>((*transformer)["h"]);
  Tensor cut;
  auto handle = (*blocks)[0]->registerForwardHook(
      [&](nn::Module&, const nn::TensorList&, nn::TensorList& outs) { cut = outs.at(0); });
  Tensor idx = randint(0, 32, {2, 8}), target = randint(0, 32, {16});
  expectSplitMatchesBackward(
      [&] {
        Tensor logits = (*gpt)(idx);
        return Graph{{F::crossEntropy(logits.view({16, 32}), target)}, {Tensor()}, {cut}};
      },
      gpt->parameters());
}

TEST(SplitBackward, AWeightUsedTwiceAndAnInputReachingTheLossTwice) {
  manualSeed(4);
  Tensor w = (randn({6, 6}) * 0.3).setRequiresGrad();
  Tensor v = randn({6}).setRequiresGrad();
  Tensor x0 = randn({5, 6});
  expectSplitMatchesBackward(
      [&] {
        Tensor x = leafLike(x0);
        Tensor h = linear(linear(x, w).tanh(), w);                        // w twice
        Tensor loss = h.pow(2.0).sum() + (x * v).sum() + x.exp().mean();  // x three ways
        return Graph{{loss}, {Tensor()}, {x}};
      },
      {w, v});
}

// x*w elementwise and layerNorm: one node on both paths, computing dx in the input half and the
// weight gradients in the weight half.
TEST(SplitBackward, NodesSharedByTheInputAndTheWeightPaths) {
  manualSeed(5);
  Tensor w = randn({8}).setRequiresGrad();
  Tensor gamma = randn({8}).setRequiresGrad(), beta = randn({8}).setRequiresGrad();
  Tensor x0 = randn({4, 8}), c = randn({4, 8});
  expectSplitMatchesBackward(
      [&] {
        Tensor x = leafLike(x0);
        Tensor y = F::layerNorm(x * w, {8}, gamma, beta);
        return Graph{{(y * c).sum()}, {Tensor()}, {x}};
      },
      {w, gamma, beta});
}

TEST(SplitBackward, ARootWithNoPathToTheInputsAndGivenGradients) {
  manualSeed(6);
  Tensor w = randn({3, 4}).setRequiresGrad(), u = randn({4}).setRequiresGrad();
  Tensor x0 = randn({2, 4}), g0 = randn({2, 3});
  expectSplitMatchesBackward(
      [&] {
        Tensor x = leafLike(x0);
        Tensor y = linear(x, w);                 // root 0, gradient g0
        Tensor other = (u * u).sum() + w.sum();  // root 1: no path to x
        return Graph{{y, other}, {g0, Tensor()}, {x}};
      },
      {w, u});
}

// Two inputs, one computed from the other; a non-leaf input whose history holds a leaf of its own.
TEST(SplitBackward, InputsThatDependOnEachOtherAndOnLeavesBehindThem) {
  manualSeed(7);
  Tensor w0 = randn({4, 4}).setRequiresGrad(), w = randn({3, 4}).setRequiresGrad();
  Tensor a0 = randn({2, 4});
  Tensor a = a0.clone().setRequiresGrad();  // a leaf behind the inputs: not an input, gets .grad in run()
  expectSplitMatchesBackward(
      [&] {
        Tensor x = linear(a, w0);  // non-leaf input
        Tensor y = x.tanh();       // non-leaf input computed from x
        return Graph{{linear(y, w).sum() + x.sum()}, {Tensor()}, {y, x}};
      },
      {w0, w, a});
}

TEST(SplitBackward, NoInputsLeavesEverythingToTheWeightHalf) {
  manualSeed(8);
  Tensor w = randn({3, 4}).setRequiresGrad();
  Tensor x0 = randn({2, 4});
  expectSplitMatchesBackward([&] { return Graph{{linear(x0, w).pow(2.0).sum()}, {Tensor()}, {}}; }, {w});
}

// The node sees needsInputGrad for the input edge only in the input half, for the weight edge
// only in the weight half, and both in a plain backward.
TEST(SplitBackward, EachHalfAsksForItsOwnEdgesOnly) {
  std::vector<std::pair<bool, bool>> asked;
  auto probe = [&](const Tensor& x, const Tensor& w) {
    Tensor out = (x * w).detach();
    record("probe", {x, w}, {out}, {x, w}, [&](Ctx& ctx, const std::vector<Tensor>& g) -> std::vector<Tensor> {
      asked.emplace_back(ctx.needsInputGrad(0), ctx.needsInputGrad(1));
      return {g[0] * ctx.saved(1), g[0] * ctx.saved(0)};  // both, regardless: the engine drops the other
    });
    return out;
  };
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 5.0).setRequiresGrad();
  probe(x, w).sum().backward();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(true, true));
  asked.clear();
  w.setGrad(Tensor());
  x.setGrad(Tensor());

  WeightBackward rest;
  std::vector<Tensor> gx = backwardInput({probe(x, w).sum()}, {Tensor()}, {x}, rest);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(true, false));
  cohort::testing::expectNear(gx[0], {2, 2, 2});
  EXPECT_FALSE(w.grad().defined());
  rest.run();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], std::make_pair(false, true));
  cohort::testing::expectNear(w.grad(), {5, 5, 5});
  EXPECT_FALSE(x.grad().defined());
}

// linear's weight gradient ([512, 512], 1 MiB) is not computed in the input half: it allocates
// far less than that; the weight half does.
TEST(SplitBackward, TheInputHalfDoesNotComputeLinearsWeightGradient) {
  manualSeed(9);
  Tensor w = randn({512, 512}).setRequiresGrad();
  Tensor x = randn({1, 512}).setRequiresGrad();
  Tensor loss = linear(x, w).sum();
  const int64_t weightBytes = 512 * 512 * 4;
  resetPeakMemory();
  int64_t before = memoryStats().bytesLive;
  WeightBackward rest;
  std::vector<Tensor> gx = backwardInput({loss}, {Tensor()}, {x}, rest);
  int64_t inputHalf = memoryStats().peakBytes - before;
  EXPECT_LT(inputHalf, weightBytes / 4) << "the input half allocated " << inputHalf << " bytes";
  EXPECT_FALSE(w.grad().defined());
  expectSameGrad(gx[0], w.detach().sum({0}).unsqueeze(0), "dx");
  resetPeakMemory();
  before = memoryStats().bytesLive;
  rest.run();
  EXPECT_GE(memoryStats().peakBytes - before, weightBytes);
  ASSERT_TRUE(w.grad().defined());
  expectSameGrad(w.grad(), x.detach().expand({512, 512}), "dw");
}

TEST(SplitBackward, HooksRunOnceAndLeafHooksAndCallbacksInTheWeightHalf) {
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 1.0).setRequiresGrad();
  std::vector<std::string> log;
  w.registerPostAccumulateGradHook([&](Tensor&) {
    log.push_back("w accumulated");
    queueCallback([&] { log.push_back("callback"); });
  });
  Tensor h = x * w;
  h.registerHook([&](const Tensor& g) -> std::optional<Tensor> {
    log.push_back("h hook");
    return g * 3.0;  // seen by both halves
  });
  WeightBackward rest;
  std::vector<Tensor> gx = backwardInput({h.sum()}, {Tensor()}, {x}, rest);
  EXPECT_EQ(log, std::vector<std::string>{"h hook"});
  cohort::testing::expectNear(gx[0], {6, 6, 6});
  rest.run();
  EXPECT_EQ(log, (std::vector<std::string>{"h hook", "w accumulated", "callback"}));
  cohort::testing::expectNear(w.grad(), {3, 3, 3});
}

TEST(SplitBackward, SavedTensorsAreFreedAfterTheWeightHalfUnlessRetained) {
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 1.0).setRequiresGrad();
  {
    Tensor loss = (x * w).sum();
    WeightBackward rest;
    backwardInput({loss}, {Tensor()}, {x}, rest);
    rest.run();
    std::string msg = messageOf<Error>([&] { loss.backward(); });
    EXPECT_TRUE(contains(msg, "a second time")) << msg;
  }
  {
    w.setGrad(Tensor());
    Tensor loss = (x * w).sum();
    WeightBackward rest;
    backwardInput({loss}, {Tensor()}, {x}, rest, /*retainGraph=*/true);
    rest.run();
    loss.backward();  // still there
    cohort::testing::expectNear(w.grad(), {2, 2, 2});
  }
}

TEST(SplitBackward, AWeightHalfDroppedOrRunTwice) {
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 1.0).setRequiresGrad();
  {
    WeightBackward rest;
    backwardInput({(x * w).sum()}, {Tensor()}, {x}, rest);
    EXPECT_TRUE(rest.pending());
  }  // dropped
  EXPECT_FALSE(w.grad().defined());
  WeightBackward rest;
  backwardInput({(x * w).sum()}, {Tensor()}, {x}, rest);
  WeightBackward moved = std::move(rest);
  EXPECT_FALSE(rest.pending());
  rest.run();  // nothing
  moved.run();
  moved.run();  // nothing
  cohort::testing::expectNear(w.grad(), {1, 1, 1});
}

TEST(SplitBackward, InputErrorsAndUnusedInputs) {
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 1.0).setRequiresGrad();
  Tensor plain = full({3}, 1.0);
  WeightBackward rest;
  std::string msg = messageOf<ValueError>([&] { backwardInput({(x * w).sum()}, {Tensor()}, {plain}, rest); });
  EXPECT_TRUE(contains(msg, "does not require grad")) << msg;
  msg = messageOf<ValueError>([&] { backwardInput({(x * w).sum()}, {Tensor()}, {Tensor()}, rest); });
  EXPECT_TRUE(contains(msg, "undefined")) << msg;
  EXPECT_FALSE(rest.pending());

  Tensor unused = full({2}, 1.0).setRequiresGrad();
  std::vector<Tensor> got = backwardInput({(x * w).sum()}, {Tensor()}, {unused, x}, rest);
  EXPECT_FALSE(got[0].defined()) << "not in the graph: undefined";
  cohort::testing::expectNear(got[1], {2, 2, 2});
  msg = messageOf<ValueError>([&] { backwardInput({(x * w).sum()}, {Tensor()}, {x}, rest); });
  EXPECT_TRUE(contains(msg, "earlier")) << msg;
  rest.run();
  cohort::testing::expectNear(w.grad(), {1, 1, 1});
}

// Inside a backward that has a GradStore (a distributed autograd context's), leaf gradients go to
// the store, and callbacks to that backward.
TEST(SplitBackward, WeightHalfInsideABackwardWithAGradStore) {
  Tensor w = full({3}, 2.0).setRequiresGrad();
  Tensor x = full({3}, 1.0).setRequiresGrad();
  bool called = false;
  w.registerPostAccumulateGradHook([&](Tensor&) { queueCallback([&] { called = true; }); });
  MapStore store;
  GraphTask outer(false, &store);
  {
    GraphTask::ExecScope scope(outer);
    Tensor loss;
    {
      EnableGradGuard grad;
      loss = (x * w).sum();
    }
    WeightBackward rest;
    std::vector<Tensor> gx = backwardInput({loss}, {Tensor()}, {x}, rest);
    rest.run();
    EXPECT_FALSE(called) << "queued to the outer backward";
    cohort::testing::expectNear(gx[0], {2, 2, 2});
  }
  outer.runCallbacks();
  EXPECT_TRUE(called);
  EXPECT_FALSE(w.grad().defined());
  ASSERT_TRUE(store.get(*w.impl()).defined());
  cohort::testing::expectNear(store.get(*w.impl()), {1, 1, 1});
  EXPECT_FALSE(store.get(*x.impl()).defined());
}

// DDP on two ranks: a split backward reduces the same gradients as a plain one (its hooks run in
// the weight half, its finalize at the end of run()).
TEST(SplitBackward, DdpReducesTheSameGradients) {
  dist::testing::ThreadWorld world("gloo", 2);
  world.run([&](int r) {
    Generator g(11);
    auto net = std::make_shared<nn::Sequential>(nn::Linear(6, 12, true, &g), nn::Tanh(), nn::Linear(12, 3, true, &g));
    auto pg = std::shared_ptr<dist::ProcessGroup>(&world.pg(r), [](dist::ProcessGroup*) {});
    dist::DistributedDataParallel ddp(net, pg);
    Generator data(100 + r);
    Tensor x0 = randn({4, 6}, {}, &data), target = randn({4, 3}, {}, &data);
    std::vector<Tensor> params = net->parameters();
    std::vector<std::vector<Tensor>> grads;
    for (int round = 0; round < 3; ++round) {  // plain, split, split again (buckets rebuilt by then)
      net->zeroGrad(true);
      Tensor x = leafLike(x0);
      Tensor loss = F::mseLoss(ddp(x), target);
      if (round == 0) {
        loss.backward();
      } else {
        WeightBackward rest;
        std::vector<Tensor> gx = backwardInput({loss}, {Tensor()}, {x}, rest);
        EXPECT_TRUE(gx[0].defined());
        for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
        rest.run();
      }
      grads.push_back(gradsOf(params));
    }
    for (int round = 1; round < 3; ++round)
      for (size_t i = 0; i < params.size(); ++i)
        expectSameGrad(grads[round][i], grads[0][i], "rank " + std::to_string(r) + " parameter " + std::to_string(i));
  });
}

}  // namespace
}  // namespace cohort::autograd
