// Job profiling across processes: two forked ranks train a DDP model with COHORT_PROFILE set (as
// cohortrun --profile sets it); every DDP bucket's all-reduce shows on both ranks with the same
// sequence numbers, the merged trace has one process per rank, and collectives carry each rank's
// time waiting for the other versus moving data.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/profiler/profiler.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/job_profile.h>

#include "harness/ranks.h"

namespace cohort::dist {
namespace {

nlohmann::json readJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(JobProfile, DdpBucketsOnEveryRankInOneMergedTrace) {
  const int world = 2;
  const uint16_t port = cohort::testing::freePort();
  const std::string dir = fmt::format("{}/cohort_job_profile_{}", ::testing::TempDir(), getpid());
  std::filesystem::remove_all(dir);
  auto results = cohort::testing::runRanks(world, [&](int r, std::ostream& report) {
    try {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("COHORT_PROFILE", dir.c_str(), 1);
      ::setenv("COHORT_PROFILE_STEPS", "1:2", 1);
      InitOptions o;
      o.storeTimeout = Millis(60'000);
      o.timeout = Millis(60'000);
      ProcessGroupPtr pg = initProcessGroup(o);
      manualSeed(3);
      auto net = std::make_shared<nn::Sequential>(nn::Linear(32, 32), nn::ReLU(), nn::Linear(32, 32), nn::ReLU(),
                                                  nn::Linear(32, 4));
      // Tiny buckets: several all-reduces per step.
      auto ddp = std::make_shared<DistributedDataParallel>(net, pg,
                                                           DDPOptions{.bucketCapMb = 4096.0 / (1 << 20),
                                                                      .firstBucketCapMb = 4096.0 / (1 << 20)});
      optim::AdamW opt(ddp->parameters(), {.lr = 1e-3});
      manualSeed(100 + static_cast<uint64_t>(r));
      for (int step = 0; step < 4; ++step) {
        opt.zeroGrad();
        Tensor x = randn({8, 32});
        nn::functional::mseLoss(ddp->forward(x), zeros({8, 4})).backward();
        opt.step();
      }
      // Rank 0 hosts the store: it leaves last.
      pg->store()->set("left/" + std::to_string(r), "1");
      if (r == 0) pg->store()->wait({"left/0", "left/1"}, Millis(60'000));
      destroyProcessGroup();
      return 0;
    } catch (const std::exception& e) {
      report << e.what();
      return 1;
    }
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].report;

  // Each rank's own trace: DDP buckets, each bucket's all-reduce with its sequence number.
  std::map<int, std::set<int64_t>> allreduceSeqs, collectiveSeqs;
  std::map<int, int> buckets;
  for (int r = 0; r < world; ++r) {
    nlohmann::json t = readJson(fmt::format("{}/rank{}.json", dir, r));
    EXPECT_EQ(t["cohort"]["rank"], r);
    EXPECT_EQ(t["cohort"]["steps"], 2);
    for (const auto& e : t["traceEvents"]) {
      if (e.value("cat", "") == "ddp") ++buckets[r];
      if (e.value("cat", "") == "collective") collectiveSeqs[r].insert(e["args"]["seq"].get<int64_t>());
      if (e.value("cat", "") == "collective" && e["name"] == "allreduce") {
        EXPECT_EQ(e["args"]["group"], "world");
        EXPECT_EQ(e["args"]["rank"], r);
        EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
        EXPECT_FALSE(e["args"]["backend"].get<std::string>().empty());
        allreduceSeqs[r].insert(e["args"]["seq"].get<int64_t>());
      }
    }
    EXPECT_TRUE(std::filesystem::exists(fmt::format("{}/memory_rank{}.html", dir, r)));
  }
  EXPECT_GE(buckets[0], 2 * 2);  // at least two buckets in each of the two profiled steps
  EXPECT_EQ(buckets[0], buckets[1]);
  EXPECT_FALSE(allreduceSeqs[0].empty());
  EXPECT_EQ(allreduceSeqs[0], allreduceSeqs[1]);
  EXPECT_EQ(collectiveSeqs[0], collectiveSeqs[1]);

  // The merged job trace: one process per rank, collectives matched across ranks.
  nlohmann::json job = readJson(dir + "/trace.json");
  std::set<int> pids;
  int flows = 0, withWait = 0;
  for (const auto& e : job["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") pids.insert(e["pid"].get<int>());
    if (e["ph"] == "s" && e.value("cat", "") == "collective") ++flows;
    if (e["ph"] == "X" && e.value("cat", "") == "collective" && e["args"].contains("wait_us")) {
      ++withWait;
      EXPECT_GE(e["args"]["wait_us"].get<double>(), 0.0);
      EXPECT_GE(e["args"]["move_us"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  // Every collective of the window (the buckets' all-reduces and DDP's own bookkeeping ones).
  EXPECT_EQ(job["cohort"]["matchedCollectives"].get<size_t>(), collectiveSeqs[0].size());
  EXPECT_EQ(flows, static_cast<int>(collectiveSeqs[0].size()));
  EXPECT_EQ(withWait, 2 * static_cast<int>(collectiveSeqs[0].size()));
  std::filesystem::remove_all(dir);
}

TEST(JobProfile, StepsVariableIsChecked) {
  ::setenv("COHORT_PROFILE", "/tmp/x", 1);
  for (const char* bad : {"3", "a:b", "1:0", "-1:2", "1:2x"}) {
    ::setenv("COHORT_PROFILE_STEPS", bad, 1);
    EXPECT_THROW(jobProfileOptionsFromEnv(), ValueError) << bad;
  }
  ::setenv("COHORT_PROFILE_STEPS", "0:5", 1);
  auto o = jobProfileOptionsFromEnv();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->skipSteps, 0);
  EXPECT_EQ(o->steps, 5);
  ::unsetenv("COHORT_PROFILE");
  ::unsetenv("COHORT_PROFILE_STEPS");
  EXPECT_FALSE(jobProfileOptionsFromEnv().has_value());
}

TEST(JobProfile, MergeRejectsWhatIsNotATrace) {
  EXPECT_THROW(profiler::mergeTraces({}), ValueError);
  EXPECT_THROW(profiler::mergeTraces({"{not json"}), ValueError);
  EXPECT_THROW(profiler::mergeTraces({R"({"traceEvents": []})"}), ValueError);
  const std::string one = R"({"traceEvents": [], "cohort": {"rank": 1}})";
  EXPECT_THROW(profiler::mergeTraces({one, one}), ValueError);  // rank 1 twice
}

}  // namespace
}  // namespace cohort::dist
