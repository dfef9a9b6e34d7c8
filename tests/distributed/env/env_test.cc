// Launch-environment detection (torchrun-style, OpenMPI, Slurm) and Slurm's compressed node and
// task lists. Expected host lists follow Slurm's hostlist rules (`scontrol show hostnames`):
// ranges keep the lower bound's zero padding, later bracket groups vary fastest.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/env/environment.h>
#include <cohort/distributed/env/nodelist.h>

#include "distributed/env_guard.h"

using namespace cohort;
using namespace cohort::dist::env;
using Hosts = std::vector<std::string>;

// Runs `f`, expects a ValueError, and returns its message.
template <typename F>
std::string valueErrorOf(F&& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ValueError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ValueError, nothing was thrown";
  return "";
}

// ---- node lists ----------------------------------------------------------------------------

TEST(NodeList, PlainNames) {
  EXPECT_EQ(expandNodeList("login1"), Hosts{"login1"});
  EXPECT_EQ(expandNodeList("a,b,c"), (Hosts{"a", "b", "c"}));
  EXPECT_EQ(expandNodeList("  node7 \n"), Hosts{"node7"});
  EXPECT_EQ(expandNodeList("10.0.0.1,host-a.example.org"), (Hosts{"10.0.0.1", "host-a.example.org"}));
}

TEST(NodeList, RangesAndPadding) {
  EXPECT_EQ(expandNodeList("node[1-3]"), (Hosts{"node1", "node2", "node3"}));
  EXPECT_EQ(expandNodeList("node[01-04,07]"), (Hosts{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expandNodeList("n[08-11]"), (Hosts{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expandNodeList("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expandNodeList("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expandNodeList("n[5]"), Hosts{"n5"});
  EXPECT_EQ(expandNodeList("n[3,1]"), (Hosts{"n3", "n1"}));  // order as written
  EXPECT_EQ(expandNodeList("[1-2]"), (Hosts{"1", "2"}));
}

TEST(NodeList, SuffixesAndSeveralItems) {
  EXPECT_EQ(expandNodeList("node[01-04,07],gpu-[1-2]a,login1"),
            (Hosts{"node01", "node02", "node03", "node04", "node07", "gpu-1a", "gpu-2a", "login1"}));
  EXPECT_EQ(expandNodeList("a[1-2].cluster,b"), (Hosts{"a1.cluster", "a2.cluster", "b"}));
}

TEST(NodeList, SeveralBracketGroupsInOneName) {
  EXPECT_EQ(expandNodeList("rack[1-2]-node[01-02]"),
            (Hosts{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}));
  EXPECT_EQ(expandNodeList("r[1,3]n[1-2]x,y"), (Hosts{"r1n1x", "r1n2x", "r3n1x", "r3n2x", "y"}));
}

TEST(NodeList, FirstHost) {
  EXPECT_EQ(firstNodeListHost("node[01-04,07],gpu-[1-2]a"), "node01");
  EXPECT_EQ(firstNodeListHost("rack[3-4]-node[009-010]"), "rack3-node009");
  EXPECT_EQ(firstNodeListHost("login1,node[1-2]"), "login1");
  // Huge but valid lists are not expanded for the first host...
  EXPECT_EQ(firstNodeListHost("n[0-99999]"), "n0");
  // ...and still validated.
  EXPECT_NE(valueErrorOf([] { firstNodeListHost("n[1-2],x[3"); }).find("\"n[1-2],x[3\""), std::string::npos);
}

TEST(NodeList, MalformedListsNameTheInput) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"node[1-2", "never closed"},    {"node1-2]", "without a matching"}, {"node[]", "empty entry"},
      {"node[1,,2]", "empty entry"},   {"node[1-]", "empty range bound"},  {"node[-3]", "empty range bound"},
      {"node[5-3]", "runs backwards"}, {"node[a-b]", "not a number"},      {"node[1-2-3]", "not a number"},
      {"node[[1-2]]", "nested"},       {"a,,b", "empty host name"},        {"a,", "empty host name"},
      {",a", "empty host name"},       {"node 1", "whitespace"},           {"n[0-99999999999999999999]", "too long"},
  };
  for (const auto& [input, why] : cases) {
    std::string msg = valueErrorOf([&] { expandNodeList(input); });
    EXPECT_NE(msg.find("\"" + input + "\""), std::string::npos) << input << " -> " << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << input << " -> " << msg;
  }
  EXPECT_NE(valueErrorOf([] { expandNodeList(""); }).find("empty"), std::string::npos);
  EXPECT_NE(valueErrorOf([] { expandNodeList("n[0-9999999]"); }).find("more than"), std::string::npos);
  EXPECT_NE(valueErrorOf([] { expandNodeList("a[0-9999]b[0-9999]"); }).find("more than"), std::string::npos);
}

TEST(TasksPerNode, Expands) {
  EXPECT_EQ(expandTasksPerNode("4"), std::vector<int>{4});
  EXPECT_EQ(expandTasksPerNode("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expandTasksPerNode("1,3(x2),8"), (std::vector<int>{1, 3, 3, 8}));
  for (std::string bad : {"", "x", "2(x)", "2(3)", "2(x0)", "2(x3", ",1", "1,", "-1"}) {
    std::string msg = valueErrorOf([&] { expandTasksPerNode(bad); });
    EXPECT_NE(msg.find("\"" + bad + "\""), std::string::npos) << bad << " -> " << msg;
  }
}

// ---- detection -----------------------------------------------------------------------------

TEST(DetectEnvironment, Torchrun) {
  EnvGuard g;
  g.set("RANK", "3").set("WORLD_SIZE", "8").set("LOCAL_RANK", "1").set("LOCAL_WORLD_SIZE", "4");
  g.set("MASTER_ADDR", "node01").set("MASTER_PORT", "29511");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.source, LaunchSource::Torchrun);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.worldSize, 8);
  EXPECT_EQ(e.localRank, 1);
  EXPECT_EQ(e.localWorldSize, 4);
  EXPECT_EQ(e.masterAddr, "node01");
  EXPECT_EQ(e.masterPort, 29511);
  EXPECT_TRUE(launchEnvironmentPresent());
  EXPECT_NE(e.describe().find("rank 3 of 8 (local 1 of 4) via torchrun, master node01:29511"), std::string::npos)
      << e.describe();
}

TEST(DetectEnvironment, TorchrunWithoutLocalVariablesAssumesOneHost) {
  EnvGuard g;
  g.set("RANK", "1").set("WORLD_SIZE", "2").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "1234");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.localRank, 1);
  EXPECT_EQ(e.localWorldSize, 2);
}

