// Failure tests with real processes, one suite for every backend whose ranks can be forked
// children: ranks meet through a FileStore, one is killed (SIGKILL) or stalls, and every survivor
// must fail fast with a typed error naming the op, the group and the missing rank; later ops fail
// at once, the test always finishes (the process harness kills everything past a deadline) and
// nothing of the group is left in /dev/shm. The same holds for DDP, killed mid-backward.
// The world is 4 ranks on two simulated nodes (ranks 0-1 and 2-3), which only the hierarchical
// backend reads.
// MPI is not here: a rank of an mpirun job that dies takes the whole job down (mpirun kills the
// others), and its ranks are started by mpirun, not forked; MPI's own timeout tests are in
// mpi_test.cc. Checks that concern one backend only follow the suite.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

#include "distributed/fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kSize = 4;

struct Forked {
  StorePtr store;
  std::shared_ptr<ProcessGroup> pg;
};

// Rank `rank` of a kSize group `group` on `backend`.
Forked joinGroup(const std::string& dir, const std::string& backend, const std::string& group, int rank, Millis timeout,
                 DebugLevel debug = DebugLevel::Off) {
  Forked f;
  f.store = std::make_shared<FileStore>(dir + "/store", Millis(30'000));
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout = timeout;
  o.name = group;
  o.nodeId = rank < 2 ? "simA" : "simB";
  o.debug = debug;
  f.pg = ProcessGroup::create(f.store, rank, kSize, o);
  return f;
}

// The group's diagnosis names `dead` in a rank list: "[2]", "[0, 2]", "rank [2]", ...
bool namesRank(const std::string& msg, int dead) {
  return std::regex_search(msg, std::regex(fmt::format(R"(\[(\d+, )*{}[,\]])", dead)));
}

class Failure : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!hasBackend(backend())) GTEST_SKIP() << backend() << " is not built";
  }
  const std::string& backend() const { return GetParam(); }
  // A group name no other test (or earlier run) shares, so its /dev/shm entries are its own.
  std::string groupName(const std::string& what) const { return fmt::format("{}{}{}", what, backend(), getpid()); }
  void expectNothingInDevShm(const std::string& group) {
    EXPECT_TRUE(devShmEntries(group).empty()) << fmt::format("{}", fmt::join(devShmEntries(group), " "));
  }
};

// Rank `dead` dies inside an allreduce (a large one, which cannot finish without it); the others
// start theirs once it is dead.
TEST_P(Failure, RankKilledInsideAnAllreduceIsNamedBySurvivors) {
  for (int dead : {kSize - 1, kSize - 2}) {  // on the hierarchical backend: a non-leader, a leader
    SCOPED_TRACE(fmt::format("rank {} dies", dead));
    TempDir tmp;
    const std::string dir = tmp.path().string();
    const std::string group = groupName(fmt::format("killed{}", dead));
    constexpr auto kTimeout = Millis(10'000);
    auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
      Forked f = joinGroup(dir, backend(), group, rank, kTimeout);
      Tensor warm = ones({10});
      f.pg->allreduce(warm)->wait();
      Tensor big = ones({1 << 22});  // 16 MiB
      return dieInsideOpOrReport(
          *f.store, rank, dead, [&] { f.pg->allreduce(big)->wait(); }, [&] { f.pg->barrier()->wait(); });
    });
    auto reports = expectSurvivorsFailFast(results, dead, kTimeout);
    for (int r = 0; r < kSize; ++r) {
      if (!reports[r]) continue;
      const std::string& msg = reports[r]->first.message;
      EXPECT_NE(msg.find(fmt::format("allreduce #2 in group '{}'", group)), std::string::npos) << msg;
      EXPECT_TRUE(namesRank(msg, dead)) << "rank " << r << " did not name rank " << dead << ": " << msg;
      if (backend() == "shm") {
        EXPECT_NE(msg.find(fmt::format("rank [{}]", dead)), std::string::npos) << msg;
      }
    }
    if (backend() == "hierarchical") {
      // The dead rank's node-mate catches it in the shm stage of its own node.
      const int mate = dead ^ 1;
      EXPECT_NE(results[mate].report.find(fmt::format("over node {} of group '{}'", dead / 2, group)),
                std::string::npos)
          << results[mate].report;
    }
    expectNothingInDevShm(group);
  }
}

