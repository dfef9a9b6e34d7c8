// COHORT_CHECK* (core/util/check.h): the message, its repository-relative location, both values
// of a comparison, typed checks.
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

#include <cohort/core/util/check.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

TEST(Check, MessageHasTextConditionAndLocation) {
  int line = 0;
  std::string msg = messageOf<Error>([&] {
    line = __LINE__ + 1;
    COHORT_CHECK(1 + 1 == 3, "arithmetic is broken: {} and {}", 2, "three");
  });
  EXPECT_TRUE(contains(msg, "arithmetic is broken: 2 and three")) << msg;
  EXPECT_TRUE(contains(msg, "1 + 1 == 3")) << msg;
  EXPECT_TRUE(contains(msg, "tests/core/util/check_test.cc:" + std::to_string(line))) << msg;

  msg = messageOf<Error>([] { COHORT_CHECK(false); });
  EXPECT_TRUE(contains(msg, "check failed")) << msg;
  EXPECT_TRUE(contains(msg, "check_test.cc:")) << msg;

  EXPECT_NO_THROW(COHORT_CHECK(true, "never formatted {}", 1));
}

TEST(Check, LocationOfAnInstalledHeaderIsRepositoryRelative) {
  // cohort's own paths arrive repository-relative (the build maps them); a check inside an
  // installed header compiled by a user's project arrives as that compiler found the header.
  EXPECT_EQ(detail::checkLocation("x", "core/tensor/tensor.cc", 7), " [x; at core/tensor/tensor.cc:7]");
  EXPECT_EQ(detail::checkLocation("x", "/opt/cohort/include/cohort/core/tensor/tensor.h", 3),
            " [x; at core/tensor/tensor.h:3]");
  // Anything else (a user's own COHORT_CHECK) is kept as it is.
  EXPECT_EQ(detail::checkLocation("x", "/home/me/train.cc", 9), " [x; at /home/me/train.cc:9]");
}

TEST(Check, ComparisonsPrintBothValues) {
  int a = 2, b = 3;
  int line = 0;
  std::string msg = messageOf<Error>([&] {
    line = __LINE__ + 1;
    COHORT_CHECK_EQ(a, b, "sizes differ in {}", "allgather");
  });
  EXPECT_TRUE(contains(msg, "sizes differ in allgather")) << msg;
  EXPECT_TRUE(contains(msg, "2 vs. 3")) << msg;
  EXPECT_TRUE(contains(msg, "a == b")) << msg;
  EXPECT_TRUE(contains(msg, "check_test.cc:" + std::to_string(line))) << msg;

  msg = messageOf<Error>([&] { COHORT_CHECK_LT(b, a); });
  EXPECT_TRUE(contains(msg, "3 vs. 2")) << msg;
  EXPECT_TRUE(contains(msg, "b < a")) << msg;

  std::string s1 = "left", s2 = "right";
  msg = messageOf<Error>([&] { COHORT_CHECK_EQ(s1, s2, "names"); });
  EXPECT_TRUE(contains(msg, "left vs. right")) << msg;

  EXPECT_NO_THROW(COHORT_CHECK_EQ(a, 2));
  EXPECT_NO_THROW(COHORT_CHECK_NE(a, b));
  EXPECT_NO_THROW(COHORT_CHECK_LE(a, 2));
  EXPECT_NO_THROW(COHORT_CHECK_GT(b, a));
  EXPECT_NO_THROW(COHORT_CHECK_GE(b, 3));
  EXPECT_THROW(COHORT_CHECK_GE(a, b), Error);
  EXPECT_THROW(COHORT_CHECK_NE(a, 2), Error);
  EXPECT_THROW(COHORT_CHECK_GT(a, a), Error);
  EXPECT_THROW(COHORT_CHECK_LE(b, a), Error);

  // Operands are evaluated exactly once.
  int calls = 0;
  auto next = [&] { return ++calls; };
  EXPECT_NO_THROW(COHORT_CHECK_EQ(next(), 1));
  EXPECT_EQ(calls, 1);
}

TEST(Check, TypedChecksThrowTheGivenType) {
  std::string msg = messageOf<IndexError>([] { COHORT_CHECK_T(IndexError, 5 < 3, "index {} out of range", 5); });
  EXPECT_TRUE(contains(msg, "index 5 out of range")) << msg;
  EXPECT_TRUE(contains(msg, "check_test.cc:")) << msg;
  EXPECT_THROW(COHORT_CHECK_T(NotSupportedError, false, "no"), NotSupportedError);
}
