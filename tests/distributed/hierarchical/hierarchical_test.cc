// The hierarchical backend with ranks as threads, several simulated nodes on one host: the
// backend-neutral collectives suite over several node layouts, the "auto" backend choice (world
// and subgroups), node identity (option, COHORT_NODE_ID, hostname), and a stalled rank whose op
// fails on every other rank with a typed error naming the op. (A killed rank, with forked
// processes, is in failure_test.cc.)
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include <cohort/config.h>
#include <cohort/distributed/topology.h>

#include "distributed/collectives_suite.h"
#include "distributed/env_guard.h"

#if COHORT_USE_SHM && COHORT_USE_GLOO
#include <cohort/distributed/hierarchical/hierarchical_backend.h>
#endif

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

constexpr bool kBuilt = COHORT_USE_SHM && COHORT_USE_GLOO;

// ---- the suite over simulated layouts ---------------------------------------------------------

#if COHORT_USE_SHM && COHORT_USE_GLOO
// "hier_2n2": the hierarchical backend with world ranks 0-1 on node 0 and 2-3 on node 1 (the
// node of a subgroup's rank is that of its world rank). Each node id is set through
// BackendOptions, as ProcessGroupOptions::nodeId would.
void registerLayout(const std::string& name, std::vector<int> sizes) {
  registerBackend(name, [sizes](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    BackendOptions o = opts;
    const int world = opts.globalRanks.empty() ? rank : opts.globalRanks[rank];
    int node = 0;
    for (int acc = sizes[0]; world >= acc;) acc += sizes[++node];
    o.nodeId = fmt::format("sim{}", node);
    o.nodeIds.clear();
    return std::make_shared<hierarchical_backend::HierarchicalBackend>(store, rank, size, o);
  });
}

const bool kLayoutsRegistered = [] {
  registerLayout("hier_2n2", {2, 2});
  registerLayout("hier_3n2", {3, 2});
  registerLayout("hier_1n2", {1, 2});
  registerLayout("hier_1n1", {1, 1});
  registerLayout("hier_2n1n2", {2, 1, 2});
  return true;
}();
#endif

