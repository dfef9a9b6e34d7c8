// DDP combined with RPC: trainers each hold a DDP-wrapped dense layer and share an embedding
// table that lives on a parameter server ("ps"). Every step, each trainer looks its ids up on the
// server (an RPC whose result requires grad), runs its dense part under DDP, and calls one
// distributed backward: DDP's bucketed all-reduce averages the dense gradients among the trainers
// while the table's gradients travel back to the server; a DistributedOptimizer then steps both.
// At the end the same model is trained in one process on the whole batch and the largest relative
// difference of the final weights is printed.
//
//   build-*/examples/rpc_ddp [--trainers 2] [--steps 20]                       # forks everything
//   cohortrun --standalone --nproc-per-node 3 build-*/examples/rpc_ddp --launched
//
// One-process equivalence: DDP averages the dense gradients, so the dense layer sees the whole
// batch's gradient; each trainer steps the shared table with the gradient of its own share, so
// the table's learning rate is lr / trainers (its updates add up to one step on the average).
// The trainers meet at a barrier after each step, so that every lookup of the next step sees both
// updates, as one process would.
#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>

#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/store/prefix_store.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/distributed_optimizer.h>

#include "common/forked_workers.h"
#include "common/progress.h"

using namespace cohort;

namespace {

constexpr int64_t kVocab = 100, kDim = 16, kOut = 4, kBatch = 32;
constexpr double kLr = 0.2;

nn::Embedding makeTable() {
  static Generator gen(5);
  return nn::Embedding(kVocab, kDim, &gen);
}
nn::Embedding& table() {
  static nn::Embedding t = makeTable();
  return t;
}
std::shared_ptr<nn::Linear> makeDense() {
  Generator gen(6);
  return std::make_shared<nn::Linear>(kDim, kOut, true, &gen);
}

// The whole batch of a step: ids and a target that depends on them.
std::pair<Tensor, Tensor> batchFor(int step) {
  Generator gen(500 + static_cast<uint64_t>(step));
  Tensor ids = randint(0, kVocab, {kBatch}, {.dtype = DType::Int64}, &gen);
  Tensor target = ids.to(DType::Float32).div(full({}, static_cast<double>(kVocab))).unsqueeze(1).expand({kBatch, kOut});
  return {ids, target.contiguous()};
}

void registerServer() {
  rpc::registerFunction("lookup", [](Tensor ids) { return table().forward(ids); });
  rpc::registerFunction("table_rref", [] { return rpc::makeRRef(table().weight()); });
  rpc::registerFunction("table_weight", [] { return table().weight().detach().clone(); });
}

int train(int trainer, int trainers, int steps, const dist::ProcessGroupPtr& pg) {
  auto dense = makeDense();
  auto ddp = std::make_shared<dist::DistributedDataParallel>(dense, pg);
  auto tableRef = rpc::rpcSync<rpc::RRef<Tensor>>("ps", "table_rref");
  rpc::DistributedOptimizer opt("SGD",
                                {{{rpc::makeRRef(dense->weight()), rpc::makeRRef(dense->bias())}, {}},
                                 {{tableRef}, {{"lr", kLr / trainers}}}},
                                {{"lr", kLr}});
  const int64_t share = kBatch / trainers;
  examples::Progress progress(steps, "samples");
  for (int step = 1; step <= steps; ++step) {
    auto [ids, target] = batchFor(step);
    Tensor myIds = ids.narrow(0, trainer * share, share).contiguous();
    Tensor myTarget = target.narrow(0, trainer * share, share).contiguous();
    double loss;
    {
      rpc::autograd::Context ctx;
      Tensor e = rpc::rpcSync<Tensor>("ps", "lookup", myIds);
      Tensor l = nn::functional::mseLoss((*ddp)(e), myTarget);
      ctx.backward({l});  // DDP all-reduces the dense gradients; the table's go to "ps"
      opt.step(ctx);
      loss = l.itemDouble();
    }
    pg->barrier()->wait();
    progress.add(share);
    if (trainer == 0 && (step == 1 || step % 10 == 0 || step == steps)) progress.log(step, loss);
  }
  if (trainer != 0) return 0;

  // One process on the whole batch.
  nn::Embedding refTable = makeTable();
  auto refDense = makeDense();
  optim::SGD ref({refTable.weight(), refDense->weight(), refDense->bias()}, {.lr = kLr});
  for (int step = 1; step <= steps; ++step) {
    auto [ids, target] = batchFor(step);
    ref.zeroGrad();
    nn::functional::mseLoss(refDense->forward(refTable.forward(ids)), target).backward();
    ref.step();
  }
  double worst =
      std::max({examples::relativeDifference(rpc::rpcSync<Tensor>("ps", "table_weight"), refTable.weight().detach()),
                examples::relativeDifference(dense->weight().detach(), refDense->weight().detach()),
                examples::relativeDifference(dense->bias().detach(), refDense->bias().detach())});
  std::printf("%d trainers, %d steps: max difference from one process: %.3g\n", trainers, steps, worst);
  return worst <= 1e-5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DDP combined with RPC: DDP-wrapped dense layers and an embedding table on a parameter server"};
  int trainers = 2, steps = 20;
  bool launched = false;
  app.add_option("--trainers", trainers, "trainer processes to fork (without --launched)")->check(CLI::Range(1, 16));
  app.add_option("--steps", steps, "training steps")->check(CLI::Range(1, 100000));
  app.add_flag("--launched", launched, "processes come from a launcher: rank 0 serves the table, the others train");
  CLI11_PARSE(app, argc, argv);
  registerServer();

  if (launched) {
    auto world = dist::initProcessGroup();
    trainers = world->size() - 1;
    if (trainers < 1 || kBatch % trainers != 0) {
      std::fprintf(stderr, "rpc_ddp --launched needs 1 + a divisor of %lld processes\n",
                   static_cast<long long>(kBatch));
      return 2;
    }
    std::vector<int> ranks;
    for (int r = 1; r <= trainers; ++r) ranks.push_back(r);
    auto group = world->newGroup(ranks);  // collective over the world: the server takes part
    int rank = world->rank();
    rpc::init(rank == 0 ? "ps" : fmt::format("trainer{}", rank - 1), rank, world->size());
    int code = rank == 0 ? 0 : train(rank - 1, trainers, steps, group);
    rpc::shutdown();
    return code;
  }
  if (kBatch % trainers != 0) {
    std::fprintf(stderr, "--trainers must divide the batch of %lld\n", static_cast<long long>(kBatch));
    return 2;
  }
  return examples::runForkedWorkers(trainers + 1, [&](int rank, rpc::RpcOptions o) {
    dist::StorePtr store = o.store;
    rpc::init(rank == 0 ? "ps" : fmt::format("trainer{}", rank - 1), rank, trainers + 1, std::move(o));
    int code = 0;
    if (rank != 0) {
      auto pg = dist::ProcessGroup::create(std::make_shared<dist::PrefixStore>("trainers", store), rank - 1, trainers);
      code = train(rank - 1, trainers, steps, pg);
    }
    rpc::shutdown();
    return code;
  });
}
