// Pipeline training equals one process: every built-in schedule, 2, 3 and 4 ranks, micro-batch
// counts below, equal to and above the stage count, batches whose size changes every step and
// does not divide into the micro-batches; over a process group's send/recv and over RPC.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/pipeline/pipeline.h>
#include <cohort/rpc/rpc.h>

#include "distributed/fork_util.h"

namespace cohort::pipeline {
namespace {

constexpr int64_t kWidth = 8, kOut = 3;
constexpr int kSteps = 10;
constexpr double kLr = 0.1;

// Stage k of an S-stage model: Linear + Tanh, the last one a Linear to kOut (same weights in
// every process: one generator, stages made in order).
std::vector<nn::ModulePtr> makeStages(int S) {
  Generator g(1234);
  std::vector<nn::ModulePtr> out;
  for (int k = 0; k < S; ++k) {
    if (k + 1 < S)
      out.push_back(std::make_shared<nn::Sequential>(nn::Linear(kWidth, kWidth, true, &g), nn::Tanh()));
    else
      out.push_back(std::make_shared<nn::Linear>(kWidth, kOut, true, &g));
  }
  return out;
}

// Step k's batch: its size changes every step and is not a multiple of m.
std::pair<Tensor, Tensor> batch(int k, int m) {
  Generator g(100 + static_cast<uint64_t>(k));
  const int64_t n = 2 * m + 1 + k % 3;
  return {randn({n, kWidth}, {}, &g), randn({n, kOut}, {}, &g)};
}

Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mseLoss(out, target); }

struct Reference {
  std::vector<double> losses;
  std::vector<std::vector<Tensor>> params;  // per stage
};

Reference oneProcess(int S, int m) {
  auto stages = makeStages(S);
  std::vector<Tensor> params;
  for (auto& s : stages)
    for (auto& p : s->parameters()) params.push_back(p);
  optim::SGD opt(params, {.lr = kLr});
  Reference ref;
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, m);
    opt.zeroGrad();
    Tensor h = x;
    for (auto& s : stages) h = (*s)(h);
    Tensor loss = mse(h, y);
    loss.backward();
    ref.losses.push_back(loss.itemDouble());
    opt.step();
  }
  for (auto& s : stages) ref.params.push_back(s->parameters());
  return ref;
}

struct Config {
  std::string schedule;
  int m;
  int chunks = 0;
  std::string str() const { return fmt::format("{} m={}{}", schedule, m, chunks ? fmt::format(" chunks={}", chunks) : ""); }
};

std::vector<Config> configsFor(int p) {
  std::vector<Config> out;
  for (const char* s : {"gpipe", "1f1b", "zb"})
    for (int m : {p - 1, p, p + 1, 2 * p + 1})
      if (m >= 1) out.push_back({s, m});
  for (int m : {p, 2 * p, 3 * p}) out.push_back({"interleaved", m, 2});  // below, at, above 2p stages
  return out;
}

// Trains `c` on this rank; "" when the losses and this rank's final weights equal one process's.
std::string trainAndCompare(const TransportPtr& transport, const Config& c) {
  const int p = transport->size(), S = p * (c.chunks ? c.chunks : 1);
  Reference ref = oneProcess(S, c.m);
  auto all = makeStages(S);
  Schedule sched = makeSchedule(c.schedule, p, c.m, c.chunks);
  std::vector<nn::ModulePtr> mine;
  for (int s : sched.stagesOf(transport->rank())) mine.push_back(all[static_cast<size_t>(s)]);
  Pipeline pipe(mine, transport, mse, sched);
  optim::SGD opt(pipe.parameters(), {.lr = kLr});
  std::string err;
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, c.m);
    opt.zeroGrad();
    Tensor loss = pipe.step(pipe.holdsFirstStage() ? x : Tensor(), pipe.holdsLastStage() ? y : Tensor());
    const double got = loss.itemDouble(), want = ref.losses[static_cast<size_t>(k)];
    if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want)))
      err += fmt::format("{}: step {} loss {} vs one process {}; ", c.str(), k, got, want);
    opt.step();
  }
  for (int s : pipe.stageIndices()) {
    auto mineP = all[static_cast<size_t>(s)]->parameters();
    for (size_t j = 0; j < mineP.size(); ++j) {
      const double diff = (mineP[j] - ref.params[static_cast<size_t>(s)][j]).abs().max().itemDouble();
      if (diff > 2e-5) err += fmt::format("{}: stage {} parameter {} differs by {}; ", c.str(), s, j, diff);
    }
  }
  return err;
}

enum class Via { Gloo, Shm, Rpc };

