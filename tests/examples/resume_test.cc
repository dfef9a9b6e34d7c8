// Exact resume: training 20 steps in one process equals training 10, checkpointing,
// and training 10 more in a fresh process from that checkpoint — bit for bit, for every tensor of
// the model and the optimizer. Runs the real examples/train_gpt binary (its path is compiled in by
// tests/CMakeLists.txt; COHORT_TRAIN_GPT overrides it) with a tiny model so it takes seconds. The
// same holds for train_gpt --fsdp on 2 ranks under cohortrun, whose checkpoint is an FSDP
// training checkpoint (fsdp/training_checkpoint.h): every shard file's tensors match.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/safetensors.h>

using namespace cohort;
namespace fs = std::filesystem;

namespace {

std::string binary() {
  if (const char* p = std::getenv("COHORT_TRAIN_GPT")) return p;
#ifdef COHORT_TRAIN_GPT_PATH
  return COHORT_TRAIN_GPT_PATH;
#else
  return "";
#endif
}

int run(const std::string& args, const std::string& launcher = "") {
  std::string cmd = launcher + binary() +
                    " --layers 1 --heads 2 --embd 16 --block-size 16 --batch-size 4 --warmup 3 "
                    "--log-interval 5 --sample-tokens 0 --dropout 0.1 " +
                    args + " > /dev/null";
  return std::system(cmd.c_str());
}

template <typename Dict>
std::map<std::string, Tensor> toMap(const Dict& d) {
  std::map<std::string, Tensor> m;
  for (const auto& [k, v] : d) m.emplace(k, v);
  return m;
}

template <typename Dict>
void expectSameDict(const Dict& da, const Dict& db, const std::string& what) {
  auto a = toMap(da), b = toMap(db);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << what << ": " << k;
    const Tensor& w = b.at(k);
    ASSERT_EQ(v.sizes(), w.sizes()) << what << ": " << k;
    ASSERT_EQ(v.dtype(), w.dtype()) << what << ": " << k;
    auto x = v.contiguous(), y = w.contiguous();
    EXPECT_EQ(std::memcmp(x.dataPtr(), y.dataPtr(), x.nbytes()), 0) << what << ": " << k << " differs";
  }
}

}  // namespace

TEST(ExactResume, TwentyStepsEqualTenPlusTenInAFreshProcess) {
  if (binary().empty()) GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
  fs::path dir = fs::temp_directory_path() / fmt::format("cohort_resume_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string whole = (dir / "whole.ckpt").string(), split = (dir / "split.ckpt").string();

  ASSERT_EQ(run("--steps 20 --checkpoint " + whole + " --checkpoint-every 100"), 0);
  // First process: the schedule spans 20 steps but the run stops after 10 with a checkpoint; a
  // second process resumes from it and runs to 20.
  ASSERT_EQ(run("--steps 20 --stop-after 10 --checkpoint " + split + " --checkpoint-every 10"), 0);
  io::TrainingState mid = io::loadCheckpoint(split);
  EXPECT_EQ(mid.step, 10);
  ASSERT_EQ(run("--steps 20 --checkpoint " + split + " --checkpoint-every 100 --resume"), 0);

  io::TrainingState a = io::loadCheckpoint(whole), b = io::loadCheckpoint(split);
  EXPECT_EQ(a.step, 20);
  EXPECT_EQ(b.step, 20);
  expectSameDict(a.model, b.model, "model");
  ASSERT_TRUE(a.optimizer && b.optimizer);
  expectSameDict(a.optimizer->tensors, b.optimizer->tensors, "optimizer");
  EXPECT_EQ(a.dataPosition, b.dataPosition);
  EXPECT_EQ(a.generators.at("cpu"), b.generators.at("cpu"));
  fs::remove_all(dir);
}

// The one step folder of an FSDP training checkpoint (the save after the last step removed the others).
fs::path stepFolder(const std::string& ckpt) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(ckpt))
    if (e.is_directory()) found.push_back(e.path());
  EXPECT_EQ(found.size(), 1u) << ckpt;
  return found.empty() ? fs::path(ckpt) : found[0];
}