// Rank 1 dies between two ops: the survivors' next allreduce fails, naming it.
TEST_P(Failure, RankKilledBeforeTheOpIsNamedBySurvivors) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = groupName("before");
  constexpr int kDead = 1;
  constexpr auto kTimeout = Millis(2000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, backend(), group, rank, kTimeout);
    Tensor t = ones({1000});
    for (int k = 0; k < 3; ++k) f.pg->allreduce(t)->wait();
    f.pg->barrier()->wait();
    // The dead rank dies on entering the op (a small allreduce may complete without a rank that
    // dies inside it once its data is in); the others start theirs once it is dead.
    auto op = [&] {
      if (rank == kDead) raise(SIGKILL);
      f.pg->allreduce(t)->wait();
    };
    return dieInsideOpOrReport(*f.store, rank, kDead, op, [&] { f.pg->allreduce(t)->wait(); });
  });
  auto reports = expectSurvivorsFailFast(results, kDead, kTimeout);
  for (int r = 0; r < kSize; ++r) {
    if (!reports[r]) continue;
    const std::string& msg = reports[r]->first.message;
    EXPECT_NE(msg.find(fmt::format("allreduce #5 in group '{}'", group)), std::string::npos) << msg;
    EXPECT_TRUE(namesRank(msg, kDead)) << "rank " << r << " did not name rank " << kDead << ": " << msg;
  }
  expectNothingInDevShm(group);
}

// Rank 0 lives but never calls the next op: the others time out naming it.
TEST_P(Failure, StalledRankTimesOutWithItsName) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = groupName("stalled");
  constexpr int kStalled = 0;
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, backend(), group, rank, Millis(1500));
    Tensor t = ones({100});
    f.pg->allreduce(t)->wait();
    if (rank == kStalled) {
      std::this_thread::sleep_for(3s);  // alive but never calls the next op
      raise(SIGKILL);
    }
    Outcome o = classifyOutcome([&] { f.pg->allreduce(t)->wait(); });
    return fmt::format("{}|{}|{}", o.kind, o.seconds, o.message);
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_FALSE(results[r].killedByWatchdog) << "rank " << r << " hung: " << results[r].report;
    if (r == kStalled) continue;
    Outcome o = parseOutcome(results[r].report);
    std::cout << "rank " << r << " (" << o.seconds << " s): " << o.kind << ": " << o.message << "\n";
    // A TimeoutError; or, on hierarchical, a PeerError on a rank whose node leader timed out
    // first and aborted the node's stage under it: its message then carries the leader's
    // timeout (the deadlines are the same on every rank, so which comes first is a race).
    const bool timedOutHere = o.kind == "TimeoutError";
    const bool leaderTimedOut =
        backend() == "hierarchical" && o.kind == "PeerError" && o.message.find("timed out after") != std::string::npos;
    EXPECT_TRUE(timedOutHere || leaderTimedOut) << results[r].report;
    EXPECT_LT(o.seconds, 5.0) << o.message;
    EXPECT_NE(o.message.find(fmt::format("allreduce #2 in group '{}'", group)), std::string::npos) << o.message;
    EXPECT_TRUE(namesRank(o.message, kStalled)) << "rank " << r << " did not name rank 0: " << o.message;
  }
}

// COHORT_DEBUG=DETAIL across processes: rank 2 calls broadcast where the others call allreduce.
// Every rank (the odd one out too) fails at once with one DistError that lists each rank's call,
// instead of a hang or a silently wrong result.
TEST_P(Failure, MismatchedCollectiveUnderDetailFailsOnEveryRank) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = groupName("mismatch");
  constexpr int kOdd = 2;
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, backend(), group, rank, Millis(20'000), DebugLevel::Detail);
    Tensor t = ones({10});
    f.pg->allreduce(t)->wait();  // a matching call passes the check
    Outcome o = classifyOutcome([&] {
      if (rank == kOdd) f.pg->broadcast(t)->wait();
      else f.pg->allreduce(t)->wait();
    });
    return fmt::format("{}|{}|{}", o.kind, o.seconds, o.message);
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_FALSE(results[r].killedByWatchdog) << "rank " << r << " hung";
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].describe() << ": " << results[r].report;
    Outcome o = parseOutcome(results[r].report);
    EXPECT_EQ(o.kind, "DistError") << "rank " << r << ": " << results[r].report;
    EXPECT_LT(o.seconds, 10.0) << "rank " << r << " waited for the timeout";
    const std::string& msg = o.message;
    EXPECT_NE(msg.find(fmt::format("collective mismatch in group '{}' at sequence number 2", group)), std::string::npos)
        << msg;
    for (int k = 0; k < kSize; ++k) {
      const std::string call = k == kOdd ? fmt::format("rank {}: broadcast(dtype=float32, shapes=[[10]], root=0)", k)
                                         : fmt::format("rank {}: allreduce(dtype=float32, shapes=[[10]], op=sum)", k);
      EXPECT_NE(msg.find(call), std::string::npos) << msg;
    }
  }
  expectNothingInDevShm(group);
}

