// A parameter server over RPC: trainers push gradients to a server that batches them with an
// asynchronous user function — it answers nobody until every trainer's gradient of the step has
// arrived, then averages them, takes an SGD step and sends all trainers the new weights at once.
// The model is a linear regression on synthetic data (each trainer has its own shard), so the
// printed loss must fall towards 0 and the weights approach the true ones.
//
//   build-*/examples/rpc_parameter_server --trainers 3            # forks the server and trainers
//   cohortrun --standalone --nproc-per-node 4 build-*/examples/rpc_parameter_server --launched
//
// With --launched the processes come from a launcher (RANK, WORLD_SIZE, MASTER_ADDR/PORT): rank 0
// is the server, the others trainers, meeting through the job's store.
#include <cstdio>
#include <mutex>

#include <CLI/CLI.hpp>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/init.h>
#include <cohort/rpc/rpc.h>

#include "common/forked_workers.h"

using namespace cohort;

namespace {

constexpr int64_t kDim = 16;

// The server's state: the weights and the gradients of the step in progress.
struct ParameterServer {
  std::mutex mu;
  int trainers = 0;
  double lr = 0.1;
  Tensor weights = zeros({kDim});
  Tensor gradSum = zeros({kDim});
  int arrived = 0;
  std::vector<Future<Tensor>> waiting;

  Future<Tensor> pushAndPull(const Tensor& grad) {
    Future<Tensor> mine;
    std::vector<Future<Tensor>> release;
    Tensor updated;
    {
      std::lock_guard<std::mutex> lock(mu);
      gradSum.add_(grad);
      waiting.push_back(mine);
      if (++arrived == trainers) {
        weights.sub_(gradSum, lr / trainers);  // w -= lr * mean(grad)
        gradSum.zero_();
        arrived = 0;
        release.swap(waiting);
        updated = weights.clone();
      }
    }
    for (auto& f : release) f.setValue(updated);  // outside the lock: this sends the responses
    return mine;
  }
};
ParameterServer gServer;

// y = X w* + noise, this trainer's shard.
std::pair<Tensor, Tensor> shard(int trainer, const Tensor& trueW) {
  Generator gen(1000 + trainer);
  Tensor x = randn({256, kDim}, {}, &gen);
  Tensor y = matmul(x, trueW).add(randn({256}, {}, &gen).mul_(0.01));
  return {x, y};
}

int runTrainer(int trainer, int steps) {
  Generator gen(7);
  Tensor trueW = randn({kDim}, {}, &gen);
  auto [x, y] = shard(trainer, trueW);
  Tensor w = rpc::rpcSync<Tensor>("ps", "get_weights");
  double loss = 0;
  for (int step = 0; step < steps; ++step) {
    Tensor err = matmul(x, w).sub(y);
    loss = err.mul(err).mean().itemDouble();
    Tensor grad = matmul(x.t(), err).mul_(2.0 / static_cast<double>(x.size(0)));
    w = rpc::rpcSync<Tensor>("ps", "push_and_pull", grad);  // answered once every trainer pushed
    if (trainer == 0 && (step % 10 == 0 || step == steps - 1)) std::printf("step %3d  loss %.6f\n", step, loss);
  }
  double dist = w.sub(trueW).abs().max().itemDouble();
  std::printf("trainer %d: final loss %.6f, max |w - w*| %.4f\n", trainer, loss, dist);
  return loss < 1e-2 ? 0 : 1;
}

void registerServer(int trainers) {
  gServer.trainers = trainers;
  rpc::registerFunction("get_weights", [] {
    std::lock_guard<std::mutex> lock(gServer.mu);
    return gServer.weights.clone();
  });
  rpc::registerFunction("push_and_pull", [](Tensor grad) { return gServer.pushAndPull(grad); });
}

int runRole(int rank, int world, int steps, rpc::RpcOptions options) {
  std::string name = rank == 0 ? "ps" : fmt::format("trainer{}", rank - 1);
  rpc::init(name, rank, world, options);
  int code = rank == 0 ? 0 : runTrainer(rank - 1, steps);
  rpc::shutdown();  // the server leaves once every trainer is done
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"parameter server over RPC with an asynchronous, batching server function"};
  int trainers = 3, steps = 50;
  bool launched = false;
  app.add_option("--trainers", trainers, "trainer processes to fork (without --launched)")->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "SGD steps");
  app.add_flag("--launched", launched, "processes come from a launcher: rank 0 serves, the others train");
  CLI11_PARSE(app, argc, argv);

  if (launched) {
    auto pg = dist::initProcessGroup();
    registerServer(pg->size() - 1);
    rpc::RpcOptions o;  // the process group's store
    return runRole(pg->rank(), pg->size(), steps, o);
  }
  registerServer(trainers);
  return examples::runForkedWorkers(trainers + 1, [&](int rank, rpc::RpcOptions o) {
    return runRole(rank, trainers + 1, steps, std::move(o));
  });
}
