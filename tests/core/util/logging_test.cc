// Logging (core/util/logging.h): levels, lazy formatting, the prefix, whole lines from many
// threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <cohort/core/util/logging.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

namespace {
class LogLevelRestore {
 public:
  LogLevelRestore() : saved_(logging::level()) {}
  ~LogLevelRestore() {
    logging::setLevel(saved_);
    logging::setPrefix("");
  }

 private:
  logging::Level saved_;
};
}  // namespace

TEST(Logging, LevelsFilterMessages) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Warning);
  EXPECT_EQ(logging::level(), logging::Level::Warning);
  EXPECT_FALSE(logging::enabled(logging::Level::Debug));
  EXPECT_FALSE(logging::enabled(logging::Level::Info));
  EXPECT_TRUE(logging::enabled(logging::Level::Warning));
  EXPECT_TRUE(logging::enabled(logging::Level::Error));

  ::testing::internal::CaptureStderr();
  COHORT_LOG(Debug, "hidden debug {}", 1);
  COHORT_LOG(Info, "hidden info {}", 2);
  COHORT_LOG(Warning, "shown warning {}", 3);
  COHORT_LOG(Error, "shown error {}", 4);
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(out, "hidden")) << out;
  EXPECT_TRUE(contains(out, "shown warning 3")) << out;
  EXPECT_TRUE(contains(out, "shown error 4")) << out;
  EXPECT_TRUE(contains(out, "logging_test.cc:")) << out;  // the call site
  EXPECT_TRUE(contains(out, "[cohort W ")) << out;
  EXPECT_TRUE(contains(out, "[cohort E ")) << out;

  logging::setLevel(logging::Level::Debug);
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Debug, "now shown {}", 5);
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(out, "[cohort D ")) << out;
  EXPECT_TRUE(contains(out, "now shown 5")) << out;

  logging::setLevel(logging::Level::Off);
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Error, "silenced");
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
}

TEST(Logging, DisabledMessagesAreNotFormatted) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Error);
  int evaluated = 0;
  auto costly = [&] { return ++evaluated; };
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Info, "value {}", costly());
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(out, "");
}

TEST(Logging, PrefixAndWholeLinesFromManyThreads) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Info);
  logging::setPrefix("rank 3");
  constexpr int kThreads = 4, kLines = 50;
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) COHORT_LOG(Info, "thread {} line {} end", t, i);
    });
  for (auto& th : threads) th.join();
  std::string out = ::testing::internal::GetCapturedStderr();
  // Every line is whole: it starts with the tag, carries the prefix and ends with "end".
  int lines = 0;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string line = out.substr(pos, nl - pos);
    EXPECT_EQ(line.rfind("[cohort I ", 0), 0u) << line;
    EXPECT_TRUE(contains(line, " rank 3 ")) << line;
    EXPECT_EQ(line.substr(line.size() - 4), " end") << line;
    ++lines;
    pos = nl + 1;
  }
  EXPECT_EQ(lines, kThreads * kLines);
}