// DDP: a rank killed in the middle of backward (after its first bucket went out) makes every
// survivor's backward fail with a DistError naming the dead rank, within the group's timeout,
// instead of hanging.
TEST_P(Failure, DdpRankKilledMidBackwardFailsEverySurvivorWithItsName) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = groupName("ddp");
  constexpr int kDead = 2;
  constexpr auto kTimeout = Millis(3000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, backend(), group, rank, kTimeout);
    Generator g(7);
    auto net = std::make_shared<nn::Sequential>(nn::Linear(32, 64, true, &g), nn::Tanh(), nn::Linear(64, 64, true, &g),
                                                nn::Tanh(), nn::Linear(64, 4, true, &g));
    // One bucket per layer or so: the dead rank gets one bucket out, then dies.
    DistributedDataParallel ddp(net, f.pg, {.bucketCapMb = 8e-3, .firstBucketCapMb = 2e-3});
    auto def = allreduceHook();
    int launched = 0;
    ddp.registerCommHook(makeCommHook("die_on_second_bucket", [&](ProcessGroup& pg, GradBucket& b) {
      if (rank == kDead && ++launched == 2) raise(SIGKILL);
      return def->run(pg, b);
    }));
    Tensor x = randn({8, 32}, {}, &g), y = randn({8, 4}, {}, &g);
    Outcome o = classifyOutcome([&] { nn::functional::mseLoss(ddp(x), y).backward(); });
    return fmt::format("{}|{}|{}", o.kind, o.seconds, o.message);
  });
  for (int r = 0; r < kSize; ++r) {
    const auto& res = results[r];
    EXPECT_FALSE(res.killedByWatchdog) << "rank " << r << " hung: " << res.report;
    if (r == kDead) {
      EXPECT_TRUE(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    ASSERT_TRUE(res.ok()) << "rank " << r << " ended with " << res.describe() << ": " << res.report;
    Outcome o = parseOutcome(res.report);
    std::cout << "rank " << r << " (" << o.seconds << " s): " << o.kind << ": " << o.message << "\n";
    EXPECT_TRUE(o.kind == "PeerError" || o.kind == "TimeoutError") << "rank " << r << ": " << res.report;
    EXPECT_LT(o.seconds, 3.0 + 5.0) << "rank " << r << " waited past the timeout and its grace";
    EXPECT_NE(o.message.find("allreduce #"), std::string::npos) << o.message;
    EXPECT_TRUE(namesRank(o.message, kDead)) << "rank " << r << " did not name the dead rank: " << o.message;
  }
  expectNothingInDevShm(group);
}

INSTANTIATE_TEST_SUITE_P(Backend, Failure, ::testing::Values("gloo", "shm", "hierarchical"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- one backend only ------------------------------------------------------------------------

// gloo: rank 2 dies 2 ms into a 64 MiB allreduce it issued itself (it must still forward the
// others' reduced chunks long after), racing the survivors' own calls of the same op.
TEST(GlooFailure, RankKilledWhileItsOwnAllreduceRunsIsNamedBySurvivors) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string dir = tmp.path().string();
  constexpr int kDead = 2;
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, "gloo", "world", rank, Millis(2000));
    Tensor warm = ones({10});
    f.pg->allreduce(warm)->wait();
    Tensor big = ones({1 << 24});
    if (rank == kDead) {
      auto w = f.pg->allreduce(big);
      std::this_thread::sleep_for(2ms);
      raise(SIGKILL);
    }
    Outcome o = classifyOutcome([&] { f.pg->allreduce(big)->wait(); });
    return fmt::format("{}|{}|{}", o.kind, o.seconds, o.message);
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_FALSE(results[r].killedByWatchdog) << "rank " << r << " hung: " << results[r].report;
    if (r == kDead) {
      EXPECT_TRUE(WIFSIGNALED(results[r].status) && WTERMSIG(results[r].status) == SIGKILL);
      continue;
    }
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].describe() << ": " << results[r].report;
    Outcome o = parseOutcome(results[r].report);
    EXPECT_NE(o.kind, "none") << "rank " << r << " got no error";
    EXPECT_LT(o.seconds, 5.0) << o.message;
    EXPECT_NE(o.message.find("allreduce #"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("in group 'world'"), std::string::npos) << o.message;
    EXPECT_TRUE(namesRank(o.message, kDead)) << "rank " << r << " did not name rank " << kDead << ": " << o.message;
  }
}

