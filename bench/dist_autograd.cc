// Training across RPC workers: cohort's distributed autograd + DistributedOptimizer on the same
// two-stage model bench/dist_autograd_torch.py trains with PyTorch's, on this host:
//   trainer (rank 0) -> "stage1" (Linear(w, w) + ReLU) -> "stage2" (Linear(w, w)) -> loss = mean((y - t)^2)
// One step: both stages' forward by rpcSync inside a distributed autograd context, ctx.backward,
// DistributedOptimizer (SGD, lr 0.01) over both stages' parameters. Two sizes:
//   small  batch 16, width 64       (latency-bound)
//   16mib  batch 65536, width 64    (each activation and its gradient is 16 MiB)
// Prints one JSON line per size: {"impl": "cohort", "model": ..., "ms_step": ...} (the median of
// --reps timed blocks of --steps steps, after --warmup steps), as the PyTorch script does.
// Every process uses one compute thread, as the PyTorch script sets torch.set_num_threads(1).
//
//   build/bench/dist_autograd [--steps 20] [--reps 3] [--warmup 3] [--models small,16mib]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <cohort/core/blas/blas.h>
#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/distributed_optimizer.h>

#include "harness/ranks.h"

using namespace cohort;
using Clock = std::chrono::steady_clock;

namespace {

const std::map<std::string, std::pair<int64_t, int64_t>> kSizes{{"small", {16, 64}}, {"16mib", {65536, 64}}};

// This worker's stage (remade for each model size).
struct Stage {
  Generator gen;
  nn::Linear linear;
  bool relu;
  Stage(int64_t width, bool relu, uint64_t seed) : gen(seed), linear(width, width, true, &gen), relu(relu) {}
  Tensor forward(const Tensor& x) {
    Tensor y = linear.forward(x);
    return relu ? y.relu() : y;
  }
};
std::unique_ptr<Stage> gStage;

void registerStage() {
  rpc::registerFunction("make_stage", [](int64_t width, bool relu, int64_t seed) {
    gStage = std::make_unique<Stage>(width, relu, static_cast<uint64_t>(seed));
    return std::vector<rpc::RRef<Tensor>>{rpc::makeRRef(gStage->linear.weight()), rpc::makeRRef(gStage->linear.bias())};
  });
  rpc::registerFunction("forward", [](Tensor x) { return gStage->forward(x); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort distributed autograd benchmark: a trainer and two stage workers on this host"};
  int steps = 20, reps = 3, warmup = 3;
  std::string models = "small,16mib";
  app.add_option("--steps", steps, "steps per timed block")->check(CLI::Range(1, 100000));
  app.add_option("--reps", reps, "timed blocks (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 100000));
  app.add_option("--models", models, "comma-separated sizes: small, 16mib");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> names;
  {
    std::stringstream ss(models);
    for (std::string m; std::getline(ss, m, ',');) {
      if (!kSizes.count(m)) {
        std::fprintf(stderr, "unknown model '%s' (known: small, 16mib)\n", m.c_str());
        return 2;
      }
      names.push_back(m);
    }
  }
  registerStage();

  char tmpl[] = "/tmp/cohort_bench_dist_autograd_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto options = [&] {
    rpc::RpcOptions o;
    o.store = std::make_shared<dist::FileStore>(dir + "/store", rpc::Millis(60'000));
    o.numWorkerThreads = 4;  // as the PyTorch script's num_worker_threads
    o.rpcTimeout = rpc::Millis(300'000);
    return o;
  };
  testing::RankOptions ranks;
  ranks.limit = std::chrono::minutes(10);
  ranks.stopOnFailure = true;
  ranks.tag = "dist_autograd";
  const char* workers[] = {"trainer", "stage1", "stage2"};
  auto results = testing::runRanks(
      3,
      [&](int rank, std::ostream&) -> int {
        blas::setNumThreads(1);
        rpc::init(workers[rank], rank, 3, options());
        if (rank != 0) {
          rpc::shutdown();
          return 0;
        }
        for (const std::string& name : names) {
          auto [batch, width] = kSizes.at(name);
          auto p1 = rpc::rpcSync<std::vector<rpc::RRef<Tensor>>>("stage1", "make_stage", width, true, 1);
          auto p2 = rpc::rpcSync<std::vector<rpc::RRef<Tensor>>>("stage2", "make_stage", width, false, 2);
          p1.insert(p1.end(), p2.begin(), p2.end());
          rpc::DistributedOptimizer opt("SGD", p1, {{"lr", 0.01}});
          Generator gen(0);
          Tensor x = randn({batch, width}, {}, &gen), target = randn({batch, width}, {}, &gen);
          auto step = [&] {
            rpc::autograd::Context ctx;
            Tensor h = rpc::rpcSync<Tensor>("stage1", "forward", x);
            Tensor y = rpc::rpcSync<Tensor>("stage2", "forward", h);
            Tensor loss = nn::functional::mseLoss(y, target);
            ctx.backward({loss});
            opt.step(ctx);
            return loss.itemDouble();
          };
          for (int i = 0; i < warmup; ++i) step();
          std::vector<double> ms;
          for (int r = 0; r < reps; ++r) {
            auto t0 = Clock::now();
            for (int i = 0; i < steps; ++i) step();
            ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps);
          }
          std::sort(ms.begin(), ms.end());
          std::printf(
              "{\"impl\": \"cohort\", \"model\": \"%s\", \"batch\": %lld, \"width\": %lld, \"ms_step\": %.3f}\n",
              name.c_str(), static_cast<long long>(batch), static_cast<long long>(width), ms[ms.size() / 2]);
          std::fflush(stdout);
        }
        rpc::shutdown();
        return 0;
      },
      ranks);
  std::filesystem::remove_all(dir);
  int code = 0;
  for (size_t r = 0; r < results.size(); ++r)
    if (!results[r].ok()) {
      std::fprintf(stderr, "%s: %s\n%s", workers[r], results[r].describe().c_str(), results[r].report.c_str());
      code = 1;
    }
  return code;
}