TEST(DetectEnvironment, OpenMpiSingleHostUsesLoopbackAndJobIdPort) {
  EnvGuard g;
  g.set("OMPI_COMM_WORLD_RANK", "1").set("OMPI_COMM_WORLD_SIZE", "2");
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  g.set("OMPI_MCA_ess_base_jobid", "1328021505");  // a value mpirun 4.1.4 set on this machine
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.source, LaunchSource::OpenMPI);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.worldSize, 2);
  EXPECT_EQ(e.localRank, 1);
  EXPECT_EQ(e.localWorldSize, 2);
  EXPECT_EQ(e.masterAddr, "127.0.0.1");
  EXPECT_EQ(e.masterPort, 20000 + 1328021505 % 10000);
  g.unset("OMPI_MCA_ess_base_jobid");
  EXPECT_EQ(detectEnvironment().masterPort, 29500);
  g.set("MASTER_PORT", "4000").set("MASTER_ADDR", "10.1.2.3");
  e = detectEnvironment();
  EXPECT_EQ(e.masterPort, 4000);
  EXPECT_EQ(e.masterAddr, "10.1.2.3");
}

TEST(DetectEnvironment, OpenMpiMultiHost) {
  EnvGuard g;
  g.set("OMPI_COMM_WORLD_RANK", "5").set("OMPI_COMM_WORLD_SIZE", "8");
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  std::string msg = valueErrorOf([] { detectEnvironment(); });
  EXPECT_NE(msg.find("MASTER_ADDR is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 of 8 ranks"), std::string::npos) << msg;
  g.set("SLURM_JOB_NODELIST", "cn[017-018]");  // mpirun inside an sbatch allocation
  EXPECT_EQ(detectEnvironment().masterAddr, "cn017");
  g.set("MASTER_ADDR", "head");
  EXPECT_EQ(detectEnvironment().masterAddr, "head");
}

