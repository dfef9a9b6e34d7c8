// FSDP training checkpoints (fsdp/training_checkpoint.h), ranks as forked processes over gloo: a
// rank SIGKILLed at each stage of a save leaves a folder that loads either the previous or the new
// checkpoint, never a mixture, and the resumed run ends with the same weights and optimizer state
// as an uninterrupted one, bit for bit (FULL_SHARD; NO_SHARD and HYBRID_SHARD resume exactly too);
// a checkpoint saved by 2 ranks loads on 3; a truncated or corrupt manifest, a missing, damaged or
// foreign part, or per-rank states on another world size are CheckpointErrors naming the file
// (and both steps for a foreign part), on every rank, and the ranks stay in step after them.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/dataset.h>
#include <cohort/core/data/sampler.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/optim/lr_scheduler.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/fsdp/state_dict.h>
#include <cohort/fsdp/training_checkpoint.h>

#include "distributed/fork_util.h"
#include "fsdp/fsdp_test_util.h"

namespace cohort::fsdp::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::testing::ChildResult;
using dist::testing::describeStatus;
using dist::testing::runForkedIn;
using dist::testing::TempDir;

constexpr int kSteps = 8;

// One forked world: `world` ranks train Net with FSDP, AdamW, a cosine schedule, a shuffling
// DistributedSampler loader and a per-rank generator that adds noise to every batch, saving a
// training checkpoint at the listed steps; optionally loading one first, and optionally killing a
// rank at a stage of one save.
struct WorldRun {
  std::string name{};  // unique per world in a test: names its store and its output files
  int world = 2;
  int steps = kSteps;
  std::vector<std::pair<int, std::string>> saves{};  // (after step, folder)
  std::string load{};                                // folder to resume from ("" = start fresh)
  std::vector<std::string> tryLoads{};               // folders every rank loads in turn, reporting each error
  uint64_t initSeed = 42;
  bool sameRngOnEveryRank = false;
  int killRank = -1;
  SaveStage killStage = SaveStage::BeforeParts;
  int killStep = -1;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int ranksPerNode = 0;  // > 0: simulated nodes of that many ranks (HYBRID_SHARD)
};

std::string outputFile(const std::string& dir, const std::string& name, int rank) {
  return fmt::format("{}/{}-rank{}.safetensors", dir, name, rank);
}

