// The shm backend with ranks as threads: the backend-neutral collectives suite, again with tiny
// slots so every op streams through many chunks, segment cleanup, a stalled rank and a setup that
// never completes. (Forked ranks are in failure_test.cc: a process that already ran gloo's
// TCP device thread cannot fork children that use gloo.)
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include <cohort/config.h>
#include <cohort/distributed/shm/shm_backend.h>

#include "distributed/collectives_suite.h"
#include "distributed/fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

#if COHORT_USE_SHM
// "shm" with 4 KiB slots and send/recv rings and no single-round allreduce: every op runs chunk
// by chunk.
const bool kTinyRegistered = [] {
  registerBackend("shm_tiny_slots",
                  [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
                    shm_backend::ShmConfig c;
                    c.slotBytes = 4096;
                    c.smallBytes = 0;
                    c.p2pBytes = 4096;
                    return std::make_shared<shm_backend::ShmBackend>(store, rank, size, opts, c);
                  });
  return true;
}();

// "shm" running its ops on a worker thread (COHORT_COLLECTIVE_THREAD=worker).
const bool kWorkerRegistered = [] {
  registerBackend("shm_worker",
                  [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
                    shm_backend::ShmConfig c;
                    c.worker = true;
                    return std::make_shared<shm_backend::ShmBackend>(store, rank, size, opts, c);
                  });
  return true;
}();

#endif

std::vector<std::string> shmBackends() {
  return hasBackend("shm") ? std::vector<std::string>{"shm"} : std::vector<std::string>{};
}
std::vector<std::string> tinyBackends() {
  return hasBackend("shm") ? std::vector<std::string>{"shm_tiny_slots"} : std::vector<std::string>{};
}
std::vector<std::string> workerBackends() {
  return hasBackend("shm") ? std::vector<std::string>{"shm_worker"} : std::vector<std::string>{};
}

INSTANTIATE_TEST_SUITE_P(Shm, Collectives,
                         ::testing::Combine(::testing::ValuesIn(shmBackends()), ::testing::Values(1, 2, 3, 4, 5)),
                         collectivesParamName);
INSTANTIATE_TEST_SUITE_P(ShmTinySlots, Collectives,
                         ::testing::Combine(::testing::ValuesIn(tinyBackends()), ::testing::Values(2, 3, 5)),
                         collectivesParamName);
INSTANTIATE_TEST_SUITE_P(ShmWorker, Collectives,
                         ::testing::Combine(::testing::ValuesIn(workerBackends()), ::testing::Values(2, 3)),
                         collectivesParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Collectives);

#if COHORT_USE_SHM
shm_backend::ShmBackend& shmOf(ProcessGroup& pg) {
  return dynamic_cast<shm_backend::ShmBackend&>(pg.backend(DeviceType::CPU));
}

TEST(ShmBackend, NoSegmentStaysInDevShmAndDestroyingTheGroupUnmapsThem) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  auto world = std::make_unique<ThreadWorld>("shm", 3);
  std::vector<std::string> names = shmOf(world->pg(0)).segmentNames();
  ASSERT_EQ(names.size(), 3u);
  // "/cohort_<token>_world_<rank>": the part before the rank is this group's.
  std::string stem = names[0].substr(1, names[0].rfind('_'));
  EXPECT_EQ(names[0].rfind("/cohort_", 0), 0u) << names[0];
  EXPECT_NE(names[0].find("_world_"), std::string::npos) << names[0];
  world->run([&](int r) {
    Tensor t = ones({5000});
    world->pg(r).allreduce(t)->wait();
    COHORT_EXPECT_MATCH(t, 5000, [](int64_t) { return 3.0; });
  });
  // Every rank maps all three segments, yet their names are gone already (unlinked after setup).
  EXPECT_EQ(mappedRegions(stem), 9);
  EXPECT_TRUE(devShmEntries(stem).empty());
  world.reset();
  EXPECT_EQ(mappedRegions(stem), 0);
  EXPECT_TRUE(devShmEntries(stem).empty());
}

#endif  // COHORT_USE_SHM

TEST(ShmBackend, StalledRankTimesOutWithItsNameAndAbortsTheBackend) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  ThreadWorld world("shm", 2, Millis(400));
  std::string kind0, msg0, kind1, msg1;
  world.run([&](int r) {
    Tensor t = ones({100});
    world.pg(r).allreduce(t)->wait();
    if (r == 1) {
      // Alive but late: rank 0's allreduce #2 times out and aborts its backend. Rank 1 may still
      // finish its #2 (rank 0 had published its part), but #3 fails at once: rank 0 aborted.
      std::this_thread::sleep_for(900ms);
      kind1 = "none";
      try {
        for (int k = 0; k < 2; ++k) world.pg(1).allreduce(t)->wait();
      } catch (const PeerError& e) {
        kind1 = "PeerError", msg1 = e.what();
      } catch (const DistError& e) {
        kind1 = "DistError", msg1 = e.what();
      }
      return;
    }
    auto start = std::chrono::steady_clock::now();
    try {
      world.pg(0).allreduce(t)->wait();
      kind0 = "none";
    } catch (const TimeoutError& e) {
      kind0 = "TimeoutError", msg0 = e.what();
    }
    // The timeout was 400 ms; the group's diagnosis may wait up to 500 ms more for the peers' reports.
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    // Later ops fail at once with the first error.
    Tensor u = ones({10});
    auto w = world.pg(0).allreduce(u);
    EXPECT_TRUE(w->isCompleted());
    EXPECT_THROW(w->wait(), PeerError);
  });
  EXPECT_EQ(kind0, "TimeoutError");
  EXPECT_NE(msg0.find("allreduce #2"), std::string::npos) << msg0;
  EXPECT_NE(msg0.find("rank [1]"), std::string::npos) << msg0;
  EXPECT_EQ(kind1, "PeerError") << msg1;
  EXPECT_NE(msg1.find("rank [0]"), std::string::npos) << msg1;
}

TEST(ShmBackend, SetupTimesOutWhenAPeerNeverJoins) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  auto store = std::make_shared<HashStore>(Millis(60'000));
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout = Millis(300);
  o.name = fmt::format("lonely{}", getpid());
  EXPECT_THROW(ProcessGroup::create(store, 0, 2, o), DistError);
  EXPECT_TRUE(devShmEntries(o.name).empty());
}

}  // namespace
}  // namespace cohort::dist::testing