// gloo: rank 2 is alive but never joins an allreduce; rank 1's op times out after 300 ms, while
// the others' timeout is 6 s. gloo's timeout closes rank 1's connections, so a rank whose wait is
// on rank 1 fails at once (a PeerError). One blocked on rank 2's live connection (rank 3, in
// gloo's ring) is not woken by that: it must stop on the abort signal a failed rank raised,
// quoting that rank. Every rank names rank 2, fails long before its own timeout, and fails its
// next op at once.
TEST(GlooFailure, ARankThatTimesOutStopsTheRanksBlockedOnALivePeer) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = fmt::format("signal{}", getpid());
  constexpr int kIdle = 2, kFirst = 1;
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, "gloo", group, rank, rank == kFirst ? Millis(300) : Millis(6000));
    Tensor t = ones({1000});
    f.pg->allreduce(t)->wait();
    if (rank == kIdle) {
      std::this_thread::sleep_for(4s);  // alive, its connections open, but never calls the op
      return "idle";
    }
    Outcome o = classifyOutcome([&] { f.pg->allreduce(t)->wait(); });
    std::string later = "none";
    try {
      f.pg->barrier()->wait();
    } catch (const DistError&) {
      later = "DistError";
    }
    return fmt::format("{}|{}|{}|{}", o.kind, o.seconds, later, o.message);
  });
  int stoppedBySignal = 0;
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].describe() << ": " << results[r].report;
    if (r == kIdle) continue;
    auto report = parseSurvivorReport(results[r].report);
    ASSERT_TRUE(report) << results[r].report;
    const Outcome& o = report->first;
    std::cout << "rank " << r << " (" << o.seconds << " s): " << o.kind << ": " << o.message << "\n";
    EXPECT_LT(o.seconds, 3.0) << o.message;
    EXPECT_EQ(report->later, "DistError") << "a later op must fail at once";
    EXPECT_NE(o.message.find(fmt::format("allreduce #2 in group '{}'", group)), std::string::npos) << o.message;
    EXPECT_TRUE(namesRank(o.message, kIdle)) << "rank " << r << " did not name rank " << kIdle << ": " << o.message;
    if (r == kFirst) {
      EXPECT_EQ(o.kind, "TimeoutError") << o.message;
      continue;
    }
    EXPECT_TRUE(o.kind == "TimeoutError" || o.kind == "PeerError") << o.kind << ": " << o.message;
    if (std::regex_search(o.message, std::regex(fmt::format("rank [0-3] of group '{}' stopped it", group))))
      ++stoppedBySignal;
  }
  EXPECT_GE(stoppedBySignal, 1) << "no rank was blocked on rank 2: the test no longer exercises the signal";
}

// shm, with DDP's kind of tensor: buffers every rank maps (allocateCommBuffer), reduced in place.
// The ranks first check one such allreduce's values, then rank 2 dies inside the next; nothing of
// the group may remain in /dev/shm.
TEST(ShmBackendFailure, RankKilledInARegisteredAllreduceIsNamedAndNothingRemains) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const std::string group = fmt::format("regkilled{}", getpid());
  constexpr int kDead = 2;
  constexpr auto kTimeout = Millis(10'000);
  auto results = runForked(kSize, 60s, dir, [&](int rank) -> std::string {
    Forked f = joinGroup(dir, "shm", group, rank, kTimeout);
    constexpr int64_t kCount = 1 << 22;  // 16 MiB of float32
    Tensor buf = f.pg->allocateCommBuffer({kCount}, DType::Float32);
    buf.copy_(arange(0, kCount, 1, {.dtype = DType::Float32}) * static_cast<double>(rank + 1));
    f.pg->allreduce(buf)->wait();
    // Sum over ranks of i * (rank + 1) = 10i: exact in float32 below 2^24.
    Tensor want = arange(0, kCount, 1, {.dtype = DType::Float32}) * 10.0;
    if ((buf - want).abs().max().item<double>() != 0.0) return fmt::format("rank {}: wrong registered result", rank);
    return dieInsideOpOrReport(
        *f.store, rank, kDead, [&] { f.pg->allreduce(buf)->wait(); }, [&] { f.pg->barrier()->wait(); });
  });
  auto reports = expectSurvivorsFailFast(results, kDead, kTimeout);
  for (int r = 0; r < kSize; ++r) {
    if (!reports[r]) continue;
    const std::string& msg = reports[r]->first.message;
    EXPECT_NE(msg.find(fmt::format("allreduce #2 in group '{}'", group)), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("rank [{}]", kDead)), std::string::npos) << msg;
  }
  EXPECT_TRUE(devShmEntries("_" + group + "_").empty())
      << fmt::format("{}", fmt::join(devShmEntries("_" + group + "_"), " "));
}

}  // namespace
}  // namespace cohort::dist::testing
