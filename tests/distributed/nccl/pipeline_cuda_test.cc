// Pipelines whose stages run on GPUs: activations and gradients arrive on each rank's device, and
// training equals one process on the CPU. Ranks are threads (a CUDA context does not survive a
// fork). On one GPU two ranks share it and the tensors travel through the host (a gloo group);
// with two GPUs or more, each rank on its own, they go device to device over NCCL. Skips without
// a GPU.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/pipeline/pipeline.h>

#include "core/cuda/cuda_test_util.h"
#include "harness/world.h"
#include "pipeline/pipeline_test_util.h"

namespace cohort::pipeline {
namespace {

using namespace testing;

// Trains stages 0..p-1 of makeStages(p) with 1F1B on `p` thread ranks, rank r on devices[r],
// over a group with `backend`; checks every step's loss and the final weights against one process
// on the CPU. Returns the transport's name on rank 0.
std::string trainOnDevices(const std::string& backend, const std::vector<Device>& devices, int m, int lookahead) {
  const int p = static_cast<int>(devices.size());
  const Reference ref = oneProcess(p, m);
  auto store = std::make_shared<dist::HashStore>();
  std::string name;
  std::vector<int> ranks;
  for (int r = 0; r < p; ++r) ranks.push_back(r);
  ::cohort::testing::runOnThreads(ranks, [&](int r) {
    const Device device = devices[static_cast<size_t>(r)];
    cuda::setDevice(device.index());
    dist::ProcessGroupOptions o;
    o.backend = backend;
    o.name = fmt::format("pipe-{}-{}", backend, p);
    o.timeout = Millis(60'000);
    auto pg = dist::ProcessGroup::create(store, r, p, o);
    TransportPtr transport = processGroupTransport(pg, device);
    if (r == 0) name = transport->name();
    auto all = makeStages(p);
    all[static_cast<size_t>(r)]->to(device);
    Pipeline pipe({all[static_cast<size_t>(r)]}, transport, mse, oneFOneB(p, m, lookahead));
    optim::SGD opt(pipe.parameters(), {.lr = kLr});
    for (int k = 0; k < kSteps; ++k) {
      auto [x, y] = batch(k, m);  // on the CPU: the pipeline moves them to the stage's device
      opt.zeroGrad();
      Tensor loss = pipe.step(pipe.holdsFirstStage() ? x : Tensor(), pipe.holdsLastStage() ? y : Tensor());
      if (!loss.device().isCpu()) throw Error("the loss step() returns is not on the CPU");
      const double got = loss.itemDouble(), want = ref.losses[static_cast<size_t>(k)];
      if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want)))
        throw Error(fmt::format("step {}: loss {} vs one process on the CPU {}", k, got, want));
      opt.step();
    }
    const auto mine = all[static_cast<size_t>(r)]->parameters();
    for (size_t j = 0; j < mine.size(); ++j) {
      if (mine[j].device() != device) throw Error(fmt::format("parameter {} left {}", j, device.str()));
      const double diff = (mine[j].to(Device::cpu()) - ref.params[static_cast<size_t>(r)][j]).abs().max().itemDouble();
      if (diff > 2e-5) throw Error(fmt::format("stage {} parameter {} differs from the CPU's by {}", r, j, diff));
    }
    transport.reset();
    cuda::synchronize(device.index());
  });
  return name;
}

TEST(PipelineCuda, TwoRanksOnOneGpuThroughTheHost) {
  COHORT_REQUIRE_GPU();
  for (int lookahead : {0, 1})
    EXPECT_EQ(trainOnDevices("gloo", {Device::cuda(0), Device::cuda(0)}, 5, lookahead), "process group (gloo)");
}

// Stage 0 on the CPU, stage 1 on the GPU: over a CPU backend both directions go through the host.
TEST(PipelineCuda, ACpuStageFeedsAGpuStage) {
  COHORT_REQUIRE_GPU();
  EXPECT_EQ(trainOnDevices("gloo", {Device::cpu(), Device::cuda(0)}, 4, 0), "process group (gloo)");
}

TEST(PipelineCuda, NcclCarriesActivationsDeviceToDevice) {
  COHORT_REQUIRE_GPU();
  const int n = cuda::deviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one), this machine has " << n;
  std::vector<Device> devices;
  for (int r = 0; r < std::min(n, 4); ++r) devices.push_back(Device::cuda(r));
  // Headers on the CPU backend and data over NCCL; then a group with only NCCL (headers on the GPU).
  EXPECT_NE(trainOnDevices("auto", devices, 2 * static_cast<int>(devices.size()) + 1, 1).find("nccl"),
            std::string::npos);
  EXPECT_EQ(trainOnDevices("nccl", devices, 3, 0), "process group (nccl)");
}

}  // namespace
}  // namespace cohort::pipeline
