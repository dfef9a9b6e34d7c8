// Exact resume: training 20 steps in one process equals training 10, checkpointing,
// and training 10 more in a fresh process from that checkpoint — bit for bit, for every tensor of
// the model and the optimizer. Runs the real examples/train_gpt binary (its path is compiled in by
// tests/CMakeLists.txt; COHORT_TRAIN_GPT overrides it) with a tiny model so it takes seconds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include <cohort/cohort.h>
#include <cohort/core/io/checkpoint.h>

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

int run(const std::string& args) {
  std::string cmd = binary() +
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