// Runs every configuration for `p` ranks as forked processes over `via`.
void runAll(int p, Via via, const std::vector<Config>& configs) {
  dist::testing::TempDir dir;
  auto results = dist::testing::runForked(p, std::chrono::seconds(240), dir.path().string(), [&](int rank) {
    std::string report;
    TransportPtr transport;
    dist::ProcessGroupPtr pg;
    auto store = std::make_shared<dist::FileStore>(dir.file("store"), std::chrono::milliseconds(30'000));
    if (via == Via::Rpc) {
      rpc::RpcOptions o;
      o.store = store;
      rpc::init(fmt::format("stage{}", rank), rank, p, o);
      std::vector<std::string> names;
      for (int r = 0; r < p; ++r) names.push_back(fmt::format("stage{}", r));
      transport = rpcTransport(names);
    } else {
      pg = dist::ProcessGroup::create(store, rank, p, {.backend = via == Via::Gloo ? "gloo" : "shm"});
      transport = processGroupTransport(pg);
    }
    for (const Config& c : configs) {
      try {
        report += trainAndCompare(transport, c);
      } catch (const std::exception& e) {
        report += fmt::format("{}: {}; ", c.str(), e.what());
      }
    }
    transport.reset();
    if (via == Via::Rpc) rpc::shutdown();
    return report.empty() ? std::string("ok") : report;
  });
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(results[r].report, "ok") << "rank " << r << " (" << dist::testing::describeStatus(results[r].status) << ")";
}

class EqualsOneProcess : public ::testing::TestWithParam<std::tuple<int, Via>> {};

TEST_P(EqualsOneProcess, EverySchedule) {
  auto [p, via] = GetParam();
  runAll(p, via, configsFor(p));
}

INSTANTIATE_TEST_SUITE_P(Pipeline, EqualsOneProcess,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(Via::Gloo, Via::Rpc)),
                         [](const auto& info) {
                           return fmt::format("p{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) == Via::Rpc ? "rpc" : "gloo");
                         });

TEST(Pipeline, ShmBackendToo) { runAll(2, Via::Shm, configsFor(2)); }

// Runs body(transport) in one forked process over a one-rank gloo group (the test process
// itself never starts gloo: children forked later would inherit its threads' state).
void inOneRank(const std::function<void(const TransportPtr&)>& body) {
  dist::testing::TempDir dir;
  auto results = dist::testing::runForked(1, std::chrono::seconds(120), dir.path().string(), [&](int) {
    auto pg = dist::ProcessGroup::create(std::make_shared<dist::HashStore>(), 0, 1, {.backend = "gloo"});
    try {
      body(processGroupTransport(pg));
    } catch (const std::exception& e) {
      return std::string("exception: ") + e.what();
    }
    return std::string(::testing::Test::HasFailure() ? "failed" : "ok");
  });
  EXPECT_EQ(results[0].report, "ok") << dist::testing::describeStatus(results[0].status);
}

// One rank: every stage local, tensors handed over in memory.
TEST(Pipeline, OneRankHoldsEveryStage) {
  inOneRank([](const TransportPtr& t) {
    for (const Config& c : {Config{"1f1b", 3}, Config{"interleaved", 4, 3}, Config{"zb", 2}})
      if (std::string e = trainAndCompare(t, c); !e.empty()) throw Error(e);
  });
}

// Returns the message of the exception `fn` throws as E ("" if none, "wrong type: ..." otherwise).
template <typename E, typename F>
std::string errorAs(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong type: ") + e.what();
  }
  return "";
}

TEST(Pipeline, RefusesWhatCannotRun) {
  inOneRank([](const TransportPtr& t) {
    auto stages = makeStages(2);
    auto expect = [](const std::string& msg, const std::string& part) {
      if (msg.find(part) == std::string::npos)
        throw Error(fmt::format("expected an error with '{}', got '{}'", part, msg));
    };
    // A schedule for another number of ranks.
    expect(errorAs<ScheduleError>([&] { Pipeline({stages[0]}, t, mse, oneFOneB(2, 4)); }),
           "schedule '1f1b' is for 2 ranks, the transport (process group (gloo)) has 1");
    // A broken schedule is refused before anything runs, naming what is wrong.
    Schedule broken = interleaved1F1B(1, 2, 2);
    broken.actions[0].pop_back();
    expect(errorAs<ScheduleError>([&] { Pipeline(stages, t, mse, broken); }),
           "rank 0 never runs the backward (B, or I and W) of micro-batch 1 on stage 0");
    // The wrong number of modules for the stages placed here.
    expect(errorAs<ValueError>([&] { Pipeline({stages[0]}, t, mse, interleaved1F1B(1, 2, 2)); }),
           "places 2 stage(s) on rank 0 (0, 1), 1 module(s) given");
    // A batch smaller than the micro-batch count, and a missing input.
    Pipeline pipe(stages, t, mse, interleaved1F1B(1, 2, 4));
    expect(errorAs<ValueError>([&] { pipe.step(randn({3, kWidth}), randn({3, kOut})); }),
           "the input has 3 rows along dim 0, fewer than the 4 micro-batches");
    expect(errorAs<ValueError>([&] { pipe.step(Tensor(), randn({8, kOut})); }),
           "rank 0 holds the first stage but got no input");
    // A loss that is not one element: the error names the action.
    Pipeline bad(stages, t, [](const Tensor& o, const Tensor&) { return o; }, interleaved1F1B(1, 2, 2));
    expect(errorAs<ValueError>([&] { bad.step(randn({4, kWidth}), randn({4, kOut})); }),
           "pipeline 'interleaved' rank 0 (stage 1): F(stage 1, micro-batch 0) failed: the loss function must "
           "return a one-element tensor");
    // After a failed step the pipeline runs again.
    Tensor loss = pipe.step(randn({8, kWidth}), randn({8, kOut}));
    if (!(loss.itemDouble() > 0)) throw Error("no loss after a failed step");
  });
}

}  // namespace
}  // namespace cohort::pipeline
