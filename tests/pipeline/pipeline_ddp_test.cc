// Pipeline x data parallel: 2 stages x 2 replicas = 4 ranks laid out by a DeviceMesh, each stage
// a DistributedDataParallel (or a FullyShardedDataParallel) over the same stage of the other
// replica, equals one process on the whole batch (each replica trains on its half).
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/device_mesh.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include <cohort/fsdp/state_dict.h>
#include <cohort/pipeline/pipeline.h>

#include "distributed/fork_util.h"
#include "pipeline/pipeline_test_util.h"

namespace cohort::pipeline {
namespace {

using namespace testing;

enum class Sharding { DDP, FSDP };

// Trains `schedule` on a {data: replicas, pipe: stages} mesh, each stage a DDP (or an FSDP,
// FULL_SHARD, the stage one unit) over the same stage of the other replica; "" when this rank's
// losses (its replica's) average to one process's and its stages' weights equal one process's.
// With `accumulate` > 1 the optimizer steps after every `accumulate` pipeline steps, the ones
// before the last under the pipeline's noSync.
std::string trainOnMesh(const dist::ProcessGroupPtr& world, Sharding how, const std::string& schedule, int m,
                        int chunks, int split, int accumulate = 1) {
  const int replicas = 2, ranks = 2, S = ranks * (chunks ? chunks : 1);
  const std::string what = fmt::format("{}{} + {}", schedule, split ? fmt::format("+split{}", split) : "",
                                       how == Sharding::DDP ? "DDP" : "FSDP");
  dist::DeviceMesh mesh(world, {{"data", replicas}, {"pipe", ranks}});
  Reference ref = oneProcess(S, m, replicas, accumulate);
  auto all = makeStages(S);
  Schedule sched = makeSchedule(schedule, ranks, m, chunks);
  std::vector<std::shared_ptr<fsdp::FullyShardedDataParallel>> sharded;
  std::vector<nn::ModulePtr> mine;
  for (int s : sched.stagesOf(mesh.coordinate("pipe"))) {
    if (how == Sharding::DDP) {
      mine.push_back(std::make_shared<dist::DistributedDataParallel>(all[static_cast<size_t>(s)], mesh.group("data")));
    } else {
      sharded.push_back(
          std::make_shared<fsdp::FullyShardedDataParallel>(all[static_cast<size_t>(s)], mesh.group("data")));
      mine.push_back(sharded.back());
    }
  }
  Pipeline pipe(mine, processGroupTransport(mesh.group("pipe")), mse, sched, {.splitTail = split});
  optim::SGD opt(pipe.parameters(), {.lr = kLr});
  std::string err;
  const int replica = mesh.coordinate("data");
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, m, replicas);
    const int64_t half = x.size(0) / replicas;
    Tensor xs = x.slice(0, replica * half, (replica + 1) * half), ys = y.slice(0, replica * half, (replica + 1) * half);
    if (k % accumulate == 0) opt.zeroGrad();
    Tensor loss;
    if ((k + 1) % accumulate != 0) {
      auto noSync = pipe.noSync();
      const uint64_t before = mesh.group("data")->sequenceNumber();
      loss = pipe.step(xs, ys);
      if (mesh.group("data")->sequenceNumber() != before)
        err += fmt::format("{}: step {} under noSync ran a collective on the data group; ", what, k);
    } else {
      loss = pipe.step(xs, ys);
    }
    // The whole batch's loss: the replicas' losses averaged.
    mesh.group("data")->allreduce(loss)->wait();
    const double got = loss.itemDouble() / replicas, want = ref.losses[static_cast<size_t>(k)];
    if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want)))
      err += fmt::format("{}: step {} loss {} vs one process {}; ", what, k, got, want);
    if ((k + 1) % accumulate == 0) opt.step();
  }
  for (size_t i = 0; i < pipe.stageIndices().size(); ++i) {
    const int s = pipe.stageIndices()[i];
    std::vector<Tensor> p;  // the stage's full parameters (an FSDP stage's gathered)
    if (how == Sharding::DDP) {
      p = all[static_cast<size_t>(s)]->parameters();
    } else {
      for (const auto& [name, t] : fsdp::fullStateDict(*sharded[i])) p.push_back(t);
    }
    for (size_t j = 0; j < p.size(); ++j) {
      const double diff = (p[j] - ref.params[static_cast<size_t>(s)][j]).abs().max().itemDouble();
      if (diff > 2e-5) err += fmt::format("{}: stage {} parameter {} differs by {}; ", what, s, j, diff);
    }
  }
  return err;
}

