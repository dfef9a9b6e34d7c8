// Trains a model split across two workers with distributed autograd: "stage0" holds the first
// half of an MLP, "stage1" the second, the driver holds the data and the loss. The driver never
// touches the activations between the stages: it asks stage0 for a remote reference to its
// output, passes that reference to stage1, which fetches the activations from stage0 itself, and
// the driver fetches only the final output. Every micro-batch is issued asynchronously, so the
// stages work on different micro-batches at once. Inside an rpc::autograd::Context all of this is
// recorded; ctx.backward runs backward on every worker, and a DistributedOptimizer steps both
// stages' parameters where they live. At the end the same model is trained in one process on the
// same data and the largest difference (losses and final weights, relative) is printed.
//
//   build-*/examples/rpc_model_parallel [--steps 60] [--micro-batches 4]     # forks the stages
//   cohortrun --standalone --nproc-per-node 3 build-*/examples/rpc_model_parallel --launched
//
// With --launched the processes come from a launcher (RANK, WORLD_SIZE, MASTER_ADDR/PORT): rank 0
// drives, ranks 1 and 2 are the stages, meeting through the job's store.
#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>

#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/distributed/init.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/distributed_optimizer.h>

#include "common/forked_workers.h"
#include "common/progress.h"

using namespace cohort;

namespace {

constexpr int64_t kRows = 16;  // per micro-batch
constexpr double kLr = 0.01;

// Both halves are built from fixed seeds, so every process (and the single-process check) has the
// same initial weights.
struct Stage {
  Generator gen;  // declared first: initialised before the layers draw from it
  nn::Linear a, b;
  Stage(uint64_t seed, int64_t in, int64_t hidden, int64_t out)
      : gen(seed), a(in, hidden, true, &gen), b(hidden, out, true, &gen) {}
  Tensor forward(const Tensor& x) { return b.forward(a.forward(x).relu()); }
  std::vector<Tensor> params() { return {a.weight(), a.bias(), b.weight(), b.bias()}; }
};
Stage makeStage0() { return Stage(11, 32, 64, 64); }
Stage makeStage1() { return Stage(21, 64, 64, 10); }
Stage& stage0() {
  static Stage s = makeStage0();
  return s;
}
Stage& stage1() {
  static Stage s = makeStage1();
  return s;
}

std::vector<rpc::RRef<Tensor>> rrefs(const std::vector<Tensor>& ps) {
  std::vector<rpc::RRef<Tensor>> out;
  for (const Tensor& p : ps) out.push_back(rpc::makeRRef(p));
  return out;
}
std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone());
  return out;
}

void registerStages() {
  rpc::registerFunction("stage0_forward", [](Tensor x) { return stage0().forward(x).relu(); });
  // Takes a reference: the activations come straight from stage0, never through the driver.
  rpc::registerFunction("stage1_forward", [](rpc::RRef<Tensor> h) { return stage1().forward(h.toHere()); });
  rpc::registerFunction("stage0_params", [] { return rrefs(stage0().params()); });
  rpc::registerFunction("stage1_params", [] { return rrefs(stage1().params()); });
  rpc::registerFunction("stage0_weights", [] { return copies(stage0().params()); });
  rpc::registerFunction("stage1_weights", [] { return copies(stage1().params()); });
}

// The data: random inputs, and targets from a fixed linear "teacher" the model can learn.
struct Batch {
  Tensor x, y;
};
Batch batchFor(int step, int microBatches) {
  static const Tensor kTeacher = [] {
    Generator gen(99);
    return randn({32, 10}, {}, &gen).mul(full({}, 0.2));
  }();
  Generator gen(1000 + static_cast<uint64_t>(step));
  Tensor x = randn({kRows * microBatches, 32}, {}, &gen);
  return {x, x.matmul(kTeacher)};
}