// What rank `rank` reports: "loaded <step>|" when it resumed, then "done", or "DistError|<message>"
// when a save failed under it (a peer died), or "CheckpointError|<message>" when its load failed.
std::string rankBody(const std::string& dir, const WorldRun& run, int rank) {
  auto store = std::make_shared<dist::FileStore>(dir + "/store-" + run.name, dist::Millis(30'000));
  dist::ProcessGroupOptions o;
  o.backend = "gloo";
  o.timeout = dist::Millis(20'000);
  auto pg = dist::ProcessGroup::create(store, rank, run.world, o);
  auto net = std::make_shared<Net>(run.initSeed + static_cast<uint64_t>(rank));
  FullyShardedDataParallel f(net, pg,
                             {.strategy = run.strategy,
                              .autoWrapPolicy = wrapModuleTypes({"Block"}),
                              .nodeId = run.ranksPerNode > 0 ? fmt::format("node{}", rank / run.ranksPerNode)
                                                             : std::string()});
  auto opt = makeOptimizer(/*adamw=*/true, f.parameters());
  optim::CosineWithWarmup sched(*opt, {.warmupSteps = 2, .totalSteps = kSteps, .minLr = 1e-3});
  Generator dataGen(7);
  auto dataset = std::make_shared<data::TensorDataset>(randn({16, 6}, {}, &dataGen), randn({16, 3}, {}, &dataGen));
  data::DataLoader loader(dataset,
                          {.batchSize = 2,
                           .shuffle = true,
                           .sampler = data::DistributedSampler({.rank = rank, .worldSize = run.world, .seed = 5})});
  Generator noise(run.sameRngOnEveryRank ? 100 : 100 + static_cast<uint64_t>(rank));

  std::string report;
  for (const std::string& d : run.tryLoads) {
    try {
      loadTrainingCheckpoint(f, d,
                             {.optimizer = opt.get(), .scheduler = &sched, .loader = &loader, .generator = &noise});
      report += fmt::format("{}|loaded\n", fs::path(d).filename().string());
    } catch (const CheckpointError& e) {
      report += fmt::format("{}|CheckpointError|{}\n", fs::path(d).filename().string(), e.what());
    }
  }
  if (!run.tryLoads.empty()) return report;

  int64_t step = 0;
  if (!run.load.empty()) {
    try {
      io::TrainingState st =
          loadTrainingCheckpoint(f, run.load,
                                 {.optimizer = opt.get(), .scheduler = &sched, .loader = &loader, .generator = &noise});
      step = st.step;
      report += fmt::format("loaded {}|", step);
    } catch (const CheckpointError& e) {
      return report + "CheckpointError|" + e.what();
    }
  }
  while (step < run.steps) {
    for (auto& b : loader) {
      Tensor x = b.data + randn(b.data.sizes(), {}, &noise) * 0.1;
      opt->zeroGrad();
      F::mseLoss(f(x), b.target).backward();
      opt->step();
      sched.step();
      ++step;
      for (const auto& [at, folder] : run.saves) {
        if (at != step) continue;
        io::TrainingState st{.scheduler = sched.state(),
                             .step = step,
                             .dataPosition = loader.position(),
                             .generators = {{"cpu", noise.state()}}};
        TrainingCheckpointOptions opts;
        opts.onStage = [&](SaveStage s) {
          if (rank == run.killRank && s == run.killStage && step == run.killStep) raise(SIGKILL);
        };
        try {
          saveTrainingCheckpoint(f, folder, opt.get(), st, opts);
        } catch (const DistError& e) {
          return report + "DistError|" + e.what();
        }
      }
      if (step >= run.steps) break;
    }
  }
  // The outcome: the full parameters, and this rank's shards and optimizer state.
  io::TensorDict out;
  for (const auto& [k, v] : fullStateDict(f)) out.insert("full/" + k, v);
  for (size_t u = 0; u < f.numUnits(); ++u) out.insert(fmt::format("shard/{}", u), f.unit(u).shard().detach());
  for (const auto& [k, v] : opt->stateDict().tensors) out.insert("optim/" + k, v);
  io::saveSafetensors(outputFile(dir, run.name, rank), out);
  return report + "done";
}

std::vector<ChildResult> runWorld(const TempDir& tmp, const WorldRun& run) {
  const std::string dir = tmp.path().string();
  return runForkedIn(dir, run.world, 120s, [&](int rank, std::ostream& report) {
    report << rankBody(dir, run, rank);
    return 0;
  });
}

// Every rank finished its body (no hang, no crash) and reported `suffix` last.
void expectAllReport(const std::vector<ChildResult>& results, const std::string& suffix, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].killedByWatchdog) << what << ": rank " << r << " hung: " << results[r].report;
    EXPECT_TRUE(WIFEXITED(results[r].status) && WEXITSTATUS(results[r].status) == 0)
        << what << ": rank " << r << " ended with " << describeStatus(results[r].status) << ": " << results[r].report;
    EXPECT_TRUE(results[r].report.ends_with(suffix)) << what << ": rank " << r << ": " << results[r].report;
  }
}

// Bitwise equality of two ranks' output files.
void expectSameOutput(const std::string& a, const std::string& b, const std::string& what) {
  io::SafetensorsContents x = io::loadSafetensors(a), y = io::loadSafetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << what;
  for (const auto& [k, t] : x.tensors) {
    const Tensor* u = y.tensors.find(k);
    ASSERT_NE(u, nullptr) << what << ": " << k;
    ASSERT_EQ(t.sizes(), u->sizes()) << what << ": " << k;
    ASSERT_EQ(t.dtype(), u->dtype()) << what << ": " << k;
    EXPECT_EQ(std::memcmp(t.dataPtr(), u->dataPtr(), t.nbytes()), 0) << what << ": " << k << " differs";
  }
}

std::vector<std::string> stepFolders(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("step-")) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

std::string onlyFolderOfStep(const std::string& dir, int step) {
  std::string found;
  for (const std::string& f : stepFolders(dir))
    if (f.starts_with(fmt::format("step-{}-", step))) found = (fs::path(dir) / f).string();
  EXPECT_FALSE(found.empty()) << "no folder of step " << step << " in " << dir;
  return found;
}

