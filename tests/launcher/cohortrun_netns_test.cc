// cohortrun across hosts: two network namespaces joined by a veth pair stand for two nodes, each
// with its own address. One cohortrun per namespace (--nnodes 2, the rendezvous at namespace 0's
// address) runs 2 workers each; they train train_math.h's toy model over gloo, checkpointing
// every 5 steps. Global rank 3 (node 1) kills itself at step 13 in the first attempt: both
// launchers stop their workers, meet again, and the restarted job resumes from step 11 (the
// step-10 checkpoint) and finishes with the same state on every rank, equal to the reference.
// A second test trains examples/train_digits --ddp (DistributedDataParallel over gloo) across the
// two namespaces with nodes ranked by arrival (no --node-rank: the launcher that can bind the
// endpoint hosts it), and every rank ends with the same parameters.
// Needs root and `ip` (iproute2); otherwise skipped with the reason.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <set>

#include "launcher/launcher_test_util.h"
#include "launcher/train_math.h"

using namespace cohort::launcher_test;
using namespace std::chrono_literals;

namespace {

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Two namespaces, veth ends vA (10.77.0.1) and vB (10.77.0.2); removed by the destructor.
struct NamespacePair {
  std::string nsA, nsB, vA, vB;
  std::string error;
  NamespacePair() {
    const std::string id = std::to_string(::getpid() % 1000000);
    nsA = "cohortrun_" + id + "_a";
    nsB = "cohortrun_" + id + "_b";
    vA = "crv" + id + "a";
    vB = "crv" + id + "b";
    const std::vector<std::string> steps = {
        "ip netns add " + nsA,
        "ip netns add " + nsB,
        "ip link add " + vA + " type veth peer name " + vB,
        "ip link set " + vA + " netns " + nsA,
        "ip link set " + vB + " netns " + nsB,
        "ip -n " + nsA + " addr add 10.77.0.1/24 dev " + vA,
        "ip -n " + nsB + " addr add 10.77.0.2/24 dev " + vB,
        "ip -n " + nsA + " link set lo up",
        "ip -n " + nsB + " link set lo up",
        "ip -n " + nsA + " link set " + vA + " up",
        "ip -n " + nsB + " link set " + vB + " up",
    };
    for (const auto& s : steps) {
      if (sh(s) != 0) {
        error = "`" + s + "` failed";
        return;
      }
    }
  }
  ~NamespacePair() {
    sh("ip netns del " + nsA);
    sh("ip netns del " + nsB);
    sh("ip link del " + vA);
  }
};

#define SKIP_UNLESS_NAMESPACES(ns)                                                                        \
  if (::geteuid() != 0)                                                                                   \
    GTEST_SKIP() << "needs root to create network namespaces (running as uid " << ::geteuid() << ")";     \
  if (sh("ip -V") != 0) GTEST_SKIP() << "`ip` (iproute2) is not installed: scripts/setup.sh installs it"; \
  NamespacePair ns;                                                                                       \
  if (!ns.error.empty()) GTEST_SKIP() << "cannot make network namespaces here: " << ns.error

std::string stateText(const State& w) {
  std::string s;
  for (auto v : w) s += std::to_string(v) + " ";
  return s;
}

}  // namespace

