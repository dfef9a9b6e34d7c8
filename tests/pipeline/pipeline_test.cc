// Pipeline training equals one process: every built-in schedule, 2, 3 and 4 ranks, micro-batch
// counts below, equal to and above the stage count, batches whose size changes every step and
// does not divide into the micro-batches; over a process group's send/recv and over RPC.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/pipeline/pipeline.h>
#include <cohort/pipeline/split.h>
#include <cohort/rpc/rpc.h>

#include "distributed/fork_util.h"
#include "pipeline/pipeline_test_util.h"

namespace cohort::pipeline {
namespace {
using namespace testing;

struct Config {
  std::string schedule;
  int m;
  int chunks = 0;
  bool checkpoint = false;  // every stage recomputes its forward in backward
  int lookahead = 0;
  int split = 0;  // PipelineOptions::splitTail
  std::string str() const {
    return fmt::format("{} m={}{}{}{}{}", schedule, m, chunks ? fmt::format(" chunks={}", chunks) : "",
                       checkpoint ? " checkpointed" : "", lookahead ? fmt::format(" lookahead={}", lookahead) : "",
                       split ? fmt::format(" split={}", split) : "");
  }
};

std::vector<Config> configsFor(int p) {
  std::vector<Config> out;
  for (const char* s : {"gpipe", "1f1b", "zb"})
    for (int m : {p - 1, p, p + 1, 2 * p + 1})
      if (m >= 1) out.push_back({s, m});
  for (int m : {p, 2 * p, 3 * p}) out.push_back({"interleaved", m, 2});  // below, at, above 2p stages
  for (int m : {p - 1, 2 * p, 2 * p + 1})                                // the V takes any count
    if (m >= 1) out.push_back({"v", m, 2});
  out.push_back({"1f1b", p + 1, 0, true});
  out.push_back({"zb", p + 1, 0, true});
  out.push_back({"1f1b", 2 * p + 1, 0, false, 1});
  out.push_back({"zb", 2 * p + 1, 0, false, 2});
  // The last backwards split into I and W (splitTail): a few, all of them, and with a lookahead.
  out.push_back({"1f1b", 2 * p + 1, 0, false, 0, p - 1});
  out.push_back({"gpipe", p + 1, 0, false, 0, p + 1});
  out.push_back({"interleaved", 2 * p, 2, false, 0, p});
  out.push_back({"v", 2 * p + 1, 2, false, 0, 1});
  out.push_back({"1f1b", p + 1, 0, true, 1, 2});
  return out;
}

// Trains `c` on this rank; "" when the losses and this rank's final weights equal one process's.
std::string trainAndCompare(const TransportPtr& transport, const Config& c) {
  const int p = transport->size(), S = p * (c.chunks ? c.chunks : 1);
  Reference ref = oneProcess(S, c.m);
  auto all = makeStages(S);
  Schedule sched = makeSchedule(c.schedule, p, c.m, c.chunks, c.lookahead);
  std::string err;
  std::vector<nn::ModulePtr> mine;
  for (int s : sched.stagesOf(transport->rank())) mine.push_back(all[static_cast<size_t>(s)]);
  PipelineOptions po;
  if (c.checkpoint)
    for (int s = 0; s < S; ++s) po.checkpointStages.push_back(s);
  po.splitTail = c.split;
  Pipeline pipe(mine, transport, mse, sched, po);
  if (c.split > 0 && !pipe.schedule().splitsBackward()) err += fmt::format("{}: no backward was split; ", c.str());
  optim::SGD opt(pipe.parameters(), {.lr = kLr});
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
    EXPECT_EQ(results[r].report, "ok") << "rank " << r << " (" << dist::testing::describeStatus(results[r].status)
                                       << ")";
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

// A GPT split in stages (embeddings on the first, LM head on the last: the tied weight has a
// copy on each) trains as the whole GPT in one process, gradient clipping included.
TEST(Pipeline, SplitGPTWithTiedWeightsEqualsOneProcess) {
  nn::GPTConfig cfg;
  cfg.vocabSize = 11;
  cfg.blockSize = 8;
  cfg.nLayer = 3;
  cfg.nHead = 2;
  cfg.nEmbd = 16;
  auto data = [&](int k) {
    Generator g(50 + static_cast<uint64_t>(k));
    return std::pair{randint(0, cfg.vocabSize, {7, cfg.blockSize}, {.dtype = DType::Int64}, &g),
                     randint(0, cfg.vocabSize, {7, cfg.blockSize}, {.dtype = DType::Int64}, &g)};
  };
  auto ce = [&](const Tensor& logits, const Tensor& t) {
    return nn::functional::crossEntropy(logits.reshape({-1, cfg.vocabSize}), t.reshape({-1}));
  };
  std::vector<double> losses, norms;
  Generator g0(7);
  auto ref = std::make_shared<nn::GPT>(cfg, &g0);
  {
    optim::SGD opt(ref->parameters(), {.lr = 0.5});
    for (int k = 0; k < kSteps; ++k) {
      auto [x, y] = data(k);
      opt.zeroGrad();
      Tensor loss = ce((*ref)(x), y);
      loss.backward();
      losses.push_back(loss.itemDouble());
      norms.push_back(optim::clipGradNorm(ref->parameters(), 0.5));
      opt.step();
    }
  }
  nn::StateDict want = ref->stateDict();
  // 1f1b, zero bubble, and 1f1b with its last two micro-batches' backwards split (the tied
  // embedding's gradient then arrives from a postponed weight backward).
  for (auto [sched, tail] : std::vector<std::pair<const char*, int>>{{"1f1b", 0}, {"zb", 0}, {"1f1b", 2}}) {
    dist::testing::TempDir dir;
    auto results = dist::testing::runForked(3, std::chrono::seconds(120), dir.path().string(), [&](int rank) {
      auto store = std::make_shared<dist::FileStore>(dir.file("store"), std::chrono::milliseconds(30'000));
      auto pg = dist::ProcessGroup::create(store, rank, 3, {.backend = "gloo"});
      Generator g(7);
      auto gpt = std::make_shared<nn::GPT>(cfg, &g);
      StageSplit split = splitGPT(gpt, 3);
      if (split.tied.size() != 1) return std::string("the split names no tied weight");
      Pipeline pipe({split.stages[static_cast<size_t>(rank)]}, processGroupTransport(pg), ce,
                    {.schedule = sched, .microbatches = 3, .splitTail = tail, .tied = split.tied});
      optim::SGD opt(pipe.parameters(), {.lr = 0.5});
      std::string err;
      for (int k = 0; k < kSteps; ++k) {
        auto [x, y] = data(k);
        opt.zeroGrad();
        const double loss = pipe.step(x, y).itemDouble();
        if (std::abs(loss - losses[static_cast<size_t>(k)]) > 1e-5)
          err += fmt::format("step {} loss {} vs {}; ", k, loss, losses[static_cast<size_t>(k)]);
        // The global norm over every stage (the tied weight once), clipped as one process does.
        const double norm = pipe.clipGradNorm(0.5);
        if (std::abs(norm - norms[static_cast<size_t>(k)]) > 1e-5 * norms[static_cast<size_t>(k)])
          err += fmt::format("step {} gradient norm {} vs {}; ", k, norm, norms[static_cast<size_t>(k)]);
        opt.step();
      }
      // This rank's stage holds the GPT's own modules: its state dict is the GPT's, by name.
      for (const auto& [name, t] : split.stages[static_cast<size_t>(rank)]->stateDict()) {
        const double diff = (t - want[name]).abs().max().itemDouble();
        if (diff > 2e-5) err += fmt::format("{} differs by {}; ", name, diff);
      }
      return err.empty() ? std::string("ok") : err;
    });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].report, "ok") << sched << " split " << tail << " rank " << r;
  }
}

TEST(Pipeline, SplitSequential) {
  auto seq =
      std::make_shared<nn::Sequential>(nn::Linear(2, 2), nn::Tanh(), nn::Linear(2, 2), nn::Tanh(), nn::Linear(2, 1));
  StageSplit even = splitSequential(seq, 2);
  ASSERT_EQ(even.stages.size(), 2u);
  EXPECT_EQ(std::dynamic_pointer_cast<nn::Sequential>(even.stages[0])->size(), 3u);
  EXPECT_EQ(std::dynamic_pointer_cast<nn::Sequential>(even.stages[1])->size(), 2u);
  StageSplit at = splitSequential(seq, 3, {1, 4});
  EXPECT_EQ(std::dynamic_pointer_cast<nn::Sequential>(at.stages[1])->size(), 3u);
  // The stages share the model's modules.
  EXPECT_EQ((*std::dynamic_pointer_cast<nn::Sequential>(at.stages[2]))[0].get(), (*seq)[4].get());
  Tensor x = randn({4, 2});
  Tensor h = x;
  for (auto& s : at.stages) h = (*s)(h);
  EXPECT_EQ((h - (*seq)(x)).abs().max().itemDouble(), 0.0);
  EXPECT_THROW(splitSequential(seq, 6), ValueError);
  EXPECT_THROW(splitSequential(seq, 3, {2, 2}), ValueError);
  nn::GPTConfig cfg;
  cfg.vocabSize = 5;
  cfg.blockSize = 4;
  cfg.nLayer = 2;
  cfg.nHead = 1;
  cfg.nEmbd = 4;
  EXPECT_THROW(splitGPT(std::make_shared<nn::GPT>(cfg), 3), ValueError);
}

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
    // Stages on the CPU with a transport that delivers to a GPU (no GPU needed to be refused).
    auto pg = dist::ProcessGroup::create(std::make_shared<dist::HashStore>(), 0, 1, {.backend = "gloo"});
    TransportPtr toGpu = processGroupTransport(pg, Device::cuda(0));
    if (toGpu->device() != Device::cuda(0) || t->device() != Device::cpu()) throw Error("transport devices");
    expect(errorAs<ValueError>([&] { Pipeline(stages, toGpu, mse, interleaved1F1B(1, 2, 2)); }),
           "stage 0's parameter '0.weight' is on cpu, but the transport (process group (gloo)) places what it "
           "receives on cuda:0");
    // A batch smaller than the micro-batch count, and a missing input.
    Pipeline pipe(stages, t, mse, interleaved1F1B(1, 2, 4));
    expect(errorAs<ValueError>([&] {
             pipe.step(randn({3, kWidth}), randn({3, kOut}));
           }),
           "the input has 3 rows along dim 0, fewer than the 4 micro-batches");
    expect(errorAs<ValueError>([&] {
             pipe.step(Tensor(), randn({8, kOut}));
           }),
           "rank 0 holds the first stage but got no input");
    // A loss that is not one element: the error names the action.
    Pipeline bad(
        stages, t, [](const Tensor& o, const Tensor&) { return o; }, interleaved1F1B(1, 2, 2));
    expect(errorAs<ValueError>([&] {
             bad.step(randn({4, kWidth}), randn({4, kOut}));
           }),
           "pipeline 'interleaved' rank 0 (stage 1): F(stage 1, micro-batch 0) failed: the loss function must "
           "return a one-element tensor");
    // After a failed step the pipeline runs again.
    Tensor loss = pipe.step(randn({8, kWidth}), randn({8, kOut}));
    if (!(loss.itemDouble() > 0)) throw Error("no loss after a failed step");
  });
}

}  // namespace
}  // namespace cohort::pipeline
