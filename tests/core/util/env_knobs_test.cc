// Environment knobs (core/util/env.h): defaults, parsing, errors that name the variable, and the
// registry of every declaration.
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

#include <cohort/core/util/env.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

namespace {
// Each knob is read under one value only, so the test holds whether or not reads are cached.
COHORT_ENV_KNOB(kTestDefaults, "COHORT_TEST_KNOB_DEFAULTS", "17", "Test: integer default.");
COHORT_ENV_KNOB(kTestInteger, "COHORT_TEST_KNOB_INTEGER", "0", "Test: integer value.");
COHORT_ENV_KNOB(kTestBadInteger, "COHORT_TEST_KNOB_BAD_INTEGER", "0", "Test: not an integer.");
COHORT_ENV_KNOB(kTestNumber, "COHORT_TEST_KNOB_NUMBER", "0.5", "Test: a number.");
COHORT_ENV_KNOB(kTestBadNumber, "COHORT_TEST_KNOB_BAD_NUMBER", "0.5", "Test: not a number.");
COHORT_ENV_KNOB(kTestFlagOn, "COHORT_TEST_KNOB_FLAG_ON", "0", "Test: flag set.");
COHORT_ENV_KNOB(kTestFlagOff, "COHORT_TEST_KNOB_FLAG_OFF", "1", "Test: flag cleared.");
COHORT_ENV_KNOB(kTestBadFlag, "COHORT_TEST_KNOB_BAD_FLAG", "0", "Test: not a flag.");
COHORT_ENV_KNOB(kTestEmpty, "COHORT_TEST_KNOB_EMPTY", "fallback", "Test: empty means unset.");
}  // namespace

TEST(Env, DefaultsWhenUnset) {
  ::unsetenv("COHORT_TEST_KNOB_DEFAULTS");
  EXPECT_STREQ(kTestDefaults.name(), "COHORT_TEST_KNOB_DEFAULTS");
  EXPECT_FALSE(kTestDefaults.raw().has_value());
  EXPECT_EQ(kTestDefaults.str(), "17");
  EXPECT_EQ(kTestDefaults.integer(), 17);
  EXPECT_DOUBLE_EQ(kTestDefaults.number(), 17.0);

  ::setenv("COHORT_TEST_KNOB_EMPTY", "", 1);
  EXPECT_FALSE(kTestEmpty.raw().has_value());
  EXPECT_EQ(kTestEmpty.str(), "fallback");
  ::unsetenv("COHORT_TEST_KNOB_EMPTY");
}

TEST(Env, ParsesValues) {
  ::setenv("COHORT_TEST_KNOB_INTEGER", "-123456789012", 1);
  EXPECT_EQ(kTestInteger.raw().value(), "-123456789012");
  EXPECT_EQ(kTestInteger.integer(), -123456789012LL);
  ::setenv("COHORT_TEST_KNOB_NUMBER", "2.5e-3", 1);
  EXPECT_DOUBLE_EQ(kTestNumber.number(), 2.5e-3);
  ::setenv("COHORT_TEST_KNOB_FLAG_ON", "Yes", 1);
  EXPECT_TRUE(kTestFlagOn.flag());
  ::setenv("COHORT_TEST_KNOB_FLAG_OFF", "OFF", 1);
  EXPECT_FALSE(kTestFlagOff.flag());
  for (const char* v :
       {"COHORT_TEST_KNOB_INTEGER", "COHORT_TEST_KNOB_NUMBER", "COHORT_TEST_KNOB_FLAG_ON", "COHORT_TEST_KNOB_FLAG_OFF"})
    ::unsetenv(v);
}

TEST(Env, ParseErrorsNameTheVariableAndValue) {
  ::setenv("COHORT_TEST_KNOB_BAD_INTEGER", "12abc", 1);
  std::string msg = messageOf<ValueError>([] { (void)kTestBadInteger.integer(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_INTEGER")) << msg;
  EXPECT_TRUE(contains(msg, "12abc")) << msg;

  ::setenv("COHORT_TEST_KNOB_BAD_NUMBER", "fast", 1);
  msg = messageOf<ValueError>([] { (void)kTestBadNumber.number(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_NUMBER")) << msg;
  EXPECT_TRUE(contains(msg, "fast")) << msg;

  ::setenv("COHORT_TEST_KNOB_BAD_FLAG", "maybe", 1);
  msg = messageOf<ValueError>([] { (void)kTestBadFlag.flag(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_FLAG")) << msg;
  EXPECT_TRUE(contains(msg, "maybe")) << msg;
  for (const char* v : {"COHORT_TEST_KNOB_BAD_INTEGER", "COHORT_TEST_KNOB_BAD_NUMBER", "COHORT_TEST_KNOB_BAD_FLAG"})
    ::unsetenv(v);
}

TEST(Env, AllKnobsListsEveryDeclarationSorted) {
  auto knobs = env::allKnobs();
  auto find = [&](const std::string& name) -> const env::KnobInfo* {
    for (const auto& k : knobs)
      if (k.name == name) return &k;
    return nullptr;
  };
  // Declared in this file...
  const env::KnobInfo* mine = find("COHORT_TEST_KNOB_DEFAULTS");
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->defaultValue, "17");
  EXPECT_EQ(mine->description, "Test: integer default.");
  EXPECT_NE(find("COHORT_TEST_KNOB_BAD_FLAG"), nullptr);
  // ...and inside the library (logging's level).
  const env::KnobInfo* log = find("COHORT_LOG_LEVEL");
  ASSERT_NE(log, nullptr);
  EXPECT_FALSE(log->description.empty());
  for (size_t i = 1; i < knobs.size(); ++i) EXPECT_LT(knobs[i - 1].name, knobs[i].name);
}
