// A user's training program built against the installed cohort (tests/install/run_install_test.sh
// runs it as a 2-rank job under the installed bin/cohortrun). Every rank:
//  1. checks a few core results (autograd, a BLAS matmul, a chained Future, a typed error);
//  2. trains an MLP on the shipped digits data with DistributedDataParallel: the loss must fall,
//     the test accuracy be well above chance, and every rank end with the same parameters (an
//     allgather of each rank's checksum, and an RPC asking the other rank for its checksum);
//  3. trains the same kind of model with FullyShardedDataParallel: each rank holds a shard only,
//     and the loss must fall.
// The data comes from the installed tree (COHORT_DATA_DIR is not set; rank 0 prints the folder).
// The exit status is the verdict; every rank also prints its parameter checksum for the script.
#include <cohort/cohort.h>
#include <cohort/config.h>
#include <cohort/core/data/data_dir.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/digits.h>
#include <cohort/core/data/sampler.h>
#include <cohort/distributed.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include <cohort/pipeline/pipeline.h>
#include <cohort/pipeline/split.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/distributed_optimizer.h>
#include <cohort/rpc/rpc.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace cohort;

int failures = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "FAIL %s\n", what.c_str());
  ++failures;
}

void expectNear(const char* what, double got, double want) {
  if (std::fabs(got - want) > 1e-9 * (1 + std::fabs(want)))
    fail(std::string(what) + ": got " + std::to_string(got) + ", want " + std::to_string(want));
}

void coreChecks() {
  // y = sum(w * x + x * x) for w = [1, 2, 3], x = [4, 5, 6]: y = 109, dy/dw = x, dy/dx = w + 2x.
  Tensor w = fromVector<double>({1, 2, 3}).setRequiresGrad();
  Tensor x = fromVector<double>({4, 5, 6}).setRequiresGrad();
  Tensor y = (w * x + x * x).sum();
  expectNear("y", y.item<double>(), 109);
  y.backward();
  auto gw = w.grad().toVector<double>();
  auto gx = x.grad().toVector<double>();
  for (int i = 0; i < 3; ++i) {
    expectNear("dy/dw", gw[i], 4 + i);
    expectNear("dy/dx", gx[i], (1 + i) + 2 * (4 + i));
  }
  // [[1,2],[3,4]] @ [[5],[6]] = [[17],[39]], through BLAS.
  auto m = matmul(fromVector<float>({1, 2, 3, 4}, {2, 2}), fromVector<float>({5, 6}, {2, 1})).toVector<float>();
  expectNear("matmul[0]", m.at(0), 17);
  expectNear("matmul[1]", m.at(1), 39);

  Future<int> f;
  Future<std::string> g = f.then([](Future<int> done) { return std::to_string(done.value() * 2); });
  f.setValue(21);
  if (g.value() != "42") fail("future: got " + g.value());

  try {
    (void)(fromVector<float>({1, 2, 3}) + fromVector<float>({1, 2}));
    fail("adding shapes [3] and [2] did not throw");
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("[3]") == std::string::npos)
      fail(std::string("the error does not name the shape: ") + e.what());
  }
}

std::shared_ptr<nn::Module> mlp() {
  return std::make_shared<nn::Sequential>(nn::Linear(64, 64), nn::ReLU(), nn::Linear(64, 10));
}

// FNV-1a over every parameter's bytes: equal on every rank when their parameters are.
int64_t parameterChecksum(nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : model.parameters()) {
    Tensor c = p.contiguous();
    const auto* b = static_cast<const unsigned char*>(c.dataPtr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return std::bit_cast<int64_t>(h);
}

// Trains `trained` for `epochs` on this rank's shard of the digits training set; returns the mean
// loss of the first and of the last epoch over every rank.
std::pair<double, double> train(nn::Module& trained, dist::ProcessGroup& pg, int epochs) {
  auto data = data::digits("train");
  // Options as the documentation writes them, designated initialisers naming some fields only:
  // the installed headers must compile without warnings under a user's -Wextra -Werror.
  optim::AdamW opt(trained.parameters(), {.lr = 3e-3});
  data::DataLoader loader(data, {.batchSize = 32,
                                 .shuffle = true,
                                 .seed = 1,
                                 .sampler =
                                     data::DistributedSampler({.rank = pg.rank(), .worldSize = pg.size(), .seed = 1})});
  double first = 0, last = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.setEpoch(epoch);
    double sum = 0;
    int64_t steps = 0;
    for (auto& batch : loader) {
      Tensor loss = nn::functional::crossEntropy(trained(batch.data), batch.target);
      opt.zeroGrad();
      loss.backward();
      opt.step();
      sum += loss.item<double>();
      ++steps;
    }
    Tensor mean = fromVector<double>({sum / static_cast<double>(steps) / pg.size()});
    pg.allreduce(mean)->wait();
    (epoch == 0 ? first : last) = mean.item<double>();
  }
  return {first, last};
}

double accuracy(nn::Module& model) {
  autograd::NoGradGuard ng;
  auto test = data::digits("test");
  Tensor pred = model(test->data()).argmax(1);
  return pred.eq(test->targets()).sum().item<double>() / static_cast<double>(test->size());
}

}  // namespace

