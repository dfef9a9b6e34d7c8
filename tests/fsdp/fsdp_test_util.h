// The FSDP tests' harness: a small model of "Block" units whose parameter counts need padding,
// per-rank data, and runScenario — N ranks as threads train with FSDP while one process trains
// the same model on the whole batch (loss = the mean over ranks of each rank's mean loss).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

#include "distributed/pg_test_util.h"

namespace cohort::fsdp::testing {

namespace F = nn::functional;

constexpr int64_t kD = 5, kH = 7;
constexpr int64_t kBlockNumel = kD * kH + kH + kH * kD + kD;  // 82: pads for 3 and 4 ranks
constexpr double kFp32Tol = 5e-6;

// x + b(tanh(a(x))): residual, so the unit's input gradient has two paths.
class Block : public nn::Module {
 public:
  explicit Block(Generator* g) : nn::Module("Block") {
    registerModule("a", std::make_shared<nn::Linear>(kD, kH, true, g));
    registerModule("b", std::make_shared<nn::Linear>(kH, kD, true, g));
  }
  Tensor forward(const Tensor& x) override { return x + (*child("b"))((*child("a"))(x).tanh()); }
};

// inp (6 -> 5), three Blocks, head (5 -> 3). Children are called through the registry.
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed) : nn::Module("Net") {
    Generator g(seed);
    registerModule("inp", std::make_shared<nn::Linear>(6, kD, true, &g));
    for (int i = 0; i < 3; ++i) registerModule(fmt::format("b{}", i), std::make_shared<Block>(&g));
    registerModule("head", std::make_shared<nn::Linear>(kD, 3, true, &g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*child("inp"))(x);
    for (int i = 0; i < 3; ++i) h = (*child(fmt::format("b{}", i)))(h);
    return (*child("head"))(h);
  }
};

inline Tensor inputs(int rank, int step) {
  Generator g(1000 + rank * 97 + step * 13);
  return randn({4, 6}, {}, &g);
}
inline Tensor targets(int rank, int step) {
  Generator g(5000 + rank * 97 + step * 13);
  return randn({4, 3}, {}, &g);
}

inline dist::ProcessGroupPtr borrow(dist::ProcessGroup& pg) {
  return std::shared_ptr<dist::ProcessGroup>(&pg, [](dist::ProcessGroup*) {});
}

struct Scenario {
  int world = 2;
  int steps = 3;
  FSDPOptions options;
  bool adamw = false;
  double clip = 0;                              // > 0: clipGradNorm before each step
  std::function<std::string(int rank)> nodeOf;  // HYBRID_SHARD: simulated nodes
  std::string backend = "gloo";
};

struct Outcome {
  std::vector<std::vector<Tensor>> rankParams;  // per rank, gathered module parameters in order
  std::vector<Tensor> reference;
  std::vector<std::vector<double>> rankNorms;  // clipGradNorm's results per step
  std::vector<double> referenceNorms;
  std::vector<int64_t> shardNumel, paddedNumel;  // rank 0, per unit
  std::vector<DType> shardDtypes;
};

inline std::unique_ptr<optim::Optimizer> makeOptimizer(bool adamw, const std::vector<Tensor>& params) {
  if (adamw) return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.01, .weightDecay = 0.1});
  return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