TEST(DetectEnvironment, Slurm) {
  EnvGuard g;
  g.set("SLURM_PROCID", "5").set("SLURM_NTASKS", "7").set("SLURM_LOCALID", "0");
  g.set("SLURM_TASKS_PER_NODE", "2(x3),1").set("SLURM_NODEID", "2");
  g.set("SLURM_JOB_NODELIST", "gpu[07-10]").set("SLURM_JOB_ID", "4242");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.source, LaunchSource::Slurm);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.worldSize, 7);
  EXPECT_EQ(e.localRank, 0);
  EXPECT_EQ(e.localWorldSize, 2);
  EXPECT_EQ(e.masterAddr, "gpu07");
  EXPECT_EQ(e.masterPort, 20000 + 4242);
  // The step's node list wins over the job's: srun puts task 0 on the step's first node.
  g.set("SLURM_STEP_NODELIST", "gpu[09-10]");
  EXPECT_EQ(detectEnvironment().masterAddr, "gpu09");
  g.set("SLURM_NODEID", "3");
  EXPECT_EQ(detectEnvironment().localWorldSize, 1);
  // The per-node list wins over the job's --ntasks-per-node, and the step's list over the job's.
  g.set("SLURM_NTASKS_PER_NODE", "2");
  EXPECT_EQ(detectEnvironment().localWorldSize, 1);
  g.set("SLURM_STEP_TASKS_PER_NODE", "3,4(x3)");
  EXPECT_EQ(detectEnvironment().localWorldSize, 4);
  g.set("SLURM_NODEID", "0");
  EXPECT_EQ(detectEnvironment().localWorldSize, 3);
  g.set("MASTER_ADDR", "10.0.0.9").set("MASTER_PORT", "30000");
  e = detectEnvironment();
  EXPECT_EQ(e.masterAddr, "10.0.0.9");
  EXPECT_EQ(e.masterPort, 30000);
}

// `srun -n 1` inside an `sbatch --ntasks-per-node=2` allocation (what a real Slurm 22.05 sets):
// the step has one task, SLURM_NTASKS and SLURM_TASKS_PER_NODE say so, SLURM_NTASKS_PER_NODE
// still holds the job's 2.
TEST(DetectEnvironment, SlurmStepSmallerThanTheAllocation) {
  EnvGuard g;
  g.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "1").set("SLURM_NPROCS", "1").set("SLURM_LOCALID", "0");
  g.set("SLURM_NTASKS_PER_NODE", "2").set("SLURM_TASKS_PER_NODE", "1").set("SLURM_STEP_TASKS_PER_NODE", "1");
  g.set("SLURM_NODEID", "0").set("SLURM_STEP_NODELIST", "vm").set("SLURM_JOB_NODELIST", "vm").set("SLURM_JOB_ID", "5");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.worldSize, 1);
  EXPECT_EQ(e.localWorldSize, 1);
  EXPECT_EQ(e.masterAddr, "vm");
  // Only the job's --ntasks-per-node: still the fallback.
  g.unset("SLURM_TASKS_PER_NODE").unset("SLURM_STEP_TASKS_PER_NODE").set("SLURM_NTASKS", "2");
  EXPECT_EQ(detectEnvironment().localWorldSize, 2);
}

TEST(DetectEnvironment, SlurmOlderVariables) {
  EnvGuard g;
  g.set("SLURM_PROCID", "0").set("SLURM_NPROCS", "2").set("SLURM_LOCALID", "0");
  g.set("SLURM_TASKS_PER_NODE", "2").set("SLURM_NODELIST", "login[1-2]");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.worldSize, 2);
  EXPECT_EQ(e.localWorldSize, 2);
  EXPECT_EQ(e.masterAddr, "login1");
  EXPECT_EQ(e.masterPort, 29500);
}

TEST(DetectEnvironment, Precedence) {
  EnvGuard g;
  g.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "1").set("SLURM_LOCALID", "0");
  g.set("SLURM_NTASKS_PER_NODE", "1").set("SLURM_JOB_NODELIST", "n1");
  EXPECT_EQ(detectEnvironment().source, LaunchSource::Slurm);
  // mpirun inside an sbatch script: the batch step's SLURM_PROCID=0 is inherited, OpenMPI wins.
  g.set("OMPI_COMM_WORLD_RANK", "1").set("OMPI_COMM_WORLD_SIZE", "2");
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  LaunchEnvironment e = detectEnvironment();
  EXPECT_EQ(e.source, LaunchSource::OpenMPI);
  EXPECT_EQ(e.rank, 1);
  // torchrun-style variables win over both.
  g.set("RANK", "0").set("WORLD_SIZE", "1").set("MASTER_ADDR", "localhost").set("MASTER_PORT", "29999");
  e = detectEnvironment();
  EXPECT_EQ(e.source, LaunchSource::Torchrun);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.worldSize, 1);
}

TEST(DetectEnvironment, NothingSetListsEverySource) {
  EnvGuard g;
  EXPECT_FALSE(launchEnvironmentPresent());
  std::string msg = valueErrorOf([] { detectEnvironment(); });
  for (const char* v :
       {"no launcher variables", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "Found: none of them"}) {
    EXPECT_NE(msg.find(v), std::string::npos) << v << " not in: " << msg;
  }
}

