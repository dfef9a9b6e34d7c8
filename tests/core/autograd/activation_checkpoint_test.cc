// Activation checkpointing (autograd/checkpoint.h): gradients of inputs and parameters equal those
// without checkpointing (an MLP, a transformer block and a GPT with dropout, nested checkpoints,
// inside a split backward, under a GradStore, with DDP); the forward keeps fewer bytes alive;
// the generator state is restored for the recomputation and left as it was; and the errors.
// (Named activation_checkpoint_test: tests/core/io/checkpoint_test.cc is the training checkpoint's.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/autograd/checkpoint.h>
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

void expectSameGrads(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) expectSameGrad(got[i], want[i], what + " " + std::to_string(i));
}

// A stack of Linear + tanh layers; forward(x, every) checkpoints every `every` layers (0: none).
struct Mlp {
  explicit Mlp(int depth, int64_t width, uint64_t seed) {
    Generator g(seed);
    for (int i = 0; i < depth; ++i) layers.push_back(std::make_shared<nn::Linear>(width, width, true, &g));
  }
  Tensor run(const Tensor& x, size_t from, size_t to) const {
    Tensor h = x;
    for (size_t i = from; i < to; ++i) h = (*layers[i])(h).tanh();
    return h;
  }
  Tensor forward(const Tensor& x, size_t every) const {
    if (every == 0) return run(x, 0, layers.size());
    Tensor h = x;
    for (size_t i = 0; i < layers.size(); i += every) {
      size_t end = std::min(layers.size(), i + every);
      h = checkpoint([this, i, end](const Tensor& in) { return run(in, i, end); }, h);
    }
    return h;
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> out;
    for (const auto& l : layers)
      for (const Tensor& p : l->parameters()) out.push_back(p);
    return out;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

TEST(Checkpoint, MlpGradientsEqualThoseWithoutCheckpointing) {
  Mlp mlp(6, 8, 1);
  Tensor x0 = randn({4, 8}), target = randn({4, 8});
  std::vector<Tensor> params = mlp.parameters();
  for (bool inputRequiresGrad : {true, false}) {
    std::vector<Tensor> want, got;
    Tensor wantX, gotX;
    for (size_t every : {0, 2}) {
      clearGrads(params);
      Tensor x = x0.clone().setRequiresGrad(inputRequiresGrad);
      Tensor out = mlp.forward(x, every);
      EXPECT_TRUE(out.requiresGrad());
      F::mseLoss(out, target).backward();
      (every == 0 ? want : got) = gradsOf(params);
      (every == 0 ? wantX : gotX) = x.grad();
    }
    expectSameGrads(got, want, "parameter");
    expectSameGrad(gotX, wantX, "input");
  }
}

TEST(Checkpoint, TheRecomputationRunsOnceAndDropoutMasksMatch) {
  int calls = 0;
  Tensor w = randn({16}).setRequiresGrad();
  auto fn = [&](const Tensor& x) {
    ++calls;
    return F::dropout(x * w, 0.5, /*training=*/true);
  };
  Tensor x0 = randn({16});
  manualSeed(5);
  Tensor x = x0.clone().setRequiresGrad();
  fn(x).sum().backward();
  Tensor wantW = w.grad().clone(), wantX = x.grad();
  const GeneratorState after = defaultGenerator().state();
  w.setGrad(Tensor());
  calls = 0;

  manualSeed(5);
  x = x0.clone().setRequiresGrad();
  Tensor y = checkpoint(fn, x);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(defaultGenerator().state(), after) << "the forward draws what fn draws";
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(defaultGenerator().state(), after) << "the recomputation leaves the generator as it was";
  expectSameGrad(w.grad(), wantW, "w");
  expectSameGrad(x.grad(), wantX, "x");
}

// A GPT whose blocks run under checkpoint, with dropout: the same loss and gradients (tied
// embedding / lm_head weight included) as without, from the same seed.
class CheckpointedBlock : public nn::Module {
 public:
  explicit CheckpointedBlock(nn::ModulePtr inner) : nn::Module("CheckpointedBlock") {
    registerModule("inner", std::move(inner));
  }
  Tensor forward(const Tensor& x) override {
    nn::ModulePtr inner = child("inner");
    return checkpoint([inner](const Tensor& in) { return (*inner)(in); }, x);
  }
};

TEST(Checkpoint, GptWithDropoutMatchesWithoutCheckpointing) {
  nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 8, .nLayer = 3, .nHead = 2, .nEmbd = 16, .dropout = 0.2};
  manualSeed(3);
  auto plain = std::make_shared<nn::GPT>(cfg);
  manualSeed(3);
  auto ckpt = std::make_shared<nn::GPT>(cfg);
  auto transformer = std::dynamic_pointer_cast<nn::ModuleDict>(ckpt->child("transformer"));
  auto blocks = std::dynamic_pointer_cast<nn::ModuleList>((*transformer)["h"]);
  for (size_t i = 0; i < blocks->size(); ++i)
    blocks->replaceModule(std::to_string(i), std::make_shared<CheckpointedBlock>((*blocks)[static_cast<int64_t>(i)]));
  Tensor idx = randint(0, 32, {2, 8}), target = randint(0, 32, {16});
  std::vector<Tensor> losses;
  for (auto& model : {plain, ckpt}) {
    manualSeed(99);
    Tensor loss = F::crossEntropy((*model)(idx).view({16, 32}), target);
    loss.backward();
    losses.push_back(loss.detach());
  }
  expectSameGrad(losses[1], losses[0], "loss", 0);
  auto a = plain->namedParameters(), b = ckpt->namedParameters();
  ASSERT_EQ(a.size(), b.size());
  std::vector<Tensor> pa = plain->parameters(), pb = ckpt->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].grad().defined()) << "parameter " << i;
    expectSameGrad(pb[i].grad(), pa[i].grad(), "parameter " + std::to_string(i));
  }
}

