// The shm backend with ranks as forked processes: a rank killed (SIGKILL) inside a 64 MiB
// allreduce (or one on registered buffers) makes the survivors fail with a PeerError naming it, well before the op's
// timeout, later ops fail at once, and nothing of the group is left in /dev/shm. A watchdog in the parent kills every
// child past a deadline, so a hang fails the test instead of blocking it.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

#include "fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

// Forks kSize ranks into shm group `group`. `prepare(pg, rank)` sets up (and may check, returning
// a report on failure) and leaves in `op` the allreduce that rank kDead dies inside; the survivors
// must fail with a PeerError naming that allreduce (#2), the group and the dead rank, well before
// the timeout, and nothing of the group may stay in /dev/shm.
void expectKilledRankNamed(
    const std::string& group,
    const std::function<std::string(ProcessGroup& pg, int rank, std::function<void()>& op)>& prepare) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  constexpr int kSize = 3, kDead = 2;
  constexpr auto kTimeout = Millis(10'000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    auto store = std::make_shared<FileStore>(dir + "/store", Millis(30'000));
    ProcessGroupOptions o;
    o.backend = "shm";
    o.timeout = kTimeout;
    o.name = group;
    auto pg = ProcessGroup::create(store, rank, kSize, o);
    std::function<void()> op;
    if (std::string report = prepare(*pg, rank, op); !report.empty()) return report;
    return dieInsideOpOrReport(*store, rank, kDead, op, [&] { pg->barrier()->wait(); });
  });
  auto reports = expectSurvivorsFailFast(results, kDead, kTimeout);
  for (int r = 0; r < kSize; ++r) {
    if (!reports[r]) continue;
    const std::string& msg = reports[r]->first.message;
    EXPECT_NE(msg.find("allreduce #2"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("in group '{}'", group)), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("rank [{}]", kDead)), std::string::npos) << msg;
  }
  EXPECT_TRUE(devShmEntries("_" + group + "_").empty())
      << fmt::format("{}", fmt::join(devShmEntries("_" + group + "_"), " "));
}

TEST(ShmBackendFailure, RankKilledMidAllreduceIsNamedAndNoSegmentRemains) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  expectKilledRankNamed(fmt::format("killed{}", getpid()), [](ProcessGroup& pg, int, std::function<void()>& op) {
    Tensor warm = ones({10});
    pg.allreduce(warm)->wait();
    op = [&pg, big = ones({1 << 24})]() mutable { pg.allreduce(big)->wait(); };  // 64 MiB
    return std::string();
  });
}

// The same with DDP's kind of tensor: buffers every rank maps (allocateCommBuffer), reduced in
// place. Processes first check one such allreduce's values, then rank 2 dies inside the next.
TEST(ShmBackendFailure, RankKilledInARegisteredAllreduceIsNamedAndNothingRemains) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  expectKilledRankNamed(fmt::format("regkilled{}", getpid()),
                        [](ProcessGroup& pg, int rank, std::function<void()>& op) {
                          constexpr int64_t kCount = 1 << 22;  // 16 MiB of float32
                          Tensor buf = pg.allocateCommBuffer({kCount}, DType::Float32);
                          buf.copy_(arange(0, kCount, 1, {.dtype = DType::Float32}) * static_cast<double>(rank + 1));
                          pg.allreduce(buf)->wait();
                          // Sum over ranks of i * (rank + 1) = 6i: exact in float32 below 2^24.
                          Tensor want = arange(0, kCount, 1, {.dtype = DType::Float32}) * 6.0;
                          if ((buf - want).abs().max().item<double>() != 0.0)
                            return fmt::format("rank {}: wrong registered allreduce result", rank);
                          op = [&pg, buf]() mutable { pg.allreduce(buf)->wait(); };
                          return std::string();
                        });
}

}  // namespace
}  // namespace cohort::dist::testing
