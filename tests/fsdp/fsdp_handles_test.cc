// FSDP and the parameter handles a user's code holds. A module that keeps the Tensors
// registerParameter returned and uses those members in forward (never reading its registry) must
// train under every sharding strategy exactly as one process does; whatever FSDP cannot honour —
// an optimizer or clipGradNorm over the wrapped module's own parameters, a view of a parameter
// made before wrapping, a parameter replaced or converted after wrapping, the wrapper's own state
// dict, a wrap policy naming a type the model lacks — is a clear error, never a run that trains
// silently wrong.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

#include "distributed/pg_test_util.h"
#include "fsdp/fsdp_test_util.h"

namespace cohort::fsdp::testing {
namespace {

using dist::testing::ThreadWorld;

std::string messageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A linear layer written the libtorch way: it keeps the handles registerParameter returned.
class KeptLinear : public nn::Module {
 public:
  KeptLinear(int64_t in, int64_t out, Generator* g) : nn::Module("KeptLinear") {
    weight_ = registerParameter("weight", randn({out, in}, {}, g) * 0.4);
    bias_ = registerParameter("bias", randn({out}, {}, g) * 0.1);
  }
  Tensor forward(const Tensor& x) override { return x.matmul(weight_.t()) + bias_; }

 private:
  Tensor weight_, bias_;
};

// x + b(tanh(a(x) * scale)): the children and its own parameter are members, called directly.
class KeptBlock : public nn::Module {
 public:
  explicit KeptBlock(Generator* g) : nn::Module("KeptBlock") {
    a_ = registerModule("a", std::make_shared<KeptLinear>(kD, kH, g));
    b_ = registerModule("b", std::make_shared<KeptLinear>(kH, kD, g));
    scale_ = registerParameter("scale", ones({kH}) + randn({kH}, {}, g) * 0.1);
  }
  Tensor forward(const Tensor& x) override { return x + (*b_)(((*a_)(x)*scale_).tanh()); }

 private:
  std::shared_ptr<KeptLinear> a_, b_;
  Tensor scale_;
};

// inp, three KeptBlocks, head; the head's output is multiplied by `gain`, a parameter of the
// root kept as a member.
class KeptNet : public nn::Module {
 public:
  explicit KeptNet(uint64_t seed) : nn::Module("KeptNet") {
    Generator g(seed);
    inp_ = registerModule("inp", std::make_shared<KeptLinear>(6, kD, &g));
    for (int i = 0; i < 3; ++i)
      blocks_.push_back(registerModule(fmt::format("b{}", i), std::make_shared<KeptBlock>(&g)));
    head_ = registerModule("head", std::make_shared<KeptLinear>(kD, 3, &g));
    gain_ = registerParameter("gain", full({3}, 1.5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*inp_)(x);
    for (auto& b : blocks_) h = (*b)(h);
    return (*head_)(h)*gain_;
  }

 private:
  std::shared_ptr<KeptLinear> inp_, head_;
  std::vector<std::shared_ptr<KeptBlock>> blocks_;
  Tensor gain_;
};

Outcome runKept(int world, const FSDPOptions& options, bool adamw, const std::function<std::string(int)>& nodeOf) {
  return runGeneric(
      world, 3, options, adamw, 0, nodeOf, "gloo", [](uint64_t seed) { return std::make_shared<KeptNet>(seed); },
      [](nn::Module& m, int r, int step) { return F::mseLoss(m(inputs(r, step)), targets(r, step)); });
}

TEST(FSDPHandles, AModuleThatKeepsItsHandlesTrainsAsOneProcessUnderEveryStrategy) {
  for (auto strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                        ShardingStrategy::HybridShard}) {
    for (bool adamw : {false, true}) {
      SCOPED_TRACE(fmt::format("{}, {}", strategyName(strategy), adamw ? "AdamW" : "SGD"));
      FSDPOptions o;
      o.strategy = strategy;
      o.autoWrapPolicy = wrapModuleTypes({"KeptBlock"});
      const bool hybrid = strategy == ShardingStrategy::HybridShard;
      std::function<std::string(int)> nodeOf;
      if (hybrid) nodeOf = [](int r) { return r < 2 ? "node-a" : "node-b"; };
      Outcome out = runKept(hybrid ? 4 : 3, o, adamw, nodeOf);
      expectMatchesReference(out, kFp32Tol);
      // It really trained: the parameters moved away from their initial values.
      auto initial = std::make_shared<KeptNet>(42)->parameters();
      double moved = 0;
      for (size_t i = 0; i < initial.size(); ++i)
        moved = std::max(moved, (out.rankParams[0][i] - initial[i]).abs().max().item<double>());
      EXPECT_GT(moved, 1e-3);
    }
  }
}

TEST(FSDPHandles, KeptHandlesSeeTheFullParameterInForwardAndTheRegistryIsTheSameTensor) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<KeptNet>(42);
    Tensor kept = net->child("b1")->child("a")->parameter("weight");  // a handle taken before wrapping
    Tensor before = kept.detach().clone();
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"KeptBlock"})});
    EXPECT_TRUE(kept.isSameAs(net->child("b1")->child("a")->parameter("weight")));
    EXPECT_THROW(kept.dataPtr(), Error);  // between steps the full value does not exist
    {
      FullyShardedDataParallel::SummonFullParams full(f);
      EXPECT_EQ((kept - before).abs().max().item<double>(), 0.0);
    }
    // During forward the kept handle holds the gathered values.
    Tensor seen;
    auto hook = net->child("b1")->registerForwardHook([&](nn::Module&, const nn::TensorList&,
                                                          nn::TensorList&) { seen = kept.detach().clone(); },
                                                      /*prepend=*/true);  // before FSDP's own hook frees the unit
    F::mseLoss(f(inputs(r, 0)), targets(r, 0)).backward();
    hook.remove();
    ASSERT_TRUE(seen.defined());
    EXPECT_EQ((seen - before).abs().max().item<double>(), 0.0);
    EXPECT_TRUE(kept.isLeaf());  // a leaf again once backward is over
    EXPECT_FALSE(kept.grad().defined());
  });
}

