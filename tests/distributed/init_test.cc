// initProcessGroup(): rank 0 hosts the TCP store at MASTER_ADDR:MASTER_PORT (or the launcher
// does), every rank connects and joins, the group comes back with the right rank and size and
// becomes the default; the rendezvous names missing and duplicate ranks and disagreeing world
// sizes. Ranks run as threads with explicit environments, and as forked processes that read
// real torchrun-style variables. The group uses gloo when the build has it, else a backend
// registered here that serves no op (rendezvous and store are what is tested).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/store/tcp_store.h>

#include "distributed/env_guard.h"
#include "harness/ranks.h"

using namespace cohort;
using namespace cohort::dist;
using cohort::testing::freePort;

namespace {

class NullBackend : public Backend {
 public:
  using Backend::Backend;
};

const bool kRegistered = [] {
  registerBackend("init_test_null", [](const StorePtr&, int rank, int size, const BackendOptions&) {
    return std::make_shared<NullBackend>("init_test_null", rank, size);
  });
  return true;
}();

env::LaunchEnvironment environment(int rank, int world, uint16_t port) {
  env::LaunchEnvironment e;
  e.rank = rank;
  e.worldSize = world;
  e.localRank = rank;
  e.localWorldSize = world;
  e.masterAddr = "127.0.0.1";
  e.masterPort = port;
  e.masterAddrOrigin = e.masterPortOrigin = "test";
  return e;
}

InitOptions threadOptions(int rank, int world, uint16_t port, Millis storeTimeout = Millis(30'000)) {
  InitOptions o;
  o.environment = environment(rank, world, port);
  o.backend = "init_test_null";
  o.setDefault = false;
  o.storeTimeout = storeTimeout;
  return o;
}

// Runs f(rank) on one thread per rank, collecting each rank's exception text ("" when none).
template <typename F>
std::vector<std::string> onThreads(int n, F f) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace

TEST(InitProcessGroup, ThreadsJoinThroughRankZerosStore) {
  ASSERT_TRUE(kRegistered);
  for (int world : {1, 2, 3, 5}) {
    uint16_t port = freePort();
    std::vector<ProcessGroupPtr> pgs(world);
    auto errors = onThreads(world, [&](int r) {
      pgs[r] = initProcessGroup(threadOptions(r, world, port));
      // The groups share one store: every rank sees every other rank's key.
      pgs[r]->store()->set("hello/" + std::to_string(r), std::to_string(r * 10));
      for (int p = 0; p < world; ++p) {
        if (pgs[r]->store()->getString("hello/" + std::to_string(p)) != std::to_string(p * 10)) {
          throw std::runtime_error("wrong value from rank " + std::to_string(p));
        }
      }
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(errors[r], "") << "world " << world << " rank " << r;
      EXPECT_EQ(pgs[r]->rank(), r);
      EXPECT_EQ(pgs[r]->size(), world);
      EXPECT_EQ(pgs[r]->name(), "world");
    }
    EXPECT_FALSE(isInitialized());
    // Rank 0's store hosts the server: release the others first.
    for (int r = world - 1; r >= 0; --r) pgs[r].reset();
  }
}

TEST(InitProcessGroup, DefaultGroupFromTorchrunVariables) {
  EnvGuard g;
  uint16_t port = freePort();
  g.set("RANK", "0").set("WORLD_SIZE", "1").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", std::to_string(port));
  g.set("COHORT_BACKEND", "init_test_null");
  EXPECT_FALSE(isInitialized());
  EXPECT_THROW(defaultProcessGroup(), ValueError);
  ProcessGroupPtr pg = initProcessGroup();
  EXPECT_TRUE(isInitialized());
  EXPECT_EQ(defaultProcessGroup(), pg);
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->backend(DeviceType::CPU).name(), "init_test_null");
  try {
    initProcessGroup();
    ADD_FAILURE() << "a second default group was created";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  destroyProcessGroup();
  EXPECT_FALSE(isInitialized());
  EXPECT_THROW(defaultProcessGroup(), ValueError);
  pg.reset();
  // And again, on a fresh port (the old server may linger in TIME_WAIT).
  g.set("MASTER_PORT", std::to_string(freePort()));
  pg = initProcessGroup();
  EXPECT_EQ(defaultProcessGroup(), pg);
  destroyProcessGroup();
}

TEST(InitProcessGroup, NoEnvironmentIsAValueErrorListingTheSources) {
  EnvGuard g;
  try {
    initProcessGroup();
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("RANK"), std::string::npos) << m;
    EXPECT_NE(m.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << m;
    EXPECT_NE(m.find("SLURM_PROCID"), std::string::npos) << m;
  }
  EXPECT_FALSE(isInitialized());
}

// The next tests host the store outside the ranks: a rank that fails first would otherwise take
// rank 0's server down under the others, which then see a lost connection instead.
TCPStoreServerOptions loopbackServer() {
  TCPStoreServerOptions so;
  so.host = "127.0.0.1";
  return so;
}

TEST(InitProcessGroup, MissingRanksAreNamedOnTimeout) {
  TCPStoreServer server(loopbackServer());
  uint16_t port = server.port();
  // Ranks 0 and 2 of 4 arrive; 1 and 3 never do.
  auto errors = onThreads(2, [&](int i) {
    InitOptions o = threadOptions(i * 2, 4, port, Millis(1500));
    o.hostStore = false;
    initProcessGroup(o);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("ranks [1, 3] of 4 did not join group 'world' at the store 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("(2 joined;"), std::string::npos) << e;
  }
}

TEST(InitProcessGroup, DuplicateRankIsNamed) {
  uint16_t port = freePort();
  std::vector<ProcessGroupPtr> pgs(3);
  // Threads 1 and 2 both claim rank 1; exactly one of them is told so.
  auto errors = onThreads(3, [&](int i) {
    int rank = i == 0 ? 0 : 1;
    if (i == 2) std::this_thread::sleep_for(Millis(200));  // let the first claim land
    pgs[i] = initProcessGroup(threadOptions(rank, 2, port, Millis(5000)));
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[2].find("rank 1 of group 'world' was already claimed by another process"), std::string::npos)
      << errors[2];
  for (int i = 2; i >= 0; --i) pgs[i].reset();
}

TEST(InitProcessGroup, DisagreeingWorldSizes) {
  TCPStoreServer server(loopbackServer());
  std::vector<ProcessGroupPtr> pgs(2);
  auto errors = onThreads(2, [&](int r) {
    InitOptions o = threadOptions(r, r == 0 ? 2 : 3, server.port(), Millis(1500));
    o.hostStore = false;
    pgs[r] = initProcessGroup(o);
  });
  EXPECT_NE(errors[0].find("ranks disagree on the world size (this is rank 0 with 2): rank 1: world=3"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("ranks [2] of 3 did not join"), std::string::npos) << errors[1];
}

TEST(InitProcessGroup, StoreHostedByTheLauncher) {
  EnvGuard g;
  TCPStoreServer server(loopbackServer());
  g.set("COHORT_STORE_HOSTED_BY_LAUNCHER", "1");
  InitOptions o = threadOptions(0, 1, server.port());
  ProcessGroupPtr pg = initProcessGroup(o);  // binding that port itself would fail: it is taken
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_GE(server.numConnections(), 1u);
  pg.reset();

  // Nobody hosting: rank 0 fails to connect within the timeout, saying so.
  uint16_t port = freePort();
  o = threadOptions(0, 1, port, Millis(300));
  try {
    initProcessGroup(o);
    ADD_FAILURE() << "expected StoreError";
  } catch (const StoreError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cannot connect to the store"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << m;
  }
}

TEST(InitProcessGroup, TakenPortIsAStoreErrorNamingIt) {
  TCPStoreServer squatter(loopbackServer());
  try {
    initProcessGroup(threadOptions(0, 1, squatter.port(), Millis(300)));
    ADD_FAILURE() << "expected StoreError";
  } catch (const StoreError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cannot host the store"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(squatter.port())), std::string::npos) << m;
  }
}

// Separate processes, each reading real environment variables, as under torchrun. With gloo, the
// group also runs an allreduce.
TEST(InitProcessGroup, ForkedProcessesFromEnvironmentVariables) {
  const int world = 3;
  const uint16_t port = freePort();
  const bool gloo = hasBackend("gloo");
  if (!gloo) std::printf("[   NOTE   ] this build has no gloo: the forked ranks check the rendezvous only\n");
  auto results = cohort::testing::runRanks(world, [&](int r, std::ostream&) {
    int code = 0;
    try {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("COHORT_BACKEND", gloo ? "gloo" : "init_test_null", 1);
      InitOptions o;
      o.storeTimeout = Millis(60'000);
      o.timeout = Millis(60'000);
      ProcessGroupPtr pg = initProcessGroup(o);
      if (pg->rank() != r || pg->size() != world || defaultProcessGroup() != pg) code = 2;
      if (gloo) {
        Tensor t = full({5}, static_cast<double>(r + 1));
        pg->allreduce(t)->wait();
        for (float v : t.toVector<float>()) {
          if (v != 6.0f) code = 3;  // 1 + 2 + 3
        }
      }
      // Rank 0 hosts the store: it leaves last.
      pg->store()->set("left/" + std::to_string(r), "1");
      if (r == 0) {
        std::vector<std::string> keys;
        for (int p = 0; p < world; ++p) keys.push_back("left/" + std::to_string(p));
        pg->store()->wait(keys, Millis(60'000));
      }
      destroyProcessGroup();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      code = 1;
    }
    return code;
  });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].describe();
}