TEST(ExactResume, FsdpOnTwoRanksTwentyStepsEqualTenPlusTen) {
#ifdef COHORTRUN_PATH
  if (binary().empty()) GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
  const std::string launch = std::string(COHORTRUN_PATH) + " --standalone --nproc-per-node 2 ";
  fs::path dir = fs::temp_directory_path() / fmt::format("cohort_resume_fsdp_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string whole = (dir / "whole.ckpt").string(), split = (dir / "split.ckpt").string();
  const std::string common = "--fsdp --backend gloo --steps 20 --checkpoint-every 10 --checkpoint ";
  ASSERT_EQ(run(common + whole, launch), 0);
  ASSERT_EQ(run(common + split + " --stop-after 10", launch), 0);
  EXPECT_NE(stepFolder(split).filename().string().find("step-10-"), std::string::npos) << stepFolder(split);
  ASSERT_EQ(run(common + split + " --resume", launch), 0);
  for (const char* shard : {"shard-0-of-2.safetensors", "shard-1-of-2.safetensors"}) {
    io::SafetensorsContents a = io::loadSafetensors((stepFolder(whole) / shard).string());
    io::SafetensorsContents b = io::loadSafetensors((stepFolder(split) / shard).string());
    EXPECT_NE(stepFolder(whole).filename().string().find("step-20-"), std::string::npos);
    EXPECT_GT(a.tensors.size(), 10u);
    expectSameDict(a.tensors, b.tensors, shard);
  }
  for (const char* state : {"state-0-of-2.safetensors", "state-1-of-2.safetensors"}) {
    io::TrainingState a = io::loadCheckpoint((stepFolder(whole) / state).string());
    io::TrainingState b = io::loadCheckpoint((stepFolder(split) / state).string());
    EXPECT_EQ(a.step, 20);
    EXPECT_EQ(b.step, 20);
    EXPECT_EQ(a.dataPosition, b.dataPosition);
    EXPECT_EQ(a.generators.at("cpu"), b.generators.at("cpu"));
  }
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "cohortrun is not built";
#endif
}

// Mixed precision under DDP on 2 ranks: train_gpt --amp bf16 and --amp fp16 (with its GradScaler,
// whose state rides in the checkpoint) resume exactly too.
TEST(ExactResume, AmpUnderDdpOnTwoRanksTwentyStepsEqualTenPlusTen) {
#ifdef COHORTRUN_PATH
  if (binary().empty()) GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
  const std::string launch = std::string(COHORTRUN_PATH) + " --standalone --nproc-per-node 2 ";
  for (const char* amp : {"bf16", "fp16"}) {
    SCOPED_TRACE(amp);
    fs::path dir = fs::temp_directory_path() / fmt::format("cohort_resume_amp_{}_{}", amp, ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string whole = (dir / "whole.ckpt").string(), split = (dir / "split.ckpt").string();
    const std::string common = fmt::format("--ddp --backend gloo --amp {} --steps 20 --checkpoint ", amp);
    ASSERT_EQ(run(common + whole + " --checkpoint-every 100", launch), 0);
    ASSERT_EQ(run(common + split + " --stop-after 10 --checkpoint-every 10", launch), 0);
    io::TrainingState mid = io::loadCheckpoint(split);
    EXPECT_EQ(mid.step, 10);
    EXPECT_EQ(mid.gradScaler.has_value(), std::string(amp) == "fp16");
    ASSERT_EQ(run(common + split + " --checkpoint-every 100 --resume", launch), 0);
    io::TrainingState a = io::loadCheckpoint(whole), b = io::loadCheckpoint(split);
    EXPECT_EQ(b.step, 20);
    expectSameDict(a.model, b.model, "model");
    ASSERT_TRUE(a.optimizer && b.optimizer);
    expectSameDict(a.optimizer->tensors, b.optimizer->tensors, "optimizer");
    if (std::string(amp) == "fp16") {
      ASSERT_TRUE(a.gradScaler && b.gradScaler);
      EXPECT_EQ(*a.gradScaler, *b.gradScaler);
    }
    fs::remove_all(dir);
  }
#else
  GTEST_SKIP() << "cohortrun is not built";
#endif
}

// --device: a device this machine cannot give is refused by name before anything trains (without a
// GPU here; on a GPU machine scripts/gpu_tests.sh trains with --device cuda instead).
TEST(TrainGpt, ADeviceItCannotUseIsRefusedByName) {
  const fs::path out = fs::temp_directory_path() / fmt::format("cohort_train_gpt_device_{}.txt", ::getpid());
  auto errorOf = [&](const std::string& device) {
    const std::string cmd =
        binary() + " --steps 2 --warmup 1 --sample-tokens 0 --device " + device + " > " + out.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::pair{status, text};
  };
  auto [badStatus, bad] = errorOf("tpu");
  EXPECT_NE(badStatus, 0);
  EXPECT_NE(bad.find("'tpu' is not a device (expected cpu, cuda or cuda:N)"), std::string::npos) << bad;
  if (cuda::isAvailable()) {
    auto [status, text] = errorOf(fmt::format("cuda:{}", cuda::deviceCount()));
    EXPECT_NE(status, 0);
    EXPECT_NE(text.find("CUDA device(s), cuda:0..cuda:"), std::string::npos) << text;
  } else {
    auto [status, text] = errorOf("cuda");
    EXPECT_NE(status, 0);
    EXPECT_NE(text.find("train_gpt: --device cuda: no CUDA device is visible"), std::string::npos) << text;
    EXPECT_EQ(text.find("train_gpt:  "), std::string::npos);
  }
  // The CPU, named, trains as the default does.
  auto [okStatus, ok] = errorOf("cpu");
  EXPECT_EQ(okStatus, 0) << ok;
  EXPECT_NE(ok.find("validation loss: "), std::string::npos) << ok;
  fs::remove(out);
}