TEST(FSDPHandles, AnOptimizerOverTheWrappedModulesParametersIsAnError) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<KeptNet>(42);
    optim::SGD early(net->parameters(), {.lr = 0.1});  // built before wrapping: the common mistake
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"KeptBlock"})});
    std::string msg = messageOf([&] { optim::AdamW late(net->parameters(), {.lr = 0.1}); });
    EXPECT_NE(msg.find("managed by FullyShardedDataParallel"), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameters() (the shards)"), std::string::npos) << msg;
    F::mseLoss(f(inputs(r, 0)), targets(r, 0)).backward();
    msg = messageOf([&] { early.step(); });
    EXPECT_NE(msg.find("SGD.step: parameter 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("managed by FullyShardedDataParallel"), std::string::npos) << msg;
    msg = messageOf([&] { optim::clipGradNorm(net->parameters(), 1.0); });
    EXPECT_NE(msg.find("clipGradNorm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("FullyShardedDataParallel::clipGradNorm"), std::string::npos) << msg;
    // The shards are what an optimizer takes.
    EXPECT_NO_THROW(optim::SGD(f.parameters(), {.lr = 0.1}).step());
  });
}

// Caches a transpose of its weight when built: a view made before wrapping.
class CachesATranspose : public nn::Module {
 public:
  explicit CachesATranspose(Generator* g) : nn::Module("CachesATranspose") {
    Tensor w = registerParameter("weight", randn({3, 6}, {}, g));
    wT_ = w.t();
  }
  Tensor forward(const Tensor& x) override { return x.matmul(wT_); }

 private:
  Tensor wT_;
};

TEST(FSDPHandles, AViewOfAParameterMadeBeforeWrappingFailsOnFirstUseNamingTheParameter) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    Generator g(7);
    auto net = std::make_shared<CachesATranspose>(&g);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)));
    std::string msg = messageOf([&] { f(inputs(r, 0)); });
    EXPECT_NE(msg.find("it held parameter 'weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("inside forward"), std::string::npos) << msg;
  });
}

TEST(FSDPHandles, AParameterReplacedOrConvertedAfterWrappingIsAnErrorAtTheNextForward) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    net->child("b1")->child("a")->replaceParameter("bias", zeros({kH}));
    std::string msg = messageOf([&] { f(inputs(r, 0)); });
    EXPECT_NE(msg.find("parameter 'b1.a.bias' was replaced in its module after wrapping"), std::string::npos) << msg;
  });
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    {
      FullyShardedDataParallel::SummonFullParams full(f);
      net->to(DType::Float64);
    }
    std::string msg = messageOf([&] { f(inputs(r, 0).to(DType::Float64)); });
    EXPECT_NE(msg.find("no longer views the unit's flat buffer"), std::string::npos) << msg;
  });
}

TEST(FSDPHandles, TheWrappersOwnStateDictPointsToTheFSDPStateDicts) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)));
    std::string msg = messageOf([&] { f.stateDict(); });
    EXPECT_NE(msg.find("fsdp::fullStateDict"), std::string::npos) << msg;
    msg = messageOf([&] { f.loadStateDict(net->stateDict()); });
    EXPECT_NE(msg.find("fsdp::loadFullStateDict"), std::string::npos) << msg;
    // The wrapped model's values cannot be read between steps; the error says where they are.
    msg = messageOf([&] { net->parameters()[0].clone(); });
    EXPECT_NE(msg.find("SummonFullParams"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fsdp::fullStateDict"), std::string::npos) << msg;
  });
}

TEST(FSDPHandles, AWrapPolicyNamingATypeTheModelLacksIsAnErrorListingTheTypes) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    std::string msg = messageOf([&] {
      FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Blocks", "Linear"})});
    });
    EXPECT_NE(msg.find("wrapModuleTypes names Blocks that no module"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Linear, Block"), std::string::npos) << msg;
    auto net2 = std::make_shared<Net>(42);
    msg = messageOf(
        [&] { FullyShardedDataParallel f(net2, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Net"})}); });
    EXPECT_NE(msg.find("the root is always a unit"), std::string::npos) << msg;
  });
  EXPECT_THROW(wrapModuleTypes({}), ValueError);
}

}  // namespace
}  // namespace cohort::fsdp::testing
