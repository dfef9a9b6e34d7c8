// cohortrun on one node, as a user runs it: the real executable starting the real worker
// program (tests/launcher/launcher_worker.cc), which joins with dist::initProcessGroup().
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <map>
#include <set>

#include <cohort/core/util/cpu_affinity.h>

#include "harness/ranks.h"
#include "launcher/launcher_test_util.h"

using namespace cohort::launcher_test;
using namespace std::chrono_literals;
using cohort::testing::freePort;

namespace {

std::map<std::string, std::string> readEnvFile(const std::string& path) {
  std::map<std::string, std::string> m;
  std::istringstream in(readFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

std::vector<pid_t> readPids(const std::string& path) {
  std::vector<pid_t> pids;
  std::istringstream in(readFile(path));
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

}  // namespace

TEST(Cohortrun, WorkersGetDistinctRanksAndTheJobEnvironment) {
  ScratchDir dir("cohortrun_env");
  Result r = runCohortrun({"--standalone", "--nproc-per-node", "3", "--rdzv-id", "envjob", workerPath(), "env",
                           dir.path.string()},
                          dir / "out");
  ASSERT_TRUE(r.finished) << r.output;
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    auto e = readEnvFile(dir / ("rank_" + std::to_string(rank) + ".env"));
    EXPECT_EQ(e["RANK"], std::to_string(rank));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["COHORT_RUN_ID"], "envjob");
    EXPECT_EQ(e["COHORT_RESTART_COUNT"], "0");
    EXPECT_EQ(e["COHORT_MAX_RESTARTS"], "0");
    EXPECT_EQ(e["COHORT_STORE_HOSTED_BY_LAUNCHER"], "1");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1");
    EXPECT_EQ(e["allreduce"], "6");  // 1 + 2 + 3: the three joined one group
    EXPECT_EQ(e["cpus"], cohort::util::cpuListString(cohort::util::allowedCpus()));  // not bound by default
    ports.insert(e["MASTER_PORT"]);
    EXPECT_NE(r.output.find("[" + std::to_string(rank) + "]: hello from rank " + std::to_string(rank) + " of 3"),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_NE(r.output.find("OMP_NUM_THREADS is not set"), std::string::npos) << r.output;
}

// --cpu-bind cores: each local rank runs on its own slice of the launcher's CPUs (its threads too:
// the worker reads its affinity after its process group's threads started), and says so.
TEST(Cohortrun, CpuBindCoresGivesEachLocalRankItsShareOfTheCpus) {
  ScratchDir dir("cohortrun_cpubind");
  const std::vector<int> cpus = cohort::util::allowedCpus();
  Result r = runCohortrun({"--cpu-bind", "cores", "--nproc-per-node", "3", workerPath(), "env", dir.path.string()},
                          dir / "out");
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    auto e = readEnvFile(dir / ("rank_" + std::to_string(rank) + ".env"));
    EXPECT_EQ(e["cpus"], cohort::util::cpuListString(cohort::util::cpuSlice(cpus, rank, 3))) << rank;
    EXPECT_EQ(e["allreduce"], "6");
  }
  EXPECT_NE(r.output.find("--cpu-bind cores: local ranks bound to CPUs: 0 on "), std::string::npos) << r.output;
  if (cpus.size() < 3) {
    EXPECT_NE(r.output.find("some ranks share a CPU"), std::string::npos) << r.output;
  }
}

TEST(Cohortrun, KeepsTheUsersOmpNumThreads) {
  ScratchDir dir("cohortrun_omp");
  Result r = runCohortrun({"--nproc-per-node", "1", workerPath(), "env", dir.path.string()}, dir / "out",
                          {"OMP_NUM_THREADS=3"});
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  EXPECT_EQ(readEnvFile(dir / "rank_0.env")["OMP_NUM_THREADS"], "3");
  EXPECT_EQ(r.output.find("OMP_NUM_THREADS is not set"), std::string::npos) << r.output;
}

TEST(Cohortrun, AFailingWorkerStopsTheOthersAndGivesItsExitCode) {
  ScratchDir dir("cohortrun_fail");
  Result r =
      runCohortrun({"--nproc-per-node", "3", "--stop-timeout", "5", workerPath(), "fail", "1", "7", dir.path.string()},
                   dir / "out");
  ASSERT_TRUE(r.finished) << r.output;
  EXPECT_EQ(r.exitCode(), 7) << r.output;
  EXPECT_NE(r.output.find("job FAILED after 1 attempt (--max-restarts 0)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 (local rank 1 on node 0, host "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 7"), std::string::npos) << r.output;
  // The summary quotes the failed rank's last lines.
  EXPECT_NE(r.output.find("last 1 lines of its output:\n    [1]: rank 1 failing on purpose with code 7"),
            std::string::npos)
      << r.output;
  for (int rank : {0, 2}) {
    auto pids = readPids(dir / ("rank_" + std::to_string(rank) + ".pid"));
    ASSERT_EQ(pids.size(), 1u) << "rank " << rank;
    EXPECT_FALSE(stillAliveAfter(pids[0])) << "rank " << rank << " outlived the job";
  }
}

TEST(Cohortrun, RestartsAKilledWorkerOnceAndFinishes) {
  ScratchDir dir("cohortrun_restart");
  Result r = runCohortrun({"--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "5", workerPath(),
                           "crash-once", "1", dir / "marker", dir.path.string()},
                          dir / "out");
  ASSERT_TRUE(r.finished) << r.output;
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  EXPECT_NE(r.output.find("restarting every node's workers (1 of 1 restarts)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 (local rank 1 on node 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << r.output;
  for (int rank : {0, 1}) {
    EXPECT_EQ(readFile(dir / ("rank_" + std::to_string(rank) + ".done")), "restart=1 allreduce=3") << rank;
  }
}

TEST(Cohortrun, WithoutRestartsLeftTheJobFailsWithTheSignal) {
  ScratchDir dir("cohortrun_norestart");
  Result r = runCohortrun({"--nproc-per-node", "2", "--stop-timeout", "5", workerPath(), "crash-once", "0",
                           dir / "marker", dir.path.string()},
                          dir / "out");
  ASSERT_TRUE(r.finished) << r.output;
  EXPECT_EQ(r.exitCode(), 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("rank 0 (local rank 0 on node 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[0]: crashing once"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "rank_1.done"));
}

TEST(Cohortrun, SigtermToTheLauncherLeavesNoWorkerBehind) {
  ScratchDir dir("cohortrun_sigterm");
  Child c =
      spawn({cohortrunPath(), "--nproc-per-node", "2", "--stop-timeout", "5", workerPath(), "hold", dir.path.string()},
            dir / "out");
  std::vector<pid_t> pids;
  for (int rank : {0, 1}) {
    ASSERT_TRUE(waitForFile(dir / ("rank_" + std::to_string(rank) + ".pids"))) << readFile(dir / "out");
    for (pid_t p : readPids(dir / ("rank_" + std::to_string(rank) + ".pids"))) pids.push_back(p);
  }
  ASSERT_EQ(pids.size(), 4u);  // two workers and the child each started
  for (pid_t p : pids) ASSERT_TRUE(alive(p));
  ::kill(c.pid, SIGTERM);
  Result r = waitFor(c, 30s);
  ASSERT_TRUE(r.finished) << r.output;
  EXPECT_EQ(r.exitCode(), 128 + SIGTERM) << r.output;
  EXPECT_NE(r.output.find("received SIGTERM: stopping the workers"), std::string::npos) << r.output;
  for (pid_t p : pids) EXPECT_FALSE(stillAliveAfter(p)) << "pid " << p << " outlived its launcher";
}

TEST(Cohortrun, UnreachableRendezvousFailsWithinTheTimeoutNamingTheEndpoint) {
  ScratchDir dir("cohortrun_unreachable");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
  Result r = runCohortrun({"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint, "--rdzv-timeout", "1",
                           workerPath(), "env", dir.path.string()},
                          dir / "out", {}, 30s);
  ASSERT_TRUE(r.finished) << r.output;
  EXPECT_EQ(r.exitCode(), 1) << r.output;
  EXPECT_NE(r.output.find("rendezvous at " + endpoint +
                          " (--rdzv-endpoint) failed: the store there could not be "
                          "reached for 1."),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("0 of 2 nodes are known to have arrived"), std::string::npos) << r.output;
}

TEST(Cohortrun, RendezvousTimeoutSaysHowManyNodesArrived) {
  ScratchDir dir("cohortrun_rdzv_timeout");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
  Result r = runCohortrun({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint, "--rdzv-timeout", "1",
                           "--rdzv-id", "lonely", workerPath(), "env", dir.path.string()},
                          dir / "out", {}, 30s);
  ASSERT_TRUE(r.finished) << r.output;
  EXPECT_EQ(r.exitCode(), 1) << r.output;
  EXPECT_NE(r.output.find("rendezvous at " + endpoint + " (--rdzv-endpoint) timed out after 1."), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 of 2 nodes arrived for round 0 of job 'lonely'"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "rank_0.env"));
}

TEST(Cohortrun, SeveralNodesWithoutAnEndpointIsAnError) {
  ScratchDir dir("cohortrun_noendpoint");
  Result r = runCohortrun({"--nnodes", "2", "--node-rank", "0", workerPath(), "env", dir.path.string()}, dir / "out");
  EXPECT_EQ(r.exitCode(), 2) << r.output;
  EXPECT_NE(r.output.find("--nnodes 2 needs a rendezvous address every node can reach: pass --rdzv-endpoint"),
            std::string::npos)
      << r.output;
}

TEST(Cohortrun, LogDirRedirectsAndLocalRanksFilter) {
  ScratchDir dir("cohortrun_logs");
  Result r = runCohortrun({"--nproc-per-node", "3", "--rdzv-id", "logjob", "--log-dir", dir / "logs", "--redirects",
                           "1:1", "--local-ranks-filter", "1,2", workerPath(), "env", dir.path.string()},
                          dir / "out");
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  // Rank 0 is filtered from the console, rank 1's stdout redirected to its file only, rank 2 shown.
  EXPECT_EQ(r.output.find("[0]: hello"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[1]: hello"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[2]: hello from rank 2 of 3"), std::string::npos) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(readFile(dir / ("logs/logjob/attempt_0/rank_" + std::to_string(rank) + ".stdout")),
              "hello from rank " + std::to_string(rank) + " of 3\n");
  }
}

TEST(Cohortrun, HelpEnvListsTheRegistry) {
  ScratchDir dir("cohortrun_helpenv");
  Result r = runCohortrun({"--help-env"}, dir / "out");
  ASSERT_EQ(r.exitCode(), 0) << r.output;
  // From core, distributed, rpc and the launcher.
  for (const char* knob :
       {"COHORT_BLAS", "COHORT_BACKEND", "COHORT_STORE_TOKEN", "COHORT_STORE_HOSTED_BY_LAUNCHER", "MASTER_ADDR",
        "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "COHORT_GLOO_IFACE", "OMP_NUM_THREADS", "COHORT_RPC_SHM"}) {
    EXPECT_NE(r.output.find(std::string("\n  ") + knob), std::string::npos) << knob << "\n" << r.output;
  }
}

TEST(Cohortrun, VersionAndMissingProgram) {
  ScratchDir dir("cohortrun_version");
  Result v = runCohortrun({"--version"}, dir / "out");
  EXPECT_EQ(v.exitCode(), 0);
  EXPECT_EQ(v.output.rfind("cohortrun ", 0), 0u) << v.output;
  Result m = runCohortrun({"--nproc-per-node", "2"}, dir / "out2");
  EXPECT_EQ(m.exitCode(), 2);
  EXPECT_NE(m.output.find("no program given"), std::string::npos) << m.output;
  Result nf = runCohortrun({"no_such_program_here_xyz"}, dir / "out3");
  EXPECT_EQ(nf.exitCode(), 127);
  EXPECT_NE(nf.output.find("program 'no_such_program_here_xyz' was not found on PATH"), std::string::npos) << nf.output;
}
