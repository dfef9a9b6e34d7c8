// Failure tests with real processes: ranks are forked children meeting through a FileStore; one
// is killed (SIGKILL) and the survivors must fail with a DistError naming it, within the timeout,
// and the test must finish (a watchdog in the parent kills everything past a deadline).
#include <gtest/gtest.h>

#include <fcntl.h>
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

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

#include "fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<ProcessGroup> joinGroup(const TempDir& dir, int rank, int size, Millis opTimeout) {
  auto store = std::make_shared<FileStore>(dir.file("store"), Millis(30'000));
  ProcessGroupOptions o;
  o.backend = "gloo";
  o.timeout = opTimeout;
  return ProcessGroup::create(store, rank, size, o);
}

// Survivors report the outcome of one more allreduce.
int survivorBody(ProcessGroup& pg, std::ostream& report, Tensor t) {
  return reportOutcome(report, [&] { pg.allreduce(t)->wait(); });
}

void checkSurvivors(const std::vector<ChildResult>& results, int dead, double maxSeconds) {
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& res = results[r];
    EXPECT_FALSE(res.killedByWatchdog) << "rank " << r << " hung; report: " << res.report;
    if (static_cast<int>(r) == dead) {
      EXPECT_TRUE(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    ASSERT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0)
        << "rank " << r << " status " << res.status << " report: " << res.report;
    auto [kind, secs, msg] = parseOutcome(res.report);
    std::cout << "rank " << r << " (" << secs << " s): " << kind << ": " << msg << "\n";
    EXPECT_NE(kind, "none") << "rank " << r << " got no error";
    EXPECT_LT(secs, maxSeconds) << "rank " << r << ": " << msg;
    EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
    EXPECT_NE(msg.find("in group 'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("[{}]", dead)), std::string::npos)
        << "rank " << r << " did not name rank " << dead << ": " << msg;
  }
}

TEST(ProcessGroupFailure, KilledRankBeforeTheOpIsNamedBySurvivors) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir dir;
  constexpr int kSize = 3, kDead = 1;
  auto results = runForked(
      kSize, 60s,
      [&](int rank, std::ostream& report) {
        auto pg = joinGroup(dir, rank, kSize, Millis(2000));
        Tensor t = ones({1000});
        for (int k = 0; k < 3; ++k) pg->allreduce(t)->wait();
        pg->barrier()->wait();
        if (rank == kDead) raise(SIGKILL);
        return survivorBody(*pg, report, t);
      },
      dir);
  checkSurvivors(results, kDead, 5.0);
}

TEST(ProcessGroupFailure, KilledRankMidCollectiveIsNamedBySurvivors) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir dir;
  constexpr int kSize = 3, kDead = 2;
  auto results = runForked(
      kSize, 60s,
      [&](int rank, std::ostream& report) {
        auto pg = joinGroup(dir, rank, kSize, Millis(2000));
        Tensor warm = ones({10});
        pg->allreduce(warm)->wait();
        // 64 MiB takes ~80 ms on loopback, and rank 2 must still forward the others' reduced chunks
        // long after it dies 2 ms in: the op cannot have finished anywhere.
        Tensor big = ones({1 << 24});
        if (rank == kDead) {
          auto w = pg->allreduce(big);
          std::this_thread::sleep_for(2ms);
          raise(SIGKILL);
        }
        return survivorBody(*pg, report, big);
      },
      dir);
  checkSurvivors(results, kDead, 5.0);
}

TEST(ProcessGroupFailure, StalledRankTimesOutWithItsName) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir dir;
  constexpr int kSize = 3, kStalled = 0;
  auto results = runForked(
      kSize, 60s,
      [&](int rank, std::ostream& report) {
        auto pg = joinGroup(dir, rank, kSize, Millis(1500));
        Tensor t = ones({100});
        pg->allreduce(t)->wait();
        if (rank == kStalled) {
          std::this_thread::sleep_for(3s);  // alive but never calls the next op
          raise(SIGKILL);
        }
        return survivorBody(*pg, report, t);
      },
      dir);
  checkSurvivors(results, kStalled, 5.0);
  for (int r = 1; r < kSize; ++r) EXPECT_EQ(results[r].report.substr(0, 12), "TimeoutError") << results[r].report;
}

// COHORT_DEBUG=DETAIL across processes: rank 2 calls broadcast where ranks 0 and 1 call
// allreduce. Every rank (the odd one out too) fails at once with one DistError that lists each
// rank's call, instead of a hang or a silently wrong result.
TEST(ProcessGroupFailure, MismatchedCollectiveUnderDetailFailsOnEveryRank) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir dir;
  constexpr int kSize = 3, kOdd = 2;
  auto results = runForked(
      kSize, 60s,
      [&](int rank, std::ostream& report) {
        auto store = std::make_shared<FileStore>(dir.file("store"), Millis(30'000));
        ProcessGroupOptions o;
        o.backend = "gloo";
        o.timeout = Millis(20'000);
        o.debug = DebugLevel::Detail;
        auto pg = ProcessGroup::create(store, rank, kSize, o);
        Tensor t = ones({10});
        pg->allreduce(t)->wait();  // a matching call passes the check
        return reportOutcome(report, [&] {
          if (rank == kOdd) {
            pg->broadcast(t)->wait();
          } else {
            pg->allreduce(t)->wait();
          }
        });
      },
      dir);
  for (int r = 0; r < kSize; ++r) {
    const auto& res = results[r];
    EXPECT_FALSE(res.killedByWatchdog) << "rank " << r << " hung";
    ASSERT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0) << "rank " << r << ": " << res.report;
    auto [kind, secs, msg] = parseOutcome(res.report);
    EXPECT_EQ(kind, "DistError") << "rank " << r << ": " << res.report;
    EXPECT_LT(secs, 10.0) << "rank " << r << " waited for the timeout";
    EXPECT_NE(msg.find("collective mismatch in group 'world' at sequence number 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0: allreduce(dtype=float32, shapes=[[10]], op=sum)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1: allreduce(dtype=float32, shapes=[[10]], op=sum)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 2: broadcast(dtype=float32, shapes=[[10]], root=0)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace cohort::dist::testing