TEST(CohortrunMultiNode, TwoNamespacesRestartFromTheCheckpointAndAgree) {
  SKIP_UNLESS_NAMESPACES(ns);

  ScratchDir dir("cohortrun_netns");
  std::filesystem::create_directories(dir / "ckpt");
  std::filesystem::create_directories(dir / "out");
  const int steps = 40;
  auto launch = [&](const std::string& nsName, const std::string& iface, int nodeRank) {
    return spawn({"ip",
                  "netns",
                  "exec",
                  nsName,
                  cohortrunPath(),
                  "--nnodes",
                  "2",
                  "--node-rank",
                  std::to_string(nodeRank),
                  "--rdzv-endpoint",
                  "10.77.0.1:29400",
                  "--rdzv-id",
                  "netns",
                  "--rdzv-timeout",
                  "30",
                  "--nproc-per-node",
                  "2",
                  "--max-restarts",
                  "1",
                  "--monitor-interval",
                  "0.05",
                  "--stop-timeout",
                  "5",
                  workerPath(),
                  "train",
                  std::to_string(steps),
                  "5",
                  dir / "ckpt",
                  dir / "out",
                  "3",
                  "13",
                  dir / "marker"},
                 dir / ("node" + std::to_string(nodeRank) + ".out"),
                 {"COHORT_BACKEND=gloo", "COHORT_GLOO_IFACE=" + iface, "OMP_NUM_THREADS="});
  };
  Child node0 = launch(ns.nsA, ns.vA, 0);
  Child node1 = launch(ns.nsB, ns.vB, 1);
  Result r0 = waitFor(node0, 90s);
  Result r1 = waitFor(node1, 30s);
  ASSERT_TRUE(r0.finished && r1.finished) << "node 0:\n" << r0.output << "\nnode 1:\n" << r1.output;
  ASSERT_EQ(r0.exitCode(), 0) << r0.output << "\nnode 1:\n" << r1.output;
  ASSERT_EQ(r1.exitCode(), 0) << r1.output << "\nnode 0:\n" << r0.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "marker"));
  for (const Result* r : {&r0, &r1}) {
    EXPECT_NE(r->output.find("restarting every node's workers (1 of 1 restarts) after a failure"), std::string::npos)
        << r->output;
    EXPECT_NE(r->output.find("restart 1 of 1: node "), std::string::npos) << r->output;
  }
  EXPECT_NE(r0.output.find("(hosting the rendezvous at 10.77.0.1:29400)"), std::string::npos) << r0.output;
  EXPECT_NE(r1.output.find("[3]: killing myself at step 13"), std::string::npos) << r1.output;

  const std::string expected = stateText(reference(4, steps));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string base = dir / ("out/rank_" + std::to_string(rank));
    EXPECT_EQ(readFile(base + ".attempt_0.start"), "1") << "rank " << rank;
    EXPECT_EQ(readFile(base + ".attempt_1.start"), "11") << "rank " << rank << " did not resume from step 10";
    EXPECT_EQ(readFile(base + ".result"), expected) << "rank " << rank;
  }
  EXPECT_NE(r1.output.find("[2]: training from step 11 to 40 (attempt 1)"), std::string::npos) << r1.output;
}

TEST(CohortrunMultiNode, DdpTrainingAcrossNamespacesEndsWithEqualParameters) {
#ifndef COHORT_TRAIN_DIGITS_PATH
  GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
#else
  SKIP_UNLESS_NAMESPACES(ns);
  ScratchDir dir("cohortrun_netns_ddp");
  auto launch = [&](const std::string& nsName, const std::string& iface, const std::string& out) {
    return spawn({"ip", "netns", "exec", nsName, cohortrunPath(), "--nnodes", "2", "--rdzv-endpoint", "10.77.0.1:29400",
                  "--rdzv-timeout", "30", "--nproc-per-node", "2", "--stop-timeout", "5", COHORT_TRAIN_DIGITS_PATH,
                  "--ddp", "--epochs", "2"},
                 out, {"COHORT_BACKEND=gloo", "COHORT_GLOO_IFACE=" + iface, "OMP_NUM_THREADS="});
  };
  Child a = launch(ns.nsA, ns.vA, dir / "a.out");
  Child b = launch(ns.nsB, ns.vB, dir / "b.out");
  Result ra = waitFor(a, 90s);
  Result rb = waitFor(b, 30s);
  ASSERT_TRUE(ra.finished && rb.finished) << ra.output << "\n----\n" << rb.output;
  ASSERT_EQ(ra.exitCode(), 0) << ra.output << "\n----\n" << rb.output;
  ASSERT_EQ(rb.exitCode(), 0) << rb.output << "\n----\n" << ra.output;
  // Namespace a can bind the endpoint, so it hosts; b connects.
  EXPECT_NE(ra.output.find("(hosting the rendezvous at 10.77.0.1:29400)"), std::string::npos) << ra.output;
  EXPECT_EQ(rb.output.find("hosting the rendezvous"), std::string::npos) << rb.output;
  std::regex checksum(R"(\[(\d)\]: rank (\d) parameter checksum ([0-9a-f]+))");
  std::set<int> ranks;
  std::set<std::string> sums;
  for (const std::string& out : {ra.output, rb.output}) {
    for (std::sregex_iterator it(out.begin(), out.end(), checksum), end; it != end; ++it) {
      EXPECT_EQ((*it)[1], (*it)[2]);  // the prefix names the rank that printed
      ranks.insert(std::stoi((*it)[2]));
      sums.insert((*it)[3]);
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3})) << ra.output << "\n----\n" << rb.output;
  EXPECT_EQ(sums.size(), 1u) << "the ranks' parameters differ:\n" << ra.output << "\n----\n" << rb.output;
  EXPECT_NE((ra.output + rb.output).find("on 4 ranks (gloo backend"), std::string::npos) << ra.output << rb.output;
#endif
}
