// The backend registry's shared pieces (distributed/backend.h): where collectives run,
// COHORT_COLLECTIVE_THREAD, and the names it replaced.
#include <gtest/gtest.h>

#include <string>

#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>

#include "distributed/env_guard.h"

using namespace cohort;
using namespace cohort::dist;

namespace {
// The variables COHORT_COLLECTIVE_THREAD was renamed from.
const char* const kRenamed[] = {"COHORT_SHM_THREAD", "COHORT_MPI_COLLECTIVE_THREAD"};  // renamed

void unsetAll(EnvGuard& env) {
  env.unset("COHORT_COLLECTIVE_THREAD");
  for (const char* renamed : kRenamed) env.unset(renamed);
}
}  // namespace

TEST(CollectiveThread, DefaultsToTheCaller) {
  EnvGuard env;
  unsetAll(env);
  EXPECT_EQ(collectiveThreadFromEnv(), CollectiveThread::Caller);
  env.set("COHORT_COLLECTIVE_THREAD", "worker");
  EXPECT_EQ(collectiveThreadFromEnv(), CollectiveThread::Worker);
  env.set("COHORT_COLLECTIVE_THREAD", "caller");
  EXPECT_EQ(collectiveThreadFromEnv(), CollectiveThread::Caller);
}

TEST(CollectiveThread, ABadValueIsAValueErrorNamingTheVariable) {
  EnvGuard env;
  unsetAll(env);
  env.set("COHORT_COLLECTIVE_THREAD", "both");
  try {
    collectiveThreadFromEnv();
    ADD_FAILURE() << "COHORT_COLLECTIVE_THREAD=both was accepted";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("COHORT_COLLECTIVE_THREAD"), std::string::npos) << msg;
    EXPECT_NE(msg.find("both"), std::string::npos) << msg;
  }
}

// The names it was renamed from are an error that names the new one, whatever their value.
TEST(CollectiveThread, TheRenamedVariablesAreAValueErrorNamingTheNewOne) {
  for (const char* renamed : kRenamed) {
    EnvGuard env;
    unsetAll(env);
    env.set(renamed, "worker");
    try {
      collectiveThreadFromEnv();
      ADD_FAILURE() << renamed << " (renamed) was accepted";
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(renamed), std::string::npos) << msg;
      EXPECT_NE(msg.find("renamed COHORT_COLLECTIVE_THREAD"), std::string::npos) << msg;
    }
  }
}
