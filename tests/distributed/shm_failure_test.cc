// The shm backend with ranks as forked processes: a rank killed (SIGKILL) inside a 64 MiB
// allreduce makes the survivors fail with a PeerError naming it, well before the op's timeout,
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

TEST(ShmBackendFailure, RankKilledMidAllreduceIsNamedAndNoSegmentRemains) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  char tmpl[] = "/tmp/cohort_shm_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string group = fmt::format("killed{}", getpid());
  constexpr int kSize = 3, kDead = 2;
  constexpr auto kTimeout = Millis(10'000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    auto store = std::make_shared<FileStore>(dir + "/store", Millis(30'000));
    ProcessGroupOptions o;
    o.backend = "shm";
    o.timeout = kTimeout;
    o.name = group;
    auto pg = ProcessGroup::create(store, rank, kSize, o);
    Tensor warm = ones({10});
    pg->allreduce(warm)->wait();
    Tensor big = ones({1 << 24});  // 64 MiB
    return dieInsideOpOrReport(*store, rank, kDead, [&] { pg->allreduce(big)->wait(); },
                               [&] { pg->barrier()->wait(); });
  });
  for (int r = 0; r < kSize; ++r) {
    const ChildResult& f = results[r];
    EXPECT_FALSE(f.killedByWatchdog) << "rank " << r << " hung: " << f.report;
    if (r == kDead) {
      EXPECT_TRUE(WIFSIGNALED(f.status) && WTERMSIG(f.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    auto rep = parseSurvivorReport(f.report);
    ASSERT_TRUE(rep) << f.report;
    const std::string& msg = rep->first.message;
    std::cout << "rank " << r << " (" << rep->first.seconds << " s): " << rep->first.kind << ": " << msg << "\n";
    // A PeerError (not the timeout): the survivors noticed the death before the deadline.
    EXPECT_EQ(rep->first.kind, "PeerError") << msg;
    EXPECT_LT(rep->first.seconds, std::chrono::duration<double>(kTimeout).count()) << msg;
    EXPECT_EQ(rep->later, "DistError") << "a later op must fail at once";
    EXPECT_NE(msg.find("allreduce #2"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("in group '{}'", group)), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("rank [{}]", kDead)), std::string::npos) << msg;
  }
  EXPECT_TRUE(devShmEntries("_" + group + "_").empty()) << fmt::format("{}", fmt::join(devShmEntries("_" + group + "_"), " "));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace cohort::dist::testing
