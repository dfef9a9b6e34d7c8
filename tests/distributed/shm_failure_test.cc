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
    if (rank == kDead) {
      // Dies inside its allreduce: the op cannot finish before the others join, and they join
      // only once this process is dead (so the test does not depend on scheduling).
      store->set("dead_pid", std::to_string(getpid()));
      std::thread([] {
        std::this_thread::sleep_for(100ms);
        raise(SIGKILL);
      }).detach();
      pg->allreduce(big)->wait();
      return "the dead rank's allreduce completed";
    }
    const int deadPid = std::stoi(store->getString("dead_pid"));
    while (processAlive(deadPid)) std::this_thread::sleep_for(5ms);
    Outcome first = classifyOutcome([&] { pg->allreduce(big)->wait(); });
    // A later op fails at once.
    std::string later = "none";
    try {
      pg->barrier()->wait();
    } catch (const DistError& e) {
      later = "DistError";
    }
    return fmt::format("{}|{}|{}|{}", first.kind, first.seconds, later, first.message);
  });
  for (int r = 0; r < kSize; ++r) {
    const ChildResult& f = results[r];
    EXPECT_FALSE(f.killedByWatchdog) << "rank " << r << " hung: " << f.report;
    if (r == kDead) {
      EXPECT_TRUE(WIFSIGNALED(f.status) && WTERMSIG(f.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    std::vector<std::string> parts;
    std::stringstream ss(f.report);
    for (std::string p; std::getline(ss, p, '|') && parts.size() < 3;) parts.push_back(p);
    ASSERT_EQ(parts.size(), 3u) << f.report;
    std::string msg = f.report.substr(parts[0].size() + parts[1].size() + parts[2].size() + 3);
    std::cout << "rank " << r << " (" << parts[1] << " s): " << parts[0] << ": " << msg << "\n";
    // A PeerError (not the timeout): the survivors noticed the death before the deadline.
    EXPECT_EQ(parts[0], "PeerError") << msg;
    EXPECT_LT(std::stod(parts[1]), std::chrono::duration<double>(kTimeout).count()) << msg;
    EXPECT_EQ(parts[2], "DistError") << "a later op must fail at once";
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
