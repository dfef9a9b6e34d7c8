// fsdp::ShardedGradScaler (ranks as threads over gloo): each rank's optimizer holds only its
// shards, so an inf put into ONE rank's shard gradient is seen by that rank alone, and only the
// found-inf all-reduce makes every rank skip that step and back off alike. Checked: every rank
// skips exactly the poisoned steps with the same scales, a skipped step changes no shard, the
// gathered parameters stay identical on every rank; without the reduction only the poisoned rank
// skips (so the inf really was local) and only its half of the model misses the update. With
// float16 compute (MixedPrecision) the scaled gradients overflow by themselves at first,
// identically on every rank. The scaler's state travels in an FSDP training checkpoint and
// restores on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/fsdp/sharded_grad_scaler.h>
#include <cohort/fsdp/training_checkpoint.h>

#include "fsdp/fsdp_test_util.h"
#include "temp_dir.h"

namespace cohort::fsdp::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct RankLog {
  std::vector<bool> stepped;
  std::vector<double> scales;
  std::vector<double> norms;                // clipGradNorm of the unscaled gradients (clean steps)
  std::vector<std::vector<Tensor>> shards;  // this rank's shards after each step
  std::vector<Tensor> full;                 // the gathered parameters at the end
  amp::GradScalerState state;
};

// (step, rank) -> (unit, value written into element 0 of that unit's shard gradient).
using Poison = std::map<std::pair<int, int>, std::pair<size_t, double>>;

struct Training {
  int world = 2;
  int steps = 8;
  Poison poison{};
  bool reduce = true;
  // clipGradNorm is a collective: without the reduction, ranks that disagree on skipping would
  // call it a different number of times and hang.
  bool clip = true;
  FSDPOptions options{.autoWrapPolicy = wrapModuleTypes({"Block"})};
  amp::GradScalerOptions scaler{.initScale = 1024, .growthInterval = 2};
};

std::vector<RankLog> train(const Training& run) {
  std::vector<RankLog> logs(static_cast<size_t>(run.world));
  std::vector<nn::ModulePtr> nets;
  for (int r = 0; r < run.world; ++r) nets.push_back(std::make_shared<Net>(42 + static_cast<uint64_t>(r)));
  dist::testing::ThreadWorld tw("gloo", run.world);
  tw.run([&](int r) {
    auto f = std::make_shared<FullyShardedDataParallel>(nets[static_cast<size_t>(r)], borrow(tw.pg(r)), run.options);
    auto opt = makeOptimizer(/*adamw=*/true, f->parameters());
    std::unique_ptr<amp::GradScaler> scaler;
    if (run.reduce) scaler = std::make_unique<ShardedGradScaler>(*f, run.scaler);
    else scaler = std::make_unique<amp::GradScaler>(run.scaler);
    RankLog& log = logs[static_cast<size_t>(r)];
    for (int step = 0; step < run.steps; ++step) {
      opt->zeroGrad();
      scaler->scale(F::mseLoss((*f)(inputs(r, step)).to(DType::Float32), targets(r, step))).backward();
      if (auto it = run.poison.find({step, r}); it != run.poison.end()) {
        autograd::NoGradGuard ng;
        Tensor g = f->unit(it->second.first).shard().grad();
        g.select(0, 0).fill_(it->second.second);
      }
      scaler->unscale(*opt);
      if (run.clip && scaler->foundInf(*opt) == std::optional<bool>(false)) log.norms.push_back(f->clipGradNorm(1.0));
      log.stepped.push_back(scaler->step(*opt));
      scaler->update();
      log.scales.push_back(scaler->getScale());
      std::vector<Tensor> shards;
      for (const Tensor& p : f->parameters()) shards.push_back(p.detach().clone());
      log.shards.push_back(std::move(shards));
    }
    log.state = scaler->stateDict();
    FullyShardedDataParallel::SummonFullParams full(*f);
    for (const Tensor& p : nets[static_cast<size_t>(r)]->parameters()) log.full.push_back(p.detach().clone());
  });
  return logs;
}

bool sameValues(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].to(DType::Float32).toVector<float>() != b[i].to(DType::Float32).toVector<float>()) return false;
  return true;
}

void expectRanksAgree(const std::vector<RankLog>& logs) {
  for (size_t r = 1; r < logs.size(); ++r) {
    EXPECT_EQ(logs[r].stepped, logs[0].stepped) << "rank " << r;
    EXPECT_EQ(logs[r].scales, logs[0].scales) << "rank " << r;
    EXPECT_EQ(logs[r].norms, logs[0].norms) << "rank " << r;
    EXPECT_EQ(logs[r].state, logs[0].state) << "rank " << r;
    EXPECT_TRUE(sameValues(logs[r].full, logs[0].full)) << "rank " << r << "'s parameters differ from rank 0's";
  }
  for (size_t r = 0; r < logs.size(); ++r) {
    for (size_t k = 1; k < logs[r].stepped.size(); ++k) {
      if (logs[r].stepped[k]) continue;
      EXPECT_TRUE(sameValues(logs[r].shards[k], logs[r].shards[k - 1]))
          << "rank " << r << " changed its shards on skipped step " << k;
    }
  }
}