TEST(Checkpoint, TransformerBlockWithSeveralInputsAndOutputs) {
  manualSeed(4);
  nn::TransformerBlock block(16, 2, 8, /*dropout=*/0.1);
  Tensor a0 = randn({2, 8, 16}), b0 = randn({2, 8, 16});
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor h = block(in[0] + in[1]);
    return std::vector<Tensor>{h, h.tanh() * in[1], in[0]};  // an input returned as it is
  };
  std::vector<std::vector<Tensor>> grads;
  for (bool ckpt : {false, true}) {
    block.zeroGrad(true);
    Tensor a = a0.clone().setRequiresGrad(), b = b0.clone().setRequiresGrad();
    manualSeed(8);
    std::vector<Tensor> out = ckpt ? checkpoint(fn, {a, b}) : fn({a, b});
    (out[0].sum() + out[1].pow(2.0).sum() + out[2].mean()).backward();
    std::vector<Tensor> g = gradsOf(block.parameters());
    g.push_back(a.grad());
    g.push_back(b.grad());
    grads.push_back(g);
  }
  expectSameGrads(grads[1], grads[0], "gradient");
}

TEST(Checkpoint, NestedCheckpointsMatch) {
  Mlp mlp(8, 8, 2);
  Tensor x0 = randn({3, 8});
  std::vector<Tensor> params = mlp.parameters();
  auto nested = [&](const Tensor& x) {
    return checkpoint(
        [&](const Tensor& in) {
          Tensor h = checkpoint([&](const Tensor& t) { return mlp.run(t, 0, 3); }, in);
          h = mlp.run(h, 3, 5);
          return checkpoint([&](const Tensor& t) { return mlp.run(t, 5, 8); }, h);
        },
        x);
  };
  std::vector<std::vector<Tensor>> grads;
  for (bool ckpt : {false, true}) {
    clearGrads(params);
    Tensor x = x0.clone().setRequiresGrad();
    (ckpt ? nested(x) : mlp.run(x, 0, 8)).pow(2.0).sum().backward();
    grads.push_back(gradsOf(params));
    grads.back().push_back(x.grad());
  }
  expectSameGrads(grads[1], grads[0], "gradient");
}