TEST(DetectEnvironment, MissingVariablesAreNamedWithWhatWasFound) {
  EnvGuard g;
  g.set("RANK", "3");
  std::string msg = valueErrorOf([] { detectEnvironment(); });
  EXPECT_NE(msg.find("torchrun launch detected, but WORLD_SIZE, MASTER_ADDR, MASTER_PORT missing"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Found: RANK=3."), std::string::npos) << msg;
  EXPECT_NE(msg.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << msg;  // what every source needs
  EXPECT_NE(msg.find("SLURM_PROCID"), std::string::npos) << msg;

  EnvGuard g2;
  g2.set("SLURM_PROCID", "1").set("SLURM_LOCALID", "0");
  msg = valueErrorOf([] { detectEnvironment(); });
  EXPECT_NE(msg.find("Slurm launch detected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SLURM_NTASKS (or SLURM_NPROCS)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("SLURM_JOB_NODELIST"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Found: SLURM_PROCID=1, SLURM_LOCALID=0"), std::string::npos) << msg;

  EnvGuard g3;
  g3.set("OMPI_COMM_WORLD_SIZE", "4");
  msg = valueErrorOf([] { detectEnvironment(); });
  EXPECT_NE(msg.find("OpenMPI launch detected, but OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, "
                     "OMPI_COMM_WORLD_LOCAL_SIZE missing"),
            std::string::npos)
      << msg;
}

TEST(DetectEnvironment, MalformedValues) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> vars;
    std::string expect;
  };
  const std::vector<std::pair<std::string, std::string>> torch = {{"RANK", "0"},
                                                                  {"WORLD_SIZE", "2"},
                                                                  {"MASTER_ADDR", "h"},
                                                                  {"MASTER_PORT", "29500"}};
  auto with = [&](std::string k, std::string v) {
    auto vars = torch;
    for (auto& [name, value] : vars) {
      if (name == k) value = v;
    }
    if (k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE") vars.emplace_back(k, v);
    return vars;
  };
  const std::vector<Case> cases = {
      {with("RANK", "abc"), "RANK='abc' is not a non-negative integer"},
      {with("RANK", "-1"), "RANK='-1' is not a non-negative integer"},
      {with("RANK", "2"), "RANK=2 is not below WORLD_SIZE=2"},
      {with("WORLD_SIZE", "0"), "WORLD_SIZE=0 is out of range"},
      {with("MASTER_PORT", "http"), "MASTER_PORT='http' is not a non-negative integer"},
      {with("MASTER_PORT", "70000"), "MASTER_PORT=70000 is out of range [1, 65535]"},
      {with("MASTER_PORT", "0"), "MASTER_PORT=0 is out of range [1, 65535]"},
      {with("LOCAL_RANK", "0"), "LOCAL_RANK is set but LOCAL_WORLD_SIZE missing"},
      {{{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       "OMPI_COMM_WORLD_LOCAL_RANK=3 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_JOB_NODELIST", "n[1-2]"}},
       "lists several nodes but SLURM_NODEID is missing"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_NODEID", "2"},
        {"SLURM_JOB_NODELIST", "n[1-2]"}},
       "SLURM_NODEID=2 but SLURM_TASKS_PER_NODE=\"2(x2)\" lists only 2 nodes"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_TASKS_PER_NODE", "2(y2)"},
        {"SLURM_JOB_NODELIST", "n[1-2]"}},
       "SLURM_TASKS_PER_NODE is malformed"},
      {{{"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_STEP_TASKS_PER_NODE", "1"},
        {"SLURM_NTASKS_PER_NODE", "2"},
        {"SLURM_JOB_NODELIST", "n1"}},
       "SLURM_LOCALID=1 is not below SLURM_STEP_TASKS_PER_NODE=1"},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NTASKS_PER_NODE", "2"},
        {"SLURM_JOB_NODELIST", "n[1-2"}},
       "SLURM_JOB_NODELIST is malformed: malformed Slurm node list \"n[1-2\""},
  };
  for (const auto& c : cases) {
    EnvGuard g;
    std::string what;
    for (const auto& [k, v] : c.vars) {
      g.set(k, v);
      what += k + "=" + v + " ";
    }
    std::string msg = valueErrorOf([] { detectEnvironment(); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << what << "\n  -> " << msg;
  }
}

TEST(DetectEnvironment, VariablesAreRegisteredKnobs) {
  std::vector<std::string> names;
  for (const auto& k : cohort::env::allKnobs()) names.push_back(k.name);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                        "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), v), names.end()) << v;
  }
}
