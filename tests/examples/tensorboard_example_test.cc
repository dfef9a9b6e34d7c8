// The examples' --tensorboard DIR: train_digits (one short epoch) and train_gpt (a few steps of a
// tiny model with --amp fp16) write an event file into DIR that TensorBoard's own reader
// (tests/core/io/read_events.py, in the virtual environment scripts/setup.sh makes) reads back:
// train/loss, train/lr and train/throughput at every progress line's step, in increasing order, the
// loss scale with fp16, and the evaluation at the end, equal to what the program printed. The
// binaries' paths are compiled in by tests/CMakeLists.txt (COHORT_TRAIN_DIGITS / COHORT_TRAIN_GPT
// override them); without the examples or the virtual environment the tests skip and say why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/test_util.h"
#include "temp_dir.h"

using cohort::testing::runCommand;
using cohort::testing::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fromEnvOr(const char* var, const char* compiled) {
  if (const char* p = std::getenv(var); p && *p) return p;
  return compiled;
}

std::string trainDigits() {
#ifdef COHORT_TRAIN_DIGITS_PATH
  return fromEnvOr("COHORT_TRAIN_DIGITS", COHORT_TRAIN_DIGITS_PATH);
#else
  return fromEnvOr("COHORT_TRAIN_DIGITS", "");
#endif
}

std::string trainGpt() {
#ifdef COHORT_TRAIN_GPT_PATH
  return fromEnvOr("COHORT_TRAIN_GPT", COHORT_TRAIN_GPT_PATH);
#else
  return fromEnvOr("COHORT_TRAIN_GPT", "");
#endif
}

// The virtual environment's python ("" and `why` when there is none).
std::string venvPython(std::string* why) {
#ifdef COHORT_PY_VENV_DEFAULT
  const std::string dir = fromEnvOr("COHORT_PY_VENV", COHORT_PY_VENV_DEFAULT);
#else
  const std::string dir = fromEnvOr("COHORT_PY_VENV", "");
#endif
  if (dir.empty() || !fs::exists(dir + "/bin/python")) {
    *why = fmt::format("no TensorBoard virtual environment at '{}' (scripts/setup.sh makes it)", dir);
    return "";
  }
  return dir + "/bin/python";
}

json readEvents(const std::string& python, const fs::path& dir) {
  const fs::path script = fs::path(COHORT_SOURCE_DIR) / "tests" / "core" / "io" / "read_events.py";
  auto [rc, out] = runCommand(fmt::format("'{}' '{}' '{}' 2>&1", python, script.string(), dir.string()));
  EXPECT_EQ(rc, 0) << out;
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  try {
    return json::parse(out.substr(start == std::string::npos ? 0 : start + 1, end + 1));
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what() << "\n" << out;
    return json::object();
  }
}

// The steps of a scalar tag (failing when it is missing or any value is not finite).
std::vector<int64_t> stepsOf(const json& events, const std::string& tag) {
  std::vector<int64_t> steps;
  if (!events["scalars"].contains(tag)) {
    ADD_FAILURE() << "no scalars under " << tag << ": " << events["scalars"].dump();
    return steps;
  }
  for (const auto& row : events["scalars"][tag]) {
    steps.push_back(row["step"].get<int64_t>());
    EXPECT_TRUE(row["value"].is_number()) << tag << " at step " << steps.back() << ": " << row.dump();
  }
  return steps;
}

double valueAt(const json& events, const std::string& tag, size_t i) {
  return events["scalars"][tag][i]["value"].get<double>();
}

}  // namespace

TEST(TensorBoardExample, TrainDigitsLogsLossLrThroughputAndAccuracy) {
  if (trainDigits().empty()) GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
  std::string why;
  const std::string python = venvPython(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const fs::path dir = tmp.path() / "runs" / "digits";
  auto [rc, out] =
      runCommand(fmt::format("'{}' --epochs 1 --log-interval 10 --tensorboard '{}' 2>&1", trainDigits(), dir.string()));
  ASSERT_EQ(rc, 0) << out;
  // The program's own output is as without the flag.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(test accuracy: ([0-9.]+)% \()"))) << out;
  EXPECT_NE(out.find("step 10/45 | epoch 1 | loss "), std::string::npos) << out;

  int files = 0;
  for (const auto& e : fs::directory_iterator(dir))
    files += e.path().filename().string().starts_with("events.out.tfevents.");
  EXPECT_EQ(files, 1);

  json ev = readEvents(python, dir);
  // One epoch of 45 steps (1,437 images, batch 32), a line every 10 steps and at the last.
  const std::vector<int64_t> want = {10, 20, 30, 40, 45};
  EXPECT_EQ(stepsOf(ev, "train/loss"), want);
  EXPECT_EQ(stepsOf(ev, "train/lr"), want);
  EXPECT_EQ(stepsOf(ev, "train/throughput"), want);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_GT(valueAt(ev, "train/loss", i), 0.0);
    EXPECT_LT(valueAt(ev, "train/loss", i), 5.0);
    EXPECT_EQ(valueAt(ev, "train/lr", i), static_cast<double>(static_cast<float>(1e-3)));
    EXPECT_GT(valueAt(ev, "train/throughput", i), 0.0);
  }
  EXPECT_LT(valueAt(ev, "train/loss", 4), valueAt(ev, "train/loss", 0));  // it learns
  ASSERT_EQ(stepsOf(ev, "eval/accuracy"), std::vector<int64_t>{45});
  EXPECT_NEAR(100.0 * valueAt(ev, "eval/accuracy", 0), std::stod(m[1].str()), 0.005 + 1e-4);
  EXPECT_FALSE(ev["scalars"].contains("train/loss_scale"));
}

TEST(TensorBoardExample, TrainGptWithFp16LogsTheLossScaleAndValidationLoss) {
  if (trainGpt().empty()) GTEST_SKIP() << "examples are not built (COHORT_BUILD_EXAMPLES=OFF)";
  std::string why;
  const std::string python = venvPython(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const fs::path dir = tmp.path() / "gpt";
  auto [rc, out] = runCommand(fmt::format(
      "'{}' --layers 1 --heads 2 --embd 16 --block-size 16 --batch-size 4 --steps 12 --warmup 3 --log-interval 5 "
      "--sample-tokens 0 --amp fp16 --tensorboard '{}' 2>&1",
      trainGpt(), dir.string()));
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(validation loss: ([0-9.]+))"))) << out;

  json ev = readEvents(python, dir);
  const std::vector<int64_t> want = {5, 10, 12};
  EXPECT_EQ(stepsOf(ev, "train/loss"), want);
  EXPECT_EQ(stepsOf(ev, "train/lr"), want);
  EXPECT_EQ(stepsOf(ev, "train/throughput"), want);
  EXPECT_EQ(stepsOf(ev, "train/loss_scale"), want);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_GT(valueAt(ev, "train/loss_scale", i), 0.0);
    EXPECT_GT(valueAt(ev, "train/throughput", i), 0.0);
    EXPECT_GT(valueAt(ev, "train/lr", i), 0.0);
  }
  ASSERT_EQ(stepsOf(ev, "eval/loss"), std::vector<int64_t>{12});
  EXPECT_NEAR(valueAt(ev, "eval/loss", 0), std::stod(m[1].str()), 0.00005 + 1e-5);
}