TEST(FSDPTrainingCheckpoint, ARankKilledAtAnyStageOfASaveResumesConsistentlyAndBitwiseExact) {
  if (!dist::hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string base = tmp.path().string();

  // The uninterrupted run, saving after steps 2, 4 and 6.
  WorldRun ref{.name = "reference", .saves = {{2, base + "/ref"}, {4, base + "/ref"}, {6, base + "/ref"}}};
  expectAllReport(runWorld(tmp, ref), "done", "the uninterrupted run");
  // A committed save leaves the manifest and its own folder, nothing else.
  EXPECT_EQ(stepFolders(base + "/ref").size(), 1u);
  EXPECT_TRUE(onlyFolderOfStep(base + "/ref", 6).size() > 0);

  struct Case {
    SaveStage stage;
    int rank;
    int expected;  // the step the resume must load; -1: either 2 or 4 (the survivors race the commit)
  };
  // Killed in the save after step 4; the previous checkpoint is of step 2.
  const std::vector<Case> cases = {
      {SaveStage::BeforeParts, 0, 2},     {SaveStage::BeforeParts, 1, 2}, {SaveStage::PartsWritten, 0, 2},
      {SaveStage::PartsWritten, 1, 2},    {SaveStage::PartsAgreed, 0, 2}, {SaveStage::PartsAgreed, 1, -1},
      {SaveStage::ManifestWritten, 0, 4},
  };
  for (const Case& c : cases) {
    const std::string what = fmt::format("rank {} killed at {}", c.rank, saveStageName(c.stage));
    SCOPED_TRACE(what);
    const std::string tag = fmt::format("{}-{}", saveStageName(c.stage), c.rank);
    const std::string ckpt = base + "/ckpt-" + tag;
    WorldRun crash{.name = "crash-" + tag,
                   .saves = {{2, ckpt}, {4, ckpt}, {6, ckpt}},
                   .killRank = c.rank,
                   .killStage = c.stage,
                   .killStep = 4};
    auto crashed = runWorld(tmp, crash);
    for (int r = 0; r < 2; ++r) {
      EXPECT_FALSE(crashed[r].killedByWatchdog) << "rank " << r << " hung: " << crashed[r].report;
      if (r == c.rank) {
        EXPECT_TRUE(WIFSIGNALED(crashed[r].status) && WTERMSIG(crashed[r].status) == SIGKILL)
            << "rank " << r << " should have died: " << describeStatus(crashed[r].status) << " " << crashed[r].report;
      } else {
        // The survivor's save failed in a collective (it never returns as if the save had worked).
        EXPECT_TRUE(crashed[r].report.starts_with("DistError|")) << "rank " << r << ": " << crashed[r].report;
      }
    }
    ASSERT_TRUE(hasTrainingCheckpoint(ckpt));

    // A fresh world with other initial weights resumes from whatever the folder holds.
    WorldRun resume{.name = "resume-" + tag, .saves = {{4, ckpt}, {6, ckpt}}, .load = ckpt, .initSeed = 1234};
    auto resumed = runWorld(tmp, resume);
    expectAllReport(resumed, "done", what + ", resumed");
    int loaded = -1;
    std::sscanf(resumed[0].report.c_str(), "loaded %d|", &loaded);
    std::cout << what << ": the resume loaded step " << loaded << "\n";
    if (c.expected >= 0) EXPECT_EQ(loaded, c.expected) << resumed[0].report;
    else EXPECT_TRUE(loaded == 2 || loaded == 4) << resumed[0].report;
    EXPECT_TRUE(resumed[1].report.starts_with(fmt::format("loaded {}|", loaded))) << resumed[1].report;
    for (int r = 0; r < 2; ++r)
      expectSameOutput(outputFile(base, "reference", r), outputFile(base, resume.name, r),
                       fmt::format("{}: rank {} after the resume vs the uninterrupted run", what, r));
    // The resumed run's saves removed whatever the crash had left.
    EXPECT_EQ(stepFolders(ckpt).size(), 1u) << fmt::format("{}", fmt::join(stepFolders(ckpt), ", "));
  }
}

TEST(FSDPTrainingCheckpoint, SavedByTwoRanksLoadsOnThreeWhenTheRankStatesAreTheSame) {
  if (!dist::hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string base = tmp.path().string();
  WorldRun save{.name = "two", .steps = 4, .saves = {{4, base + "/ckpt"}}, .sameRngOnEveryRank = true};
  expectAllReport(runWorld(tmp, save), "done", "2 ranks saving");
  std::ifstream manifest(base + "/ckpt/manifest.json");
  std::stringstream text;
  text << manifest.rdbuf();
  EXPECT_NE(text.str().find("\"rank_states\": \"identical\""), std::string::npos) << text.str();

  WorldRun load{.name = "three", .world = 3, .steps = 4, .load = base + "/ckpt", .initSeed = 1234};
  auto results = runWorld(tmp, load);
  expectAllReport(results, "loaded 4|done", "3 ranks loading");
  io::SafetensorsContents a = io::loadSafetensors(outputFile(base, "two", 0));
  io::SafetensorsContents b = io::loadSafetensors(outputFile(base, "three", 2));
  int compared = 0;
  for (const auto& [k, t] : a.tensors) {
    if (!k.starts_with("full/")) continue;
    const Tensor& u = b.tensors.at(k);
    ASSERT_EQ(t.sizes(), u.sizes()) << k;
    EXPECT_EQ(std::memcmp(t.dataPtr(), u.dataPtr(), t.nbytes()), 0) << k << " differs after loading on 3 ranks";
    ++compared;
  }
  EXPECT_EQ(compared, 16);  // inp, three blocks of two layers, head: weight and bias each
}

TEST(FSDPTrainingCheckpoint, NoShardAndHybridShardCheckpointsResumeExactly) {
  if (!dist::hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string base = tmp.path().string();
  struct Case {
    const char* name;
    ShardingStrategy strategy;
    int world, ranksPerNode, shards;
  };
  for (const Case& c :
       {Case{"no-shard", ShardingStrategy::NoShard, 2, 0, 1}, Case{"hybrid", ShardingStrategy::HybridShard, 4, 2, 2}}) {
    SCOPED_TRACE(c.name);
    const std::string ckpt = base + "/" + c.name;
    WorldRun ref{.name = std::string(c.name) + "-ref",
                 .world = c.world,
                 .steps = 4,
                 .saves = {{2, ckpt}},
                 .strategy = c.strategy,
                 .ranksPerNode = c.ranksPerNode};
    expectAllReport(runWorld(tmp, ref), "done", "the uninterrupted run");
    // One shard file per shard (only the first replica writes them), one state file per rank.
    const std::string folder = onlyFolderOfStep(ckpt, 2);
    for (int i = 0; i < c.shards; ++i)
      EXPECT_TRUE(fs::exists(fmt::format("{}/shard-{}-of-{}.safetensors", folder, i, c.shards)));
    for (int r = 0; r < c.world; ++r)
      EXPECT_TRUE(fs::exists(fmt::format("{}/state-{}-of-{}.safetensors", folder, r, c.world)));
    EXPECT_EQ(static_cast<int>(std::distance(fs::directory_iterator(folder), fs::directory_iterator())),
              c.shards + c.world);
    WorldRun resume{.name = std::string(c.name) + "-resume",
                    .world = c.world,
                    .steps = 4,
                    .load = ckpt,
                    .initSeed = 1234,
                    .strategy = c.strategy,
                    .ranksPerNode = c.ranksPerNode};
    expectAllReport(runWorld(tmp, resume), "loaded 2|done", "the resume");
    for (int r = 0; r < c.world; ++r)
      expectSameOutput(outputFile(base, ref.name, r), outputFile(base, resume.name, r),
                       fmt::format("rank {} after the resume vs the uninterrupted run", r));
  }
}

void flipByte(const std::string& path, std::streamoff fromEnd) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(-fromEnd, std::ios::end);
  char c = 0;
  file.read(&c, 1);
  file.seekp(-fromEnd, std::ios::end);
  c ^= 0x10;
  file.write(&c, 1);
}

TEST(FSDPTrainingCheckpoint, BadFoldersAreCheckpointErrorsNamingTheFileOnEveryRank) {
  if (!dist::hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir tmp;
  const std::string base = tmp.path().string();
  // Step 2 into a/, step 4 into b/ and c/ (two saves of one step), ranks with their own RNG streams.
  WorldRun save{.name = "save", .steps = 4, .saves = {{2, base + "/a"}, {4, base + "/b"}, {4, base + "/c"}}};
  expectAllReport(runWorld(tmp, save), "done", "saving");
  const std::string a = onlyFolderOfStep(base + "/a", 2), b = onlyFolderOfStep(base + "/b", 4),
                    c = onlyFolderOfStep(base + "/c", 4);

  // Each case is a copy of b/ with one thing wrong: name -> (what is done, what the error must say).
  std::map<std::string, std::vector<std::string>> needles;
  auto variant = [&](const std::string& name) {
    const std::string dir = base + "/" + name;
    fs::copy(base + "/b", dir, fs::copy_options::recursive);
    return std::make_pair(dir, (fs::path(dir) / fs::path(b).filename()).string());
  };
  {
    auto [dir, folder] = variant("mixed");
    fs::copy_file(a + "/shard-1-of-2.safetensors", folder + "/shard-1-of-2.safetensors",
                  fs::copy_options::overwrite_existing);
    needles["mixed"] = {folder + "/shard-1-of-2.safetensors' is from step 2, the manifest '" + dir +
                        "/manifest.json' from step 4"};
  }
  {
    auto [dir, folder] = variant("same-step-other-save");
    fs::copy_file(c + "/state-0-of-2.safetensors", folder + "/state-0-of-2.safetensors",
                  fs::copy_options::overwrite_existing);
    needles["same-step-other-save"] = {folder + "/state-0-of-2.safetensors' is from another save of step 4"};
  }
  {
    auto [dir, folder] = variant("truncated-manifest");
    fs::resize_file(dir + "/manifest.json", fs::file_size(dir + "/manifest.json") / 2);
    needles["truncated-manifest"] = {dir + "/manifest.json': not valid JSON"};
  }
  {
    auto [dir, folder] = variant("corrupt-manifest");
    std::ifstream in(dir + "/manifest.json");
    std::stringstream ss;
    ss << in.rdbuf();
    in.close();
    std::string text = ss.str();
    const size_t at = text.find("\"bytes\": ");
    ASSERT_NE(at, std::string::npos) << text;
    text.insert(at + 9, "1");  // still valid JSON, another size
    std::ofstream(dir + "/manifest.json", std::ios::trunc) << text;
    needles["corrupt-manifest"] = {dir + "/manifest.json': its checksum", "does not match its contents"};
  }
  {
    auto [dir, folder] = variant("missing-part");
    fs::remove(folder + "/state-1-of-2.safetensors");
    needles["missing-part"] = {folder + "/state-1-of-2.safetensors' is missing"};
  }
  {
    auto [dir, folder] = variant("damaged-part");
    flipByte(folder + "/shard-0-of-2.safetensors", 5);
    needles["damaged-part"] = {folder + "/shard-0-of-2.safetensors' does not match the manifest", "changed or damaged"};
  }
  {
    auto [dir, folder] = variant("truncated-part");
    fs::resize_file(folder + "/shard-1-of-2.safetensors", fs::file_size(folder + "/shard-1-of-2.safetensors") - 8);
    needles["truncated-part"] = {folder + "/shard-1-of-2.safetensors' is damaged"};
  }
  {
    auto [dir, folder] = variant("no-manifest");
    fs::remove(dir + "/manifest.json");
    needles["no-manifest"] = {"'" + dir + "': no manifest.json in it"};
  }

  std::vector<std::string> dirs;
  for (const auto& [name, n] : needles) dirs.push_back(base + "/" + name);
  dirs.push_back(base + "/b");  // and the intact one loads after all of them: the ranks stayed in step
  WorldRun load{.name = "load", .tryLoads = dirs, .initSeed = 1234};
  auto results = runWorld(tmp, load);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(results[r].killedByWatchdog) << "rank " << r << " hung: " << results[r].report;
    std::map<std::string, std::string> got;
    std::istringstream lines(results[r].report);
    for (std::string line; std::getline(lines, line);) got[line.substr(0, line.find('|'))] = line;
    for (const auto& [name, ns] : needles) {
      ASSERT_TRUE(got.count(name)) << "rank " << r << " " << name << ": " << results[r].report;
      const std::string& line = got[name];
      EXPECT_TRUE(line.starts_with(name + "|CheckpointError|")) << "rank " << r << ": " << line;
      for (const std::string& n : ns) EXPECT_NE(line.find(n), std::string::npos) << "rank " << r << ": " << line;
    }
    EXPECT_EQ(got["b"], "b|loaded") << "rank " << r;
  }

  // Per-rank training states (each rank its own RNG stream) cannot go to another number of ranks.
  WorldRun one{.name = "one", .world = 1, .load = base + "/b"};
  auto single = runWorld(tmp, one);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_TRUE(single[0].report.starts_with("CheckpointError|")) << single[0].report;
  EXPECT_NE(single[0].report.find("saved by 2 ranks whose training states"), std::string::npos) << single[0].report;
  EXPECT_NE(single[0].report.find("resume on 2 ranks"), std::string::npos) << single[0].report;
}

}  // namespace
}  // namespace cohort::fsdp::testing
