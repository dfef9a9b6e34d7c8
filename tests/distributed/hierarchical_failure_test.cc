// The hierarchical backend with ranks as forked processes on two simulated nodes (2 x 2): a rank
// killed (SIGKILL) inside an allreduce — a non-leader, caught by its leader in the shm stage, or
// a leader, caught by the other leader in the network stage and by its own node in the shm stage —
// makes every survivor fail with a PeerError naming the op and the group before the op's timeout;
// later ops fail at once, and nothing of the group is left in /dev/shm. A watchdog in the parent
// kills every child past a deadline, so a hang fails the test instead of blocking it.
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
#include <regex>
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

class HierarchicalKilled : public ::testing::TestWithParam<int> {};

TEST_P(HierarchicalKilled, SurvivorsFailWithTheOpNamedAndNoSegmentRemains) {
  if (!hasBackend("hierarchical")) GTEST_SKIP() << "the hierarchical backend is not built";
  const int kDead = GetParam();
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = fmt::format("hkilled{}r{}", getpid(), kDead);
  constexpr int kSize = 4;
  constexpr auto kTimeout = Millis(10'000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    auto store = std::make_shared<FileStore>(dir + "/store", Millis(30'000));
    ProcessGroupOptions o;
    o.backend = "hierarchical";
    o.timeout = kTimeout;
    o.name = group;
    o.nodeId = rank < 2 ? "simA" : "simB";
    auto pg = ProcessGroup::create(store, rank, kSize, o);
    Tensor warm = ones({10});
    pg->allreduce(warm)->wait();
    Tensor big = ones({1 << 22});  // 16 MiB
    return dieInsideOpOrReport(
        *store, rank, kDead, [&] { pg->allreduce(big)->wait(); }, [&] { pg->allreduce(warm)->wait(); });
  });
  auto reports = expectSurvivorsFailFast(results, kDead, kTimeout);
  for (int r = 0; r < kSize; ++r) {
    if (!reports[r]) continue;
    const std::string& msg = reports[r]->first.message;
    EXPECT_NE(msg.find(fmt::format("allreduce #2 in group '{}'", group)), std::string::npos) << msg;
    // The group's diagnosis names the dead rank.
    EXPECT_TRUE(
        std::regex_search(msg,
                          std::regex(fmt::format(R"((dead or stalled\)|never reached it): \[(\d+, )*{}[,\]])", kDead))))
        << msg;
  }
  // The dead rank's node-mate catches it in the shm stage of its own node.
  const int mate = kDead ^ 1;
  EXPECT_NE(results[mate].report.find(fmt::format("over node {} of group '{}'", kDead / 2, group)), std::string::npos)
      << results[mate].report;
  EXPECT_TRUE(devShmEntries(group).empty()) << fmt::format("{}", fmt::join(devShmEntries(group), " "));
}

// Rank 3: a non-leader. Rank 2: the leader of node 1.
INSTANTIATE_TEST_SUITE_P(Rank, HierarchicalKilled, ::testing::Values(3, 2));

}  // namespace
}  // namespace cohort::dist::testing
