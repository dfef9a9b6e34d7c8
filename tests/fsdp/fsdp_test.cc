// FullyShardedDataParallel against a single process: N ranks (threads sharing a HashStore), each on
// its slice of the batch, must end every step with the parameters (gathered) that one process
// reaches on the whole batch, within float32 rounding — for every sharding strategy, 2, 3 and 4
// ranks, units whose sizes need padding, prefetch on and off, tied weights (GPT), gradient
// clipping by the global norm, and bounded error under mixed precision. Also what is resident
// when: FULL_SHARD frees a unit after its forward, SHARD_GRAD_OP keeps it until its backward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/core/profiler/profiler.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

#include "core/test_util.h"
#include "distributed/pg_test_util.h"
#include "fsdp/fsdp_test_util.h"

namespace cohort::fsdp::testing {
namespace {

using dist::testing::ThreadWorld;

TEST(FSDP, UnitsArePaddedToAMultipleOfTheWorldAndShardedEvenly) {
  for (int world : {2, 3, 4}) {
    ThreadWorld tw("gloo", world);
    std::vector<std::vector<int64_t>> shards(world);
    tw.run([&](int r) {
      auto net = std::make_shared<Net>(42 + r);
      FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
      ASSERT_EQ(f.numUnits(), 4u);  // root (inp, head) + 3 blocks
      EXPECT_EQ(f.unitPath(0), "");
      EXPECT_EQ(f.unitPath(1), "b0");
      EXPECT_EQ(f.unit(0).numel(), 6 * 5 + 5 + 5 * 3 + 3);
      for (size_t u = 1; u < 4; ++u) EXPECT_EQ(f.unit(u).numel(), kBlockNumel);
      for (size_t u = 0; u < 4; ++u) {
        EXPECT_EQ(f.unit(u).paddedNumel() % world, 0);
        EXPECT_LT(f.unit(u).paddedNumel() - f.unit(u).numel(), world);
        EXPECT_EQ(f.unit(u).shardNumel() * world, f.unit(u).paddedNumel());
        shards[r].push_back(f.unit(u).shard().numel());
      }
      // The optimizer sees the shards: one leaf per unit.
      EXPECT_EQ(f.parameters().size(), 4u);
    });
    for (int r = 1; r < world; ++r) EXPECT_EQ(shards[r], shards[0]);
  }
}

TEST(FSDP, FullShardShardGradOpAndNoShardMatchOneProcessOnOneToFourRanks) {
  for (auto strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard}) {
    for (int world : {1, 2, 3, 4}) {
      SCOPED_TRACE(fmt::format("{}, world {}", strategyName(strategy), world));
      Scenario s;
      s.world = world;
      s.options.strategy = strategy;
      s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
      expectMatchesReference(runScenario(s), kFp32Tol);
    }
  }
}

TEST(FSDP, PrefetchOnAndOffGiveTheSameResult) {
  for (bool fwd : {false, true}) {
    for (auto bwd : {BackwardPrefetch::None, BackwardPrefetch::BackwardPre}) {
      SCOPED_TRACE(fmt::format("forwardPrefetch {}, backwardPrefetch {}", fwd, bwd == BackwardPrefetch::BackwardPre));
      Scenario s;
      s.world = 3;
      s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
      s.options.forwardPrefetch = fwd;
      s.options.backwardPrefetch = bwd;
      expectMatchesReference(runScenario(s), kFp32Tol);
    }
  }
}

TEST(FSDP, OneUnitAndSizeBasedWrappingMatchToo) {
  {
    SCOPED_TRACE("no policy: the root is the only unit");
    Scenario s;
    s.world = 3;
    expectMatchesReference(runScenario(s), kFp32Tol);
  }
  {
    SCOPED_TRACE("wrapBySize(30): blocks and some Linears");
    Scenario s;
    s.world = 4;
    s.options.autoWrapPolicy = wrapBySize(30);
    expectMatchesReference(runScenario(s), kFp32Tol);
  }
}

TEST(FSDP, SizeBasedPolicyWrapsInnermostModulesPastTheThreshold) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapBySize(40)});
    // Each block's Linears have 42 and 40 elements: wrapped themselves, leaving the blocks with none.
    std::vector<std::string> paths;
    for (size_t u = 0; u < f.numUnits(); ++u) paths.push_back(f.unitPath(u));
    EXPECT_EQ(paths, (std::vector<std::string>{"", "b0.a", "b0.b", "b1.a", "b1.b", "b2.a", "b2.b"}));
  });
}