// By default 2 nodes x 2 ranks and an uneven 1 + 2 (a node without shm, a padded allgather):
// together they take every code path, in about 12 s here. COHORT_TEST_HIERARCHICAL_LAYOUTS=all
// adds 3 + 2, 1 + 1 (no shm anywhere) and 2 + 1 + 2 (three nodes), about 16 s more.
std::vector<CollectivesParam> layouts() {
  if (!kBuilt) return {};
  std::vector<CollectivesParam> out = {{"hier_2n2", 4}, {"hier_1n2", 3}};
  const char* all = std::getenv("COHORT_TEST_HIERARCHICAL_LAYOUTS");
  if (all && std::string(all) == "all") {
    out.insert(out.end(), {{"hier_3n2", 5}, {"hier_1n1", 2}, {"hier_2n1n2", 5}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Hierarchical, Collectives, ::testing::ValuesIn(layouts()), collectivesParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Collectives);

std::string cpuBackend(ProcessGroup& pg) { return pg.backend(DeviceType::CPU).name(); }

// ---- node identity ----------------------------------------------------------------------------

TEST(NodeIdentity, OptionThenEnvironmentThenHostname) {
  EnvGuard env;
  env.unset("COHORT_NODE_ID");
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(localNodeId(""), std::string(host));
  env.set("COHORT_NODE_ID", "rack3-node7");
  EXPECT_EQ(localNodeId(""), "rack3-node7");
  EXPECT_EQ(localNodeId("from-option"), "from-option");
}

TEST(NodeIdentity, LayoutGroupsRanksByNodeAndOrdersNodesByLowestRank) {
  NodeLayout l = NodeLayout::fromIds({"b", "a", "b", "c", "a"});
  ASSERT_EQ(l.numNodes(), 3);
  EXPECT_EQ(l.nodes[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(l.nodes[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(l.nodes[2], (std::vector<int>{3}));
  EXPECT_EQ(l.nodeOf, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(l.localRank, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(l.maxNodeSize(), 2u);
}

// ---- "auto" --------------------------------------------------------------------------------------

TEST(AutoBackend, OneNodePicksShm) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  ThreadWorld w({"a", "a", "a"}, "auto");
  w.run([&](int r) { EXPECT_EQ(cpuBackend(w.pg(r)), "shm"); });
}

TEST(AutoBackend, DefaultNodeIdIsTheHostSoThreadsOfOneProcessGetShm) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  EnvGuard env;
  env.unset("COHORT_NODE_ID");
  ThreadWorld w({"", ""}, "auto");
  w.run([&](int r) { EXPECT_EQ(cpuBackend(w.pg(r)), "shm"); });
}

TEST(AutoBackend, SeveralNodesWithSeveralRanksPickHierarchicalAndSubgroupsChooseAgain) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  ThreadWorld w({"a", "a", "b", "b", "c"}, "auto");
  w.run([&](int r) {
    auto& pg = w.pg(r);
    EXPECT_EQ(cpuBackend(pg), "hierarchical");
#if COHORT_USE_SHM && COHORT_USE_GLOO
    auto& hb = dynamic_cast<hierarchical_backend::HierarchicalBackend&>(pg.backend(DeviceType::CPU));
    EXPECT_EQ(hb.layout().numNodes(), 3);
    EXPECT_EQ(hb.isLeader(), r == 0 || r == 2 || r == 4);
#endif
    // A real collective over the chosen backend: every stage runs.
    Tensor t = filled(DType::Float32, 1000, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
    pg.allreduce(t)->wait();
    COHORT_EXPECT_MATCH(t, 1000, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 5, i); });

    // Subgroups: node a alone → shm; one rank of each node → gloo; ranks 0-3 → hierarchical.
    auto nodeA = pg.newGroup({0, 1});
    auto leaders = pg.newGroup({0, 2, 4});
    auto four = pg.split(r < 4 ? 0 : -1, r);
    EXPECT_EQ(nodeA != nullptr, r <= 1);
    if (nodeA) {
      EXPECT_EQ(cpuBackend(*nodeA), "shm");
    }
    if (leaders) {
      EXPECT_EQ(cpuBackend(*leaders), "gloo");
    }
    if (four) {
      EXPECT_EQ(cpuBackend(*four), "hierarchical");
      Tensor u = filled(DType::Int64, 7, [&](int64_t i) { return value(DType::Int64, ReduceOp::Max, r, i); });
      four->allreduce(u, {.op = ReduceOp::Max})->wait();
      COHORT_EXPECT_MATCH(u, 7, [&](int64_t i) { return reduceRef(DType::Int64, ReduceOp::Max, 4, i, {0, 1, 2, 3}); });
    }
    pg.barrier()->wait();
  });
}

TEST(AutoBackend, OneRankPerNodePicksGloo) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  ThreadWorld w({"a", "b", "c"}, "auto");
  w.run([&](int r) { EXPECT_EQ(cpuBackend(w.pg(r)), "gloo"); });
}

TEST(AutoBackend, ExplicitNamesAreKept) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  ThreadWorld g({"a", "a"}, "gloo");
  g.run([&](int r) { EXPECT_EQ(cpuBackend(g.pg(r)), "gloo"); });
  ThreadWorld h({"a", "a", "b"}, "hierarchical");
  h.run([&](int r) {
    EXPECT_EQ(cpuBackend(h.pg(r)), "hierarchical");
    Tensor t = filled(DType::BFloat16, 7, [&](int64_t i) { return value(DType::BFloat16, ReduceOp::Avg, r, i); });
    h.pg(r).allreduce(t, {.op = ReduceOp::Avg})->wait();
    COHORT_EXPECT_MATCH(t, 7, [&](int64_t i) { return reduceRef(DType::BFloat16, ReduceOp::Avg, 3, i); });
  });
}

// ---- a stalled rank ----------------------------------------------------------------------------

TEST(HierarchicalFailure, StalledRankFailsEveryOtherRankWithTheOpNamed) {
  if (!kBuilt) GTEST_SKIP() << "shm or gloo is not built";
  constexpr Millis kTimeout{1500};
  ThreadWorld w({"a", "a", "b", "b"}, "hierarchical", kTimeout);
  constexpr int kStalled = 3;  // a non-leader: its leader waits in the shm stage, the others behind it
  std::vector<std::string> errors(4);
  w.run([&](int r) {
    auto& pg = w.pg(r);
    Tensor t = ones({1000});
    pg.allreduce(t)->wait();  // #1 completes everywhere
    if (r == kStalled) return;
    try {
      pg.allreduce(t)->wait();  // #2: rank 3 never comes
      errors[r] = "no error";
    } catch (const TimeoutError& e) {
      errors[r] = std::string("TimeoutError: ") + e.what();
    } catch (const PeerError& e) {
      errors[r] = std::string("PeerError: ") + e.what();
    } catch (const DistError& e) {
      errors[r] = std::string("DistError: ") + e.what();
    }
  });
  for (int r = 0; r < 4; ++r) {
    if (r == kStalled) continue;
    SCOPED_TRACE(fmt::format("rank {}: {}", r, errors[r]));
    EXPECT_NE(errors[r].find("allreduce #2 in group 'world'"), std::string::npos);
    EXPECT_TRUE(errors[r].rfind("TimeoutError", 0) == 0 || errors[r].rfind("PeerError", 0) == 0);
    // The group's diagnosis names the rank that never came.
    EXPECT_TRUE(std::regex_search(errors[r], std::regex(R"(never reached it: \[(\d+, )*3[,\]])")));
  }
  // Rank 2, waiting for it in the shm stage, names that stage and times out itself.
  EXPECT_EQ(errors[2].rfind("TimeoutError", 0), 0u);
  EXPECT_NE(errors[2].find("reduce to the node leader over node 1"), std::string::npos);
}

}  // namespace
}  // namespace cohort::dist::testing