// The forward keeps only each segment's input: its peak is well under the plain forward's, whose
// saved activations (each layer's input and tanh's output) stay alive.
TEST(Checkpoint, TheForwardPeakIsLowerOnADeepMlp) {
  Mlp mlp(24, 64, 3);
  Tensor x0 = randn({512, 64});
  std::vector<Tensor> params = mlp.parameters();
  std::vector<int64_t> peak, live;
  std::vector<std::vector<Tensor>> grads;
  for (size_t every : {0, 6}) {
    clearGrads(params);
    Tensor x = x0.clone().setRequiresGrad();
    resetPeakMemory();
    const int64_t base = memoryStats().bytesLive;
    Tensor loss = mlp.forward(x, every).sum();
    peak.push_back(memoryStats().peakBytes - base);
    live.push_back(memoryStats().bytesLive - base);
    loss.backward();
    grads.push_back(gradsOf(params));
  }
  const int64_t activation = 512 * 64 * 4;
  EXPECT_GE(live[0], 24 * activation) << "plain: the saved activations stay alive";
  EXPECT_LT(live[1], 6 * activation) << "checkpointed: only the segments' inputs and outputs";
  EXPECT_LT(peak[1] * 3, peak[0]) << "plain " << peak[0] << " bytes, checkpointed " << peak[1];
  expectSameGrads(grads[1], grads[0], "parameter");
}

TEST(Checkpoint, BackwardTwiceWithoutRetainGraphIsAClearError) {
  Mlp mlp(2, 4, 4);
  Tensor x = randn({2, 4}).setRequiresGrad();
  Tensor loss = mlp.forward(x, 2).sum();
  loss.backward();
  std::string msg = messageOf<Error>([&] { loss.backward(); });
  EXPECT_TRUE(contains(msg, "checkpoint")) << msg;
  EXPECT_TRUE(contains(msg, "a second time")) << msg;
  EXPECT_TRUE(contains(msg, "retainGraph")) << msg;

  std::vector<Tensor> params = mlp.parameters();
  clearGrads(params);
  loss = mlp.forward(x, 2).sum();
  loss.backward(Tensor(), /*retainGraph=*/true);
  std::vector<Tensor> once = gradsOf(params);
  loss.backward();  // recomputes again
  for (size_t i = 0; i < params.size(); ++i) expectSameGrad(params[i].grad(), once[i] * 2.0, "parameter");
}

TEST(Checkpoint, WithGradModeOffItJustCallsFn) {
  int calls = 0;
  Tensor w = randn({3}).setRequiresGrad();
  NoGradGuard noGrad;
  Tensor y = checkpoint(
      [&](const Tensor& x) {
        ++calls;
        return x * w;
      },
      randn({3}).setRequiresGrad());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requiresGrad());
  EXPECT_EQ(y.gradFn(), nullptr);
}

TEST(Checkpoint, AClosureReachingTheOuterGraphIsAnError) {
  Tensor w = randn({3}).setRequiresGrad();
  Tensor h = w * 2.0;  // history outside the checkpoint, not passed as an input
  Tensor y = checkpoint([&](const Tensor& x) { return x * h; }, randn({3}).setRequiresGrad());
  std::string msg = messageOf<ValueError>([&] { y.sum().backward(); });
  EXPECT_TRUE(contains(msg, "inputs")) << msg;
}

TEST(Checkpoint, QueuedCallbacksRunAtTheEndOfTheOuterBackward) {
  Mlp mlp(3, 4, 5);
  std::vector<std::string> log;
  Tensor inside = mlp.layers[2]->weight(), outside = mlp.layers[0]->weight();
  inside.registerPostAccumulateGradHook([&](Tensor&) {
    log.push_back("inside");
    queueCallback([&] { log.push_back("callback"); });
  });
  outside.registerPostAccumulateGradHook([&](Tensor&) { log.push_back("outside"); });
  Tensor x = randn({2, 4});
  Tensor h = mlp.run(x, 0, 1);
  h = checkpoint([&](const Tensor& in) { return mlp.run(in, 1, 3); }, h);
  h.sum().backward();
  EXPECT_EQ(log, (std::vector<std::string>{"inside", "outside", "callback"}));
}

