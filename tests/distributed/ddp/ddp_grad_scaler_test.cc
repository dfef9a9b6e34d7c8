// amp::GradScaler under DistributedDataParallel (ranks as threads over gloo): an inf or NaN put
// into ONE rank's gradient after the all-reduce makes every rank skip that step and back off the
// same way, through dist::foundInfAllReduce; all ranks keep identical parameters and scales, and
// a skipped step changes no parameter. Without the reduction only the rank with the inf skips
// and the replicas drift apart (the inf really was local). Also: foundInfAllReduce's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/grad_scaler.h>

#include "distributed/pg_test_util.h"

namespace cohort::dist::testing {
namespace {

namespace F = nn::functional;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kSteps = 9;

std::shared_ptr<nn::Sequential> makeNet(uint64_t seed) {
  manualSeed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(6, 10), nn::Tanh(), nn::Linear(10, 3));
}

Tensor inputs(int rank, int step) {
  Generator g(1000 + rank * 97 + step * 13);
  return randn({4, 6}, {}, &g);
}
Tensor targets(int rank, int step) {
  Generator g(5000 + rank * 97 + step * 13);
  return randn({4, 3}, {}, &g);
}

struct RankLog {
  std::vector<bool> stepped;
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  std::vector<std::vector<Tensor>> params;  // after each step
};

// (step, rank) -> the value written into that rank's first gradient element after backward.
using Poison = std::map<std::pair<int, int>, double>;

std::vector<RankLog> train(int world, const Poison& poison, bool reduce) {
  std::vector<RankLog> logs(static_cast<size_t>(world));
  ThreadWorld tw("gloo", world);
  tw.run([&](int r) {
    auto pg = tw.pg(r).shared_from_this();
    auto ddp = std::make_shared<DistributedDataParallel>(makeNet(42 + static_cast<uint64_t>(r)), pg);
    optim::SGD opt(ddp->parameters(), {.lr = 0.05, .momentum = 0.9});
    amp::GradScaler scaler({.initScale = 4096, .growthInterval = 3}, reduce ? foundInfAllReduce(pg) : nullptr);
    RankLog& log = logs[static_cast<size_t>(r)];
    for (int step = 0; step < kSteps; ++step) {
      opt.zeroGrad();
      scaler.scale(F::mseLoss((*ddp)(inputs(r, step)), targets(r, step))).backward();
      if (auto it = poison.find({step, r}); it != poison.end()) {
        autograd::NoGradGuard ng;
        Tensor g = ddp->parameters()[0].grad();
        g.flatten().select(0, 0).fill_(it->second);
      }
      log.stepped.push_back(scaler.step(opt));
      scaler.update();
      log.scales.push_back(scaler.getScale());
      log.trackers.push_back(scaler.growthTracker());
      std::vector<Tensor> ps;
      for (const Tensor& p : ddp->parameters()) ps.push_back(p.detach().clone());
      log.params.push_back(std::move(ps));
    }
  });
  return logs;
}

bool sameValues(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].toVector<float>() != b[i].toVector<float>()) return false;
  return true;
}

class DDPGradScaler : public ::testing::TestWithParam<int> {};

TEST_P(DDPGradScaler, AnInfOnOneRankSkipsTheStepOnEveryRank) {
  const int world = GetParam();
  // Step 2: an inf on rank 1 only; step 6: a NaN on the last rank only.
  const Poison poison = {{{2, 1}, kInf}, {{6, world - 1}, std::nan("")}};
  std::vector<RankLog> logs = train(world, poison, /*reduce=*/true);
  const std::vector<bool> expectStepped = {true, true, false, true, true, true, false, true, true};
  const std::vector<double> expectScales = {4096, 4096, 2048, 2048, 2048, 4096, 2048, 2048, 2048};
  for (int r = 0; r < world; ++r) {
    const RankLog& log = logs[static_cast<size_t>(r)];
    EXPECT_EQ(log.stepped, expectStepped) << "rank " << r;
    EXPECT_EQ(log.scales, expectScales) << "rank " << r;
    EXPECT_EQ(log.trackers, logs[0].trackers) << "rank " << r;
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_TRUE(sameValues(log.params[static_cast<size_t>(step)], logs[0].params[static_cast<size_t>(step)]))
          << "rank " << r << " differs from rank 0 after step " << step;
      if (!log.stepped[static_cast<size_t>(step)]) {
        EXPECT_TRUE(sameValues(log.params[static_cast<size_t>(step)], log.params[static_cast<size_t>(step - 1)]))
            << "rank " << r << " changed its parameters on skipped step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DDPGradScaler, ::testing::Values(2, 3));

TEST(DDPGradScalerControl, WithoutTheReductionOnlyTheRankWithTheInfSkips) {
  std::vector<RankLog> logs = train(2, {{{2, 1}, kInf}}, /*reduce=*/false);
  EXPECT_TRUE(logs[0].stepped[2]);
  EXPECT_FALSE(logs[1].stepped[2]);
  EXPECT_NE(logs[0].scales[2], logs[1].scales[2]);
  EXPECT_FALSE(sameValues(logs[0].params.back(), logs[1].params.back()));
}

TEST(FoundInfAllReduce, ANullGroupIsAValueError) {
  try {
    foundInfAllReduce(nullptr);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("foundInfAllReduce: the process group is null"), std::string::npos);
  }
}

TEST(FoundInfAllReduce, CombinesTheFlagsWithMax) {
  ThreadWorld tw("gloo", 3);
  std::vector<std::vector<char>> got(3);
  tw.run([&](int r) {
    amp::FoundInfReduction reduce = foundInfAllReduce(tw.pg(r).shared_from_this());
    for (int round = 0; round < 4; ++round) got[static_cast<size_t>(r)].push_back(reduce(round == r + 1));
  });
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<char>{0, 1, 1, 1}));
}

}  // namespace
}  // namespace cohort::dist::testing
