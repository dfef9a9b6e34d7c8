// cohortrun's argument model (launcher/options.h): torchrun's flags, their checks and the
// rendezvous endpoint they resolve to.
#include <gtest/gtest.h>

#include <thread>

#include <cohort/core/util/error.h>
#include <cohort/launcher/options.h>

using namespace cohort;
using namespace cohort::launcher;

namespace {

std::string errorOf(const std::vector<std::string>& args) {
  try {
    parseArgs(args);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(CohortrunOptions, TorchrunFlagsBothSpellings) {
  auto o = parseArgs({"--nnodes", "2:4", "--nproc_per_node", "3", "--node-rank", "1", "--rdzv_endpoint", "node0:29400",
                      "--rdzv-id", "job7", "--max-restarts", "2", "--monitor_interval", "0.5", "./train", "--lr", "3",
                      "--", "x"});
  EXPECT_EQ(o.minNodes, 2);
  EXPECT_EQ(o.maxNodes, 4);
  EXPECT_EQ(o.nproc, 3);
  EXPECT_EQ(o.nodeRank, 1);
  EXPECT_EQ(o.rdzvId, "job7");
  EXPECT_EQ(o.maxRestarts, 2);
  EXPECT_DOUBLE_EQ(o.monitorInterval, 0.5);
  EXPECT_EQ(o.program, "./train");
  // Everything after the program is the program's, its own flags included.
  EXPECT_EQ(o.programArgs, (std::vector<std::string>{"--lr", "3", "--", "x"}));
  Endpoint e = resolveEndpoint(o);
  EXPECT_EQ(e.host, "node0");
  EXPECT_EQ(e.port, 29400);
}

TEST(CohortrunOptions, DoubleDashBeforeTheProgram) {
  auto o = parseArgs({"--standalone", "--", "prog", "--standalone"});
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.programArgs, std::vector<std::string>{"--standalone"});
  Endpoint e = resolveEndpoint(o);
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, 0);  // a free one
  EXPECT_FALSE(o.rdzvId.empty());
}

TEST(CohortrunOptions, NprocAutoAndCpu) {
  int cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(parseArgs({"--nproc-per-node", "cpu", "p"}).nproc, cores);
  EXPECT_EQ(parseArgs({"--nproc-per-node", "auto", "p"}).nproc, cores);  // no CUDA device in this build
  EXPECT_NE(errorOf({"--nproc-per-node", "0", "p"}).find("--nproc-per-node must be at least 1"), std::string::npos);
  EXPECT_NE(errorOf({"--nproc-per-node", "many", "p"}).find("'many' is not a non-negative integer"), std::string::npos);
}

TEST(CohortrunOptions, MasterAddrIsTheStaticRendezvous) {
  auto o = parseArgs({"--nnodes", "2", "--node-rank", "0", "--master-addr", "10.1.2.3", "p"});
  Endpoint e = resolveEndpoint(o);
  EXPECT_EQ(e.str(), "10.1.2.3:29500");
  EXPECT_EQ(e.origin, "--master-addr/--master-port");
  EXPECT_EQ(resolveEndpoint(parseArgs({"--master-addr", "h", "--master-port", "1234", "p"})).str(), "h:1234");
  EXPECT_EQ(parseHostPort("[::1]:80", "--x").str(), "[::1]:80");
}

TEST(CohortrunOptions, BadCombinationsNameTheFlag) {
  EXPECT_NE(errorOf({"--nnodes", "2", "p"}).find("pass --rdzv-endpoint host:port"), std::string::npos);
  EXPECT_NE(errorOf({"--nnodes", "3:2", "--rdzv-endpoint", "h:1", "p"}).find("need 1 <= MIN <= MAX"),
            std::string::npos);
  EXPECT_NE(errorOf({"--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1", "p"})
                .find("--node-rank 2 is outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(errorOf({"--standalone", "--nnodes", "2", "p"}).find("--standalone is a single-node job"),
            std::string::npos);
  EXPECT_NE(errorOf({"--rdzv-endpoint", "nohostport", "p"}).find("--rdzv-endpoint 'nohostport': expected host:port"),
            std::string::npos);
  EXPECT_NE(errorOf({"--rdzv-endpoint", "h:70000", "p"}).find("port out of range"), std::string::npos);
  EXPECT_NE(errorOf({"--redirects", "4", "p"}).find("--redirects 4: stream values are 0"), std::string::npos);
  EXPECT_NE(errorOf({"--max-restarts", "-1", "p"}).find("max-restarts"), std::string::npos);
  EXPECT_NE(errorOf({"--no-such-flag", "p"}).find("--no-such-flag"), std::string::npos);
  EXPECT_NE(errorOf({}).find("no program given"), std::string::npos);
  const std::string bind = errorOf({"--cpu-bind", "sockets", "p"});
  EXPECT_NE(bind.find("--cpu-bind"), std::string::npos) << bind;
  EXPECT_NE(bind.find("sockets"), std::string::npos) << bind;
}

TEST(CohortrunOptions, CpuBind) {
  EXPECT_EQ(parseArgs({"p"}).cpuBind, "none");
  EXPECT_EQ(parseArgs({"--cpu-bind", "cores", "p"}).cpuBind, "cores");
  EXPECT_EQ(parseArgs({"--cpu_bind", "none", "p"}).cpuBind, "none");
}

TEST(CohortrunOptions, StreamSpecs) {
  StreamSpec all = parseStreamSpec("3", "--tee");
  EXPECT_EQ(all.forLocalRank(0), kBothStreams);
  EXPECT_EQ(all.forLocalRank(7), kBothStreams);
  StreamSpec per = parseStreamSpec("0:1,2:2", "--redirects");
  EXPECT_EQ(per.forLocalRank(0), kStdout);
  EXPECT_EQ(per.forLocalRank(1), kNoStreams);
  EXPECT_EQ(per.forLocalRank(2), kStderr);
  auto o = parseArgs({"--local-ranks-filter", "0,2", "p"});
  ASSERT_TRUE(o.localRanksFilter);
  EXPECT_EQ(*o.localRanksFilter, (std::vector<int>{0, 2}));
}