// Trains `world` FSDP ranks and the reference. makeModel(seed); step(model, rank, step) -> loss.
inline Outcome runGeneric(int world, int steps, const FSDPOptions& options, bool adamw, double clip,
                          const std::function<std::string(int)>& nodeOf, const std::string& backend,
                          const std::function<nn::ModulePtr(uint64_t)>& makeModel,
                          const std::function<Tensor(nn::Module&, int, int)>& loss) {
  Outcome out;
  out.rankParams.resize(world);
  out.rankNorms.resize(world);
  std::vector<nn::ModulePtr> nets;
  for (int r = 0; r < world; ++r) nets.push_back(makeModel(42 + r));  // construction copies rank 0's
  {
    dist::testing::ThreadWorld tw(backend, world);
    tw.run([&](int r) {
      FSDPOptions o = options;
      if (nodeOf) o.nodeId = nodeOf(r);
      auto f = std::make_shared<FullyShardedDataParallel>(nets[r], borrow(tw.pg(r)), o);
      auto opt = makeOptimizer(adamw, f->parameters());
      for (int step = 0; step < steps; ++step) {
        opt->zeroGrad();
        loss(*f, r, step).backward();
        if (clip > 0) out.rankNorms[r].push_back(f->clipGradNorm(clip));
        opt->step();
      }
      if (r == 0) {
        for (size_t u = 0; u < f->numUnits(); ++u) {
          out.shardNumel.push_back(f->unit(u).shardNumel());
          out.paddedNumel.push_back(f->unit(u).paddedNumel());
          out.shardDtypes.push_back(f->unit(u).shard().dtype());
        }
      }
      FullyShardedDataParallel::SummonFullParams full(*f);
      for (const Tensor& p : nets[r]->parameters()) out.rankParams[r].push_back(p.detach().clone());
    });
  }
  auto ref = makeModel(42);
  auto opt = makeOptimizer(adamw, ref->parameters());
  for (int step = 0; step < steps; ++step) {
    opt->zeroGrad();
    Tensor total;
    for (int r = 0; r < world; ++r) {
      Tensor l = loss(*ref, r, step);
      total = total.defined() ? total + l : l;
    }
    (total / static_cast<double>(world)).backward();
    if (clip > 0) out.referenceNorms.push_back(optim::clipGradNorm(ref->parameters(), clip));
    opt->step();
  }
  for (const Tensor& p : ref->parameters()) out.reference.push_back(p.detach().clone());
  return out;
}

inline Outcome runScenario(const Scenario& s) {
  return runGeneric(
      s.world, s.steps, s.options, s.adamw, s.clip, s.nodeOf, s.backend,
      [](uint64_t seed) { return std::make_shared<Net>(seed); },
      [](nn::Module& m, int r, int step) {
        return F::mseLoss(m(inputs(r, step)).to(DType::Float32), targets(r, step));
      });
}

// A GPT with tied embedding and output weights, each TransformerBlock a unit.
struct GptScenario {
  int world = 2;
  int steps = 3;
  FSDPOptions options;
};

inline nn::GPTConfig tinyGpt() {
  return {.vocabSize = 13,
          .blockSize = 8,
          .nLayer = 2,
          .nHead = 2,
          .nEmbd = 8,
          .dropout = 0.0,
          .bias = true,
          .tieWeights = true};
}

inline Outcome runGptScenario(const GptScenario& g) {
  return runGeneric(
      g.world, g.steps, g.options, /*adamw=*/true, 0, nullptr, "gloo",
      [](uint64_t seed) {
        Generator gen(seed);
        return std::make_shared<nn::GPT>(tinyGpt(), &gen);
      },
      [](nn::Module& m, int r, int step) {
        Generator gen(300 + r * 31 + step);
        Tensor idx = randint(0, 13, {2, 6}, {.dtype = DType::Int64}, &gen);
        Tensor tgt = randint(0, 13, {2, 6}, {.dtype = DType::Int64}, &gen);
        return F::crossEntropy(m(idx).view({-1, 13}), tgt.view({-1}));
      });
}

// Every rank holds the reference parameters (within `tol`), and every rank the same ones.
inline void expectMatchesReference(const Outcome& o, double tol) {
  for (size_t r = 0; r < o.rankParams.size(); ++r) {
    ASSERT_EQ(o.rankParams[r].size(), o.reference.size());
    for (size_t i = 0; i < o.reference.size(); ++i) {
      EXPECT_LE((o.rankParams[r][i] - o.reference[i]).abs().max().item<double>(), tol)
          << "rank " << r << " parameter " << i;
      EXPECT_EQ((o.rankParams[r][i] - o.rankParams[0][i]).abs().max().item<double>(), 0.0)
          << "rank " << r << " parameter " << i;
    }
  }
}

}  // namespace cohort::fsdp::testing