// 4 forked ranks run every schedule with `how`.
void runOnFourRanks(Sharding how) {
  dist::testing::TempDir dir;
  auto results = dist::testing::runForked(4, std::chrono::seconds(240), dir.path().string(), [&](int rank) {
    auto store = std::make_shared<dist::FileStore>(dir.file("store"), std::chrono::milliseconds(30'000));
    auto world = dist::ProcessGroup::create(store, rank, 4, {.backend = "gloo"});
    std::string report;
    // The split ones end with a postponed weight backward: DDP's reducer is armed before it.
    for (auto [schedule, m, chunks, split] :
         std::vector<std::tuple<std::string, int, int, int>>{{"1f1b", 3, 0, 0},
                                                             {"1f1b", 6, 0, 0},
                                                             {"gpipe", 4, 0, 0},
                                                             {"zb", 5, 0, 0},
                                                             {"interleaved", 4, 2, 0},
                                                             {"1f1b", 5, 0, 2},
                                                             {"interleaved", 4, 2, 2},
                                                             {"v", 5, 2, 1}}) {
      try {
        report += trainOnMesh(world, how, schedule, m, chunks, split);
        // Gradients accumulated over 2 pipeline steps, all-reduced once.
        if (how == Sharding::DDP && schedule != "interleaved")
          report += trainOnMesh(world, how, schedule, m, chunks, split, 2);
      } catch (const std::exception& e) {
        report += fmt::format("{}: {}; ", schedule, e.what());
      }
    }
    return report.empty() ? std::string("ok") : report;
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(results[r].report, "ok") << "rank " << r << " (" << dist::testing::describeStatus(results[r].status)
                                       << ")";
}

TEST(PipelineTimesDDP, FourRanksEqualOneProcess) { runOnFourRanks(Sharding::DDP); }

// Every micro-batch's backward gathers the stage's units again and reduce-scatters into the
// sharded gradients, which accumulate over the step.
TEST(PipelineTimesFSDP, FourRanksEqualOneProcess) { runOnFourRanks(Sharding::FSDP); }

TEST(DeviceMesh, LayoutAndGroups) {
  dist::testing::TempDir dir;
  auto results = dist::testing::runForked(6, std::chrono::seconds(120), dir.path().string(), [&](int rank) {
    auto store = std::make_shared<dist::FileStore>(dir.file("store"), std::chrono::milliseconds(30'000));
    auto world = dist::ProcessGroup::create(store, rank, 6, {.backend = "gloo"});
    dist::DeviceMesh mesh(world, {{"data", 2}, {"pipe", 3}});
    std::string err;
    // Row-major, last dimension fastest.
    if (mesh.coordinate("data") != rank / 3 || mesh.coordinate("pipe") != rank % 3)
      err += fmt::format("coordinates {} for rank {}; ", mesh.describe(), rank);
    if (mesh.rankAt(mesh.coordinatesOf(rank)) != rank) err += "rankAt does not invert coordinatesOf; ";
    // The pipe group is this replica's ranks in stage order, the data group this stage's ranks.
    if (mesh.group("pipe")->size() != 3 || mesh.group("pipe")->rank() != rank % 3) err += "pipe group; ";
    if (mesh.group("data")->size() != 2 || mesh.group("data")->rank() != rank / 3) err += "data group; ";
    Tensor t = scalarTensor(static_cast<double>(rank), {.dtype = DType::Float64});
    mesh.group("data")->allreduce(t)->wait();
    if (t.itemDouble() != 2 * (rank % 3) + 3) err += fmt::format("data all-reduce {}; ", t.itemDouble());
    try {
      mesh.group("tensor");
      err += "no error for an unknown dimension; ";
    } catch (const ValueError& e) {
      if (std::string(e.what()) != "DeviceMesh: no dimension 'tensor' (dimensions: data, pipe)") err += e.what();
    }
    try {
      dist::DeviceMesh bad(world, {{"data", 4}, {"pipe", 2}});
      err += "no error for a mesh of the wrong size; ";
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("data=4 x pipe=2 makes 8 ranks, the group 'world' has 6") == std::string::npos)
        err += e.what();
    }
    return err.empty() ? std::string("ok") : err;
  });
  for (int r = 0; r < 6; ++r) EXPECT_EQ(results[r].report, "ok") << "rank " << r;
}

}  // namespace
}  // namespace cohort::pipeline