int drive(int steps, int microBatches) {
  auto params = rpc::rpcSync<std::vector<rpc::RRef<Tensor>>>("stage0", "stage0_params");
  auto more = rpc::rpcSync<std::vector<rpc::RRef<Tensor>>>("stage1", "stage1_params");
  params.insert(params.end(), more.begin(), more.end());
  rpc::DistributedOptimizer opt("Adam", params, {{"lr", kLr}});

  examples::Progress progress(steps, "samples");
  std::vector<double> losses;
  for (int step = 1; step <= steps; ++step) {
    Batch b = batchFor(step, microBatches);
    rpc::autograd::Context ctx;
    std::vector<Future<Tensor>> outs;
    for (const Tensor& mb : b.x.chunk(microBatches, 0)) {
      rpc::RRef<Tensor> h = rpc::remote<Tensor>("stage0", "stage0_forward", mb.contiguous());
      rpc::RRef<Tensor> y = rpc::remote<Tensor>("stage1", "stage1_forward", h);
      outs.push_back(y.toHereAsync());
    }
    std::vector<Tensor> parts;
    for (auto& f : outs) parts.push_back(f.value());
    Tensor loss = nn::functional::mseLoss(cat(parts, 0), b.y);
    ctx.backward({loss});
    opt.step(ctx);
    losses.push_back(loss.itemDouble());
    progress.add(b.x.size(0));
    if (step % 10 == 0 || step == 1 || step == steps) progress.log(step, losses.back());
  }

  // The same training in one process.
  Stage s0 = makeStage0(), s1 = makeStage1();
  std::vector<Tensor> local = s0.params();
  for (const Tensor& p : s1.params()) local.push_back(p);
  optim::Adam ref(local, {.lr = kLr});
  double worst = 0;
  for (int step = 1; step <= steps; ++step) {
    Batch b = batchFor(step, microBatches);
    ref.zeroGrad();
    Tensor loss = nn::functional::mseLoss(s1.forward(s0.forward(b.x).relu()), b.y);
    loss.backward();
    ref.step();
    worst = std::max(worst, std::abs(loss.itemDouble() - losses[step - 1]) / std::abs(loss.itemDouble()));
  }
  auto trained = rpc::rpcSync<std::vector<Tensor>>("stage0", "stage0_weights");
  auto trained1 = rpc::rpcSync<std::vector<Tensor>>("stage1", "stage1_weights");
  trained.insert(trained.end(), trained1.begin(), trained1.end());
  for (size_t i = 0; i < trained.size(); ++i)
    worst = std::max(worst, examples::relativeDifference(trained[i], local[i].detach()));
  std::printf("%d steps of %d micro-batches through stage0 -> stage1: loss %.4f -> %.4f\n", steps, microBatches,
              losses.front(), losses.back());
  std::printf("max difference from one process: %.3g\n", worst);
  bool learned = losses.back() < losses.front();
  return worst <= 1e-5 && learned ? 0 : 1;
}

int runRole(int rank, int steps, int microBatches, rpc::RpcOptions options) {
  const char* names[] = {"driver", "stage0", "stage1"};
  rpc::init(names[rank], rank, 3, std::move(options));
  int code = rank == 0 ? drive(steps, microBatches) : 0;
  rpc::shutdown();  // the stages serve until the driver is done
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train a model split across two workers with distributed autograd"};
  int steps = 60, microBatches = 4;
  bool launched = false;
  app.add_option("--steps", steps, "training steps")->check(CLI::Range(1, 100000));
  app.add_option("--micro-batches", microBatches, "micro-batches of 16 rows per step")->check(CLI::Range(1, 1024));
  app.add_flag("--launched", launched, "processes come from a launcher (3 ranks): rank 0 drives, 1 and 2 are stages");
  CLI11_PARSE(app, argc, argv);
  registerStages();

  if (launched) {
    auto pg = dist::initProcessGroup();
    if (pg->size() != 3) {
      std::fprintf(stderr, "rpc_model_parallel --launched needs 3 processes, got %d\n", pg->size());
      return 2;
    }
    return runRole(pg->rank(), steps, microBatches, {});  // the process group's store
  }
  return examples::runForkedWorkers(3, [&](int rank, rpc::RpcOptions o) {
    return runRole(rank, steps, microBatches, std::move(o));
  });
}