TEST(FSDP, AdamWAndGradientClippingByTheGlobalNormMatch) {
  Scenario s;
  s.world = 3;
  s.steps = 4;
  s.adamw = true;
  s.clip = 0.05;  // small enough to clip every step
  s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
  Outcome o = runScenario(s);
  expectMatchesReference(o, kFp32Tol);
  ASSERT_EQ(o.rankNorms.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(o.rankNorms[r].size(), o.referenceNorms.size());
    for (size_t k = 0; k < o.referenceNorms.size(); ++k) {
      EXPECT_GT(o.referenceNorms[k], s.clip);
      EXPECT_NEAR(o.rankNorms[r][k], o.referenceNorms[k], 1e-6 * o.referenceNorms[k]) << "rank " << r << " step " << k;
    }
  }
}

TEST(FSDP, HybridShardShardsInsideANodeAndReplicatesAcrossNodes) {
  Scenario s;
  s.world = 4;
  s.options.strategy = ShardingStrategy::HybridShard;
  s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
  s.nodeOf = [](int r) { return r < 2 ? "node-a" : "node-b"; };
  Outcome o = runScenario(s);
  expectMatchesReference(o, kFp32Tol);
  // Shards are halves (2 ranks per node), not quarters.
  EXPECT_EQ(o.shardNumel[0], o.paddedNumel[0] / 2);
}

TEST(FSDP, TiedWeightsOfAGptLiveInTheRootUnitAndTrainAsOneProcess) {
  for (auto strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    SCOPED_TRACE(strategyName(strategy));
    GptScenario g;
    g.world = 3;
    g.options.strategy = strategy;
    g.options.autoWrapPolicy = wrapModuleTypes({"TransformerBlock"});
    expectMatchesReference(runGptScenario(g), 2e-5);
  }
}

TEST(FSDP, FullShardFreesUnitsAfterForwardAndShardGradOpKeepsThemUntilBackward) {
  for (auto strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    SCOPED_TRACE(strategyName(strategy));
    ThreadWorld tw("gloo", 2);
    tw.run([&](int r) {
      auto net = std::make_shared<Net>(42);
      FullyShardedDataParallel f(net, borrow(tw.pg(r)),
                                 {.strategy = strategy, .autoWrapPolicy = wrapModuleTypes({"Block"})});
      for (size_t u = 0; u < f.numUnits(); ++u) EXPECT_FALSE(f.unit(u).gathered()) << "unit " << u << " before forward";
      Tensor loss = nn::functional::mseLoss(f(inputs(r, 0)), targets(r, 0));
      EXPECT_TRUE(f.unit(0).gathered()) << "the root stays gathered until its backward";
      for (size_t u = 1; u < f.numUnits(); ++u)
        EXPECT_EQ(f.unit(u).gathered(), strategy == ShardingStrategy::ShardGradOp) << "unit " << u << " after forward";
      loss.backward();
      for (size_t u = 0; u < f.numUnits(); ++u) {
        EXPECT_FALSE(f.unit(u).gathered()) << "unit " << u << " after backward";
        EXPECT_TRUE(f.unit(u).shard().grad().defined()) << "unit " << u;
        for (const auto& p : f.unit(u).params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
      }
      // The module's parameters are views into freed memory now: reading them is an error, not garbage.
      EXPECT_THROW(net->parameters()[0].dataPtr(), Error);
      {
        FullyShardedDataParallel::SummonFullParams full(f);
        EXPECT_NO_THROW(net->parameters()[0].dataPtr());
      }
      EXPECT_FALSE(f.unit(1).gathered());
    });
  }
}

// The profiler sees every unit's gathers, frees and reduce-scatters (on the "fsdp" track), and
// a unit's full buffer counts as parameters in the memory categories.
TEST(FSDP, ProfilerRecordsGathersFreesAndReduceScatters) {
  ThreadWorld tw("gloo", 2);
  profiler::Profile prof({.memory = true});
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    nn::functional::mseLoss(f(inputs(r, 0)), targets(r, 0)).backward();
  });
  prof.stop();
  std::map<std::string, int> count;
  for (const profiler::Event& e : prof.events())
    if (e.kind == profiler::EventKind::Fsdp) count[e.name.substr(0, e.name.find(' ', 5))]++;
  // Two ranks; every unit gathers for forward and again for backward (FULL_SHARD), frees after
  // each, and reduce-scatters its gradient once.
  EXPECT_GT(count["FSDP gather"], 0);
  EXPECT_GT(count["FSDP free"], 0);
  EXPECT_GT(count["FSDP reduce-scatter"], 0);
  EXPECT_EQ(count["FSDP reduce-scatter"] % 2, 0);
  bool paramRetag = false;
  for (const auto& m : prof.memoryEvents())
    if (m.kind == profiler::MemoryEventKind::Alloc && m.category == MemoryCategory::Parameters) paramRetag = true;
  EXPECT_TRUE(paramRetag) << "a re-gathered full buffer is allocated as parameters";
}