// In a backward with a GradStore (a distributed autograd context's), the recomputation's
// parameter gradients go to the store, as every other leaf gradient does.
TEST(Checkpoint, UnderAGradStoreTheGradientsGoToTheStore) {
  Mlp mlp(4, 4, 6);
  std::vector<Tensor> params = mlp.parameters();
  Tensor x0 = randn({2, 4});
  Tensor x = x0.clone().setRequiresGrad();
  mlp.run(x, 0, 4).sum().backward();
  std::vector<Tensor> want = gradsOf(params);
  want.push_back(x.grad());
  clearGrads(params);

  x = x0.clone().setRequiresGrad();
  Tensor loss = mlp.forward(x, 2).sum();
  MapStore store;
  GraphTask task(false, &store);
  task.addRoot(gradientEdge(loss), onesLike(loss));
  task.discover();
  {
    GraphTask::ExecScope scope(task);
    std::vector<Tensor> in;
    while (Node* n = task.popReady(in)) task.propagate(n, task.runNode(n, std::move(in)));
  }
  EXPECT_TRUE(task.finished());
  std::vector<Tensor> got;
  for (const Tensor& p : params) {
    EXPECT_FALSE(p.grad().defined());
    got.push_back(store.get(*p.impl()));
  }
  got.push_back(store.get(*x.impl()));
  EXPECT_FALSE(x.grad().defined());
  expectSameGrads(got, want, "gradient");
  EXPECT_EQ(store.grads.size(), params.size() + 1) << "nothing but the leaves";
}

// In a split backward the checkpoint's recomputed weight gradients wait for the weight half.
TEST(Checkpoint, InsideASplitBackward) {
  Mlp mlp(6, 8, 7);
  std::vector<Tensor> params = mlp.parameters();
  Tensor x0 = randn({3, 8});
  Tensor x = x0.clone().setRequiresGrad();
  mlp.run(x, 0, 6).pow(2.0).sum().backward();
  std::vector<Tensor> want = gradsOf(params);
  Tensor wantX = x.grad();
  clearGrads(params);

  auto nested = [&](const Tensor& in) {
    return checkpoint(
        [&](const Tensor& t) {
          return checkpoint([&](const Tensor& u) { return mlp.run(u, 2, 4); }, mlp.run(t, 0, 2));
        },
        in);
  };
  x = x0.clone().setRequiresGrad();
  Tensor h = nested(x);
  h = checkpoint([&](const Tensor& t) { return mlp.run(t, 4, 6); }, h);
  WeightBackward rest;
  std::vector<Tensor> gx = backwardInput({h.pow(2.0).sum()}, {Tensor()}, {x}, rest);
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
  expectSameGrad(gx[0], wantX, "input");
  rest.run();
  expectSameGrads(gradsOf(params), want, "parameter");
  EXPECT_FALSE(x.grad().defined());
}

// DDP on two ranks with the middle of the model checkpointed: the same gradients as without.
TEST(Checkpoint, WithDdp) {
  dist::testing::ThreadWorld world("gloo", 2);
  world.run([&](int r) {
    Generator g(21);
    auto net = std::make_shared<nn::Sequential>(nn::Linear(6, 12, true, &g), nn::Tanh(), nn::Linear(12, 12, true, &g),
                                                nn::Tanh(), nn::Linear(12, 3, true, &g));
    struct Wrapped : nn::Module {
      explicit Wrapped(std::shared_ptr<nn::Sequential> s) : nn::Module("Wrapped"), seq(std::move(s)) {
        registerModule("seq", seq);
      }
      Tensor forward(const Tensor& x) override {
        Tensor h = (*(*seq)[0])(x);
        auto mid = [this](const Tensor& in) { return (*(*seq)[3])((*(*seq)[2])((*(*seq)[1])(in))); };
        h = useCheckpoint ? checkpoint(mid, h) : mid(h);
        return (*(*seq)[4])(h);
      }
      std::shared_ptr<nn::Sequential> seq;
      bool useCheckpoint = false;
    };
    auto model = std::make_shared<Wrapped>(net);
    auto pg = std::shared_ptr<dist::ProcessGroup>(&world.pg(r), [](dist::ProcessGroup*) {});
    dist::DistributedDataParallel ddp(model, pg);
    Generator data(200 + r);
    Tensor x = randn({4, 6}, {}, &data), target = randn({4, 3}, {}, &data);
    std::vector<Tensor> params = model->parameters();
    std::vector<std::vector<Tensor>> grads;
    for (bool ckpt : {false, true, true}) {
      model->zeroGrad(true);
      model->useCheckpoint = ckpt;
      F::mseLoss(ddp(x), target).backward();
      grads.push_back(gradsOf(params));
    }
    for (int round = 1; round < 3; ++round)
      for (size_t i = 0; i < params.size(); ++i)
        expectSameGrad(grads[round][i], grads[0][i], "rank " + std::to_string(r) + " parameter " + std::to_string(i));
  });
}

}  // namespace
}  // namespace cohort::autograd