TEST(ShardedGradScaler, AnInfInOneRanksShardSkipsTheStepOnEveryRank) {
  Training run;
  // Step 2: an inf in rank 1's shard of unit 1; step 5: a NaN in rank 0's shard of the root unit.
  run.poison = {{{2, 1}, {1, kInf}}, {{5, 0}, {0, std::nan("")}}};
  std::vector<RankLog> logs = train(run);
  expectRanksAgree(logs);
  EXPECT_EQ(logs[0].stepped, (std::vector<bool>{true, true, false, true, true, false, true, true}));
  // Interval 2: grow after every 2nd clean step in a row, halve on an overflow.
  EXPECT_EQ(logs[0].scales, (std::vector<double>{1024, 2048, 1024, 1024, 2048, 1024, 1024, 2048}));
  EXPECT_EQ(logs[0].norms.size(), 6u);
}

TEST(ShardedGradScaler, WithoutTheReductionOnlyThePoisonedRankSkips) {
  Training run;
  run.reduce = false;
  run.clip = false;
  run.poison = {{{2, 1}, {1, kInf}}};
  std::vector<RankLog> logs = train(run);
  EXPECT_TRUE(logs[0].stepped[2]);
  EXPECT_FALSE(logs[1].stepped[2]);
  EXPECT_NE(logs[0].scales[2], logs[1].scales[2]);
  // Half the model took step 2 and half did not: the gathered parameters are still the same on
  // every rank (they are the shards side by side), but a mixture no single run produces.
  EXPECT_FALSE(sameValues(logs[0].shards[2], logs[0].shards[1]));
  EXPECT_TRUE(sameValues(logs[1].shards[2], logs[1].shards[1]));
}

TEST(ShardedGradScaler, Float16ComputeOverflowsAtFirstAndEveryRankAgrees) {
  Training run;
  run.steps = 10;
  run.options.mixedPrecision = {.paramDtype = DType::Float16};  // gradients reduced in float16 too
  run.scaler = {.growthInterval = 3};                           // 65536: inf in float16
  run.poison = {{{7, 1}, {2, kInf}}};
  std::vector<RankLog> logs = train(run);
  expectRanksAgree(logs);
  const std::vector<bool>& stepped = logs[0].stepped;
  EXPECT_FALSE(stepped[0]) << "65536 is inf in float16: the first step overflows by itself";
  EXPECT_FALSE(stepped[7]);
  int taken = 0;
  for (bool s : stepped) taken += s ? 1 : 0;
  EXPECT_GE(taken, 4) << "the scale never came down far enough";
  EXPECT_LT(logs[0].scales.back(), 65536.0);
}

TEST(ShardedGradScaler, BadOptionsAreValueErrors) {
  dist::testing::ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    FullyShardedDataParallel f(std::make_shared<Net>(42), borrow(tw.pg(r)));
    EXPECT_THROW(ShardedGradScaler(f, {.backoffFactor = 1.0}), ValueError);
    ShardedGradScaler ok(f);
    EXPECT_TRUE(ok.hasFoundInfReduction());
    EXPECT_EQ(ok.getScale(), 65536.0);
  });
}

TEST(ShardedGradScaler, TheStateTravelsInAnFSDPTrainingCheckpoint) {
  ::cohort::testing::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  std::vector<amp::GradScalerState> saved(2), restored(2);
  std::vector<nn::ModulePtr> nets = {std::make_shared<Net>(42), std::make_shared<Net>(43)};
  dist::testing::ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    FullyShardedDataParallel f(nets[static_cast<size_t>(r)], borrow(tw.pg(r)),
                               {.autoWrapPolicy = wrapModuleTypes({"Block"})});
    auto opt = makeOptimizer(/*adamw=*/true, f.parameters());
    ShardedGradScaler scaler(f, {.initScale = 256, .growthInterval = 3});
    for (int step = 0; step < 4; ++step) {
      opt->zeroGrad();
      scaler.scale(F::mseLoss(f(inputs(r, step)).to(DType::Float32), targets(r, step))).backward();
      if (step == 1 && r == 0) {
        autograd::NoGradGuard ng;
        f.unit(0).shard().grad().select(0, 0).fill_(kInf);
      }
      scaler.step(*opt);
      scaler.update();
    }
    saved[static_cast<size_t>(r)] = scaler.stateDict();
    saveTrainingCheckpoint(f, dir, opt.get(), {.step = 4, .gradScaler = scaler.stateDict()});
    ShardedGradScaler fresh(f);
    io::TrainingState st = loadTrainingCheckpoint(f, dir, {.optimizer = opt.get(), .gradScaler = &fresh});
    EXPECT_EQ(st.step, 4);
    restored[static_cast<size_t>(r)] = fresh.stateDict();
    // A checkpoint without a scaler state cannot restore into a scaler, on any rank.
    saveTrainingCheckpoint(f, dir, opt.get(), {.step = 5});
    EXPECT_THROW(loadTrainingCheckpoint(f, dir, {.gradScaler = &fresh}), CheckpointError);
  });
  // 256, then the inf at step 1: 128 (tracker 0), 2 clean steps: tracker 2.
  EXPECT_EQ(saved[0], (amp::GradScalerState{{"scale", 128},
                                            {"growth_tracker", 2},
                                            {"growth_factor", 2},
                                            {"backoff_factor", 0.5},
                                            {"growth_interval", 3}}));
  EXPECT_EQ(saved[1], saved[0]);
  EXPECT_EQ(restored[0], saved[0]);
  EXPECT_EQ(restored[1], saved[0]);
}

}  // namespace
}  // namespace cohort::fsdp::testing