TEST(FSDP, SummonFullParamsWithWritebackChangesTheShards) {
  ThreadWorld tw("gloo", 3);
  std::vector<std::vector<Tensor>> seen(3);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    {
      FullyShardedDataParallel::SummonFullParams full(f, /*writeback=*/true);
      autograd::NoGradGuard ng;
      for (Tensor p : net->parameters()) p.fill_(0.5);
    }
    FullyShardedDataParallel::SummonFullParams full(f);
    for (const Tensor& p : net->parameters()) seen[r].push_back(p.detach().clone());
  });
  for (int r = 0; r < 3; ++r)
    for (const Tensor& p : seen[r]) EXPECT_EQ((p - 0.5).abs().max().item<double>(), 0.0);
}

TEST(FSDP, MixedPrecisionStaysCloseToFloat32AndKeepsFloat32MasterShards) {
  Scenario s;
  s.world = 2;
  s.steps = 3;
  s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
  s.options.mixedPrecision = {.paramDtype = DType::BFloat16, .reduceDtype = DType::Float32};
  Outcome o = runScenario(s);
  for (const auto& d : o.shardDtypes) EXPECT_EQ(d, DType::Float32);
  // bf16 compute (8 bits of mantissa) over 3 SGD steps: bounded, not exact.
  double worst = 0;
  for (size_t i = 0; i < o.reference.size(); ++i)
    worst = std::max(worst, (o.rankParams[0][i].to(DType::Float32) - o.reference[i]).abs().max().item<double>());
  EXPECT_LT(worst, 2e-2);
  EXPECT_GT(worst, 0.0);  // it did compute in bf16
  for (int r = 1; r < 2; ++r)
    for (size_t i = 0; i < o.reference.size(); ++i)
      EXPECT_EQ((o.rankParams[r][i] - o.rankParams[0][i]).abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace cohort::fsdp::testing

namespace cohort::fsdp::testing {
namespace {

// Units are reduced from their hooks while backward runs (not all at its end), and FULL_SHARD
// holds at most the root, the running unit and (with backward prefetch) the next one at once.
TEST(FSDP, UnitsReduceDuringBackwardAndFewAreGatheredAtOnce) {
  for (auto bwd : {BackwardPrefetch::None, BackwardPrefetch::BackwardPre}) {
    SCOPED_TRACE(bwd == BackwardPrefetch::None ? "no prefetch" : "backward prefetch");
    dist::testing::ThreadWorld tw("gloo", 2);
    tw.run([&](int r) {
      auto net = std::make_shared<Net>(42);
      FullyShardedDataParallel f(net, borrow(tw.pg(r)),
                                 {.autoWrapPolicy = wrapModuleTypes({"Block"}), .backwardPrefetch = bwd});
      for (int step = 0; step < 2; ++step) {
        F::mseLoss(f(inputs(r, step)), targets(r, step)).backward();
        const auto& st = f.lastStepStats();
        EXPECT_EQ(st.reducedInBackward, f.numUnits()) << "step " << step;
        EXPECT_EQ(st.reducedAtEnd, 0u) << "step " << step;
        EXPECT_LE(st.peakGatheredUnits, bwd == BackwardPrefetch::None ? 2u : 3u) << "step " << step;
        EXPECT_GE(st.peakGatheredUnits, 2u) << "step " << step;
      }
    });
  }
}

}  // namespace
}  // namespace cohort::fsdp::testing

namespace cohort::fsdp::testing {
namespace {

// Inside SummonFullParams one rank may run the model under no_grad on its own (evaluation on
// rank 0): nothing is gathered or freed, so no collective is issued and nothing hangs.
TEST(FSDP, OneRankEvaluatesInsideSummonFullParamsWithoutCollectives) {
  dist::testing::ThreadWorld tw("gloo", 2, dist::Millis(5'000));
  auto plain = std::make_shared<Net>(42);
  Tensor want = (*plain)(inputs(0, 0)).detach();
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    FullyShardedDataParallel::SummonFullParams full(f);
    if (r == 0) {
      autograd::NoGradGuard ng;
      for (int k = 0; k < 2; ++k) {
        Tensor got = f(inputs(0, 0));
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-6);
      }
    }
  });
}

}  // namespace
}  // namespace cohort::fsdp::testing

namespace cohort::fsdp::testing {
namespace {

// Net plus a Block whose output the loss never sees: its unit runs forward but gets no gradient,
// so backward's end reduces zeros for it on every rank (no rank is left waiting) and SGD leaves it
// as the single process does.
class NetWithIdleBlock : public Net {
 public:
  explicit NetWithIdleBlock(uint64_t seed) : Net(seed) {
    Generator g(seed + 1000);
    registerModule("idle", std::make_shared<Block>(&g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*child("inp"))(x);
    (*child("idle"))(h);  // computed, never used
    for (int i = 0; i < 3; ++i) h = (*child(fmt::format("b{}", i)))(h);
    return (*child("head"))(h);
  }
};

TEST(FSDP, AUnitWhoseOutputIsUnusedIsReducedAsZerosAtTheEndOfBackward) {
  Outcome o = runGeneric(
      3, 3, {.autoWrapPolicy = wrapModuleTypes({"Block"})}, /*adamw=*/false, 0, nullptr, "gloo",
      [](uint64_t seed) { return std::make_shared<NetWithIdleBlock>(seed); },
      [](nn::Module& m, int r, int step) { return F::mseLoss(m(inputs(r, step)), targets(r, step)); });
  expectMatchesReference(o, kFp32Tol);
}

// A model stored in bfloat16 (not FSDP's mixed precision): its shards are bfloat16, and the
// optimizer's own float32 master weights (Optimizer::setMasterWeights) serve them as they serve
// any half parameter, with no second mechanism in FSDP: every shard is its float32 master rounded
// once, the moments are float32, the ranks agree bit for bit, and training stays within bf16
// rounding of one process training the same bfloat16 model, with masters, on the whole batch.
TEST(FSDP, ABFloat16ModelsShardsTakeTheOptimizersFloat32MasterWeights) {
  constexpr int kWorld = 2, kSteps = 3;
  auto makeNet = [](uint64_t seed) {
    auto net = std::make_shared<Net>(seed);
    net->to(DType::BFloat16);
    return net;
  };
  auto loss = [](nn::Module& m, int r, int step) {
    return F::mseLoss(m(inputs(r, step).to(DType::BFloat16)).to(DType::Float32), targets(r, step));
  };
  auto makeOpt = [](const std::vector<Tensor>& params) {
    auto opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.01, .weightDecay = 0.1});
    opt->setMasterWeights();
    return opt;
  };
  std::vector<std::vector<Tensor>> got(kWorld);
  ThreadWorld tw("gloo", kWorld);
  tw.run([&](int r) {
    auto net = makeNet(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    auto opt = makeOpt(f.parameters());
    for (int step = 0; step < kSteps; ++step) {
      opt->zeroGrad();
      loss(f, r, step).backward();
      opt->step();
    }
    for (const Tensor& shard : f.parameters()) {
      EXPECT_EQ(shard.dtype(), DType::BFloat16);
      const optim::ParamState* st = opt->state(shard);
      ASSERT_NE(st, nullptr);
      const Tensor& master = st->tensors.at("master");
      EXPECT_EQ(master.dtype(), DType::Float32);
      EXPECT_TRUE(cohort::testing::sameBits(shard.detach(), master.to(DType::BFloat16)));
      for (const auto& [k, t] : st->tensors) EXPECT_EQ(t.dtype(), DType::Float32) << k;
    }
    FullyShardedDataParallel::SummonFullParams full(f);
    for (const Tensor& p : net->parameters()) got[r].push_back(p.detach().to(DType::Float32));
  });
  auto ref = makeNet(42);
  auto opt = makeOpt(ref->parameters());
  for (int step = 0; step < kSteps; ++step) {
    opt->zeroGrad();
    ((loss(*ref, 0, step) + loss(*ref, 1, step)) / 2.0).backward();
    opt->step();
  }
  const std::vector<Tensor> want = ref->parameters();
  ASSERT_EQ(got[0].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE((got[0][i] - want[i].detach().to(DType::Float32)).abs().max().item<double>(), 2e-2) << "parameter " << i;
    EXPECT_TRUE(cohort::testing::sameBits(got[1][i], got[0][i])) << "parameter " << i;
  }
}

TEST(FSDP, MixedPrecisionWithBf16ReductionStaysClose) {
  Scenario s;
  s.world = 4;
  s.steps = 3;
  s.options.autoWrapPolicy = wrapModuleTypes({"Block"});
  s.options.mixedPrecision = {.paramDtype = DType::BFloat16, .reduceDtype = DType::BFloat16};
  Outcome o = runScenario(s);
  double worst = 0;
  for (size_t i = 0; i < o.reference.size(); ++i)
    worst = std::max(worst, (o.rankParams[0][i].to(DType::Float32) - o.reference[i]).abs().max().item<double>());
  EXPECT_LT(worst, 3e-2);
  for (const auto& d : o.shardDtypes) EXPECT_EQ(d, DType::Float32);
}

TEST(FSDP, FrozenParametersAreRejectedByName) {
  dist::testing::ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    Tensor bias = net->child("head")->parameter("bias");
    bias.setRequiresGrad(false);
    try {
      FullyShardedDataParallel f(net, borrow(tw.pg(r)));
      ADD_FAILURE() << "no error";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("'head.bias' does not require grad"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace cohort::fsdp::testing