int main() {
  try {
    coreChecks();
    manualSeed(0);
    dist::ProcessGroupPtr pg = dist::initProcessGroup({.groupName = "world"});
    const int rank = pg->rank(), world = pg->size();
    if (world != 2) fail("expected 2 ranks, got " + std::to_string(world));
    if (rank == 0) std::printf("data folder: %s\n", data::dataDir().c_str());

    // Data parallel: the loss falls and every rank ends with the same parameters.
    auto net = mlp();
    auto ddp = std::make_shared<dist::DistributedDataParallel>(net, pg);
    auto [first, last] = train(*ddp, *pg, 4);
    if (!(last < 0.5 * first))
      fail("DDP: the loss did not halve: " + std::to_string(first) + " -> " + std::to_string(last));
    double acc = accuracy(*net);
    if (acc < 0.85) fail("DDP: test accuracy " + std::to_string(acc));
    const int64_t sum = parameterChecksum(*net);
    std::vector<Tensor> sums{zeros({1}, {.dtype = DType::Int64}), zeros({1}, {.dtype = DType::Int64})};
    pg->allgather(sums, fromVector<int64_t>({sum}))->wait();
    for (int r = 0; r < world; ++r)
      if (sums[static_cast<size_t>(r)].toVector<int64_t>().at(0) != sum)  // exact (item<T>() goes through double)
        fail("DDP: rank " + std::to_string(r) + "'s parameters differ");
    std::printf("rank %d parameter checksum %016llx\n", rank,
                static_cast<unsigned long long>(std::bit_cast<uint64_t>(sum)));

    // RPC: each rank asks the other for its checksum.
    rpc::registerFunction("checksum", [sum]() { return sum; });
    rpc::registerFunction("square", [](Tensor t) { return t.mul(t); });
#if COHORT_USE_TENSORPIPE
    rpc::init("rank" + std::to_string(rank), rank, world);
    const std::string peer = "rank" + std::to_string((rank + 1) % world);
    if (rpc::rpcSync<int64_t>(peer, "checksum") != sum) fail("RPC: " + peer + "'s checksum differs");
    {
      // Distributed autograd: a gradient computed on the peer, stepped by a distributed optimizer.
      Tensor w = full({3}, 1.5);
      w.setRequiresGrad(true);
      rpc::DistributedOptimizer opt("SGD", {rpc::makeRRef(w)}, {{"lr", 0.5}});
      rpc::autograd::Context ctx;
      ctx.backward({rpc::rpcSync<Tensor>(peer, "square", w).sum()});
      Tensor g = ctx.gradients().get(w);
      if (!g.defined() || g.sub(full({3}, 3.0)).abs().max().itemDouble() != 0.0)
        fail("distributed autograd: the gradient of sum(w * w) is not 2w");
      opt.step(ctx);
      if (w.sub(full({3}, 0.0)).abs().max().itemDouble() != 0.0) fail("DistributedOptimizer: w - 0.5 * 2w is not 0");
    }
    rpc::shutdown();
#else
    // No agent in this build: the function still runs through the registry's wire format.
    if (rpc::FunctionRegistry::global().find("checksum") == nullptr) fail("RPC: 'checksum' is not registered");
#endif

    // Fully sharded: each rank holds about half of the parameters, and the loss falls.
    auto sharded = mlp();
    int64_t full = 0, local = 0;
    for (auto& p : sharded->parameters()) full += p.numel();
    auto fsdp = std::make_shared<fsdp::FullyShardedDataParallel>(sharded, pg,
                                                                 fsdp::FSDPOptions{
                                                                     .strategy = fsdp::ShardingStrategy::FullShard});
    for (auto& p : fsdp->parameters()) local += p.numel();
    if (local * world < full || local >= full)
      fail("FSDP: rank holds " + std::to_string(local) + " of " + std::to_string(full) + " parameter elements");
    auto [fsdpFirst, fsdpLast] = train(*fsdp, *pg, 3);
    if (!(fsdpLast < fsdpFirst))
      fail("FSDP: the loss did not fall: " + std::to_string(fsdpFirst) + " -> " + std::to_string(fsdpLast));

    // Pipeline: the MLP cut in two stages, one per rank, 1F1B over 4 micro-batches; the loss halves.
    {
      auto seq = std::dynamic_pointer_cast<nn::Sequential>(mlp());
      pipeline::StageSplit split = pipeline::splitSequential(seq, world);
      pipeline::Pipeline pipe({split.stages[static_cast<size_t>(rank)]}, pipeline::processGroupTransport(pg),
                              [](const Tensor& out, const Tensor& y) { return nn::functional::crossEntropy(out, y); },
                              {.schedule = "1f1b", .microbatches = 4});
      optim::AdamW opt(pipe.parameters(), {.lr = 3e-3});
      data::DataLoader loader(data::digits("train"), {.batchSize = 64, .shuffle = true, .seed = 1});
      double firstLoss = -1, lastLoss = 0;
      for (int epoch = 0; epoch < 3; ++epoch) {
        loader.setEpoch(epoch);
        for (auto& batch : loader) {
          opt.zeroGrad();
          lastLoss = pipe.step(batch.data, batch.target).item<double>();
          if (firstLoss < 0) firstLoss = lastLoss;
          opt.step();
        }
      }
      if (!(lastLoss < 0.5 * firstLoss))
        fail("pipeline: the loss did not halve: " + std::to_string(firstLoss) + " -> " + std::to_string(lastLoss));
    }

    if (rank == 0)
      std::printf("cohort %s: DDP loss %.3f -> %.3f, test accuracy %.1f%%; FSDP loss %.3f -> %.3f: %s\n",
                  COHORT_VERSION, first, last, 100 * acc, fsdpFirst, fsdpLast, failures == 0 ? "ok" : "FAILED");
    fsdp.reset();
    dist::destroyProcessGroup();
  } catch (const std::exception& e) {
    fail(std::string("error: ") + e.what());
  }
  return failures == 0 ? 0 : 1;
}
