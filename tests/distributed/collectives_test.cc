// The backend-neutral collectives suite (collectives_suite.h) over every backend this build
// registered that runs with ranks as threads of one process: gloo for now (MPI needs mpirun and
// has its own binary).
#include "collectives_suite.h"

namespace cohort::dist::testing {
namespace {

std::vector<std::string> threadBackends() {
  std::vector<std::string> out;
  for (const std::string& name : availableBackends())
    if (name == "gloo") out.push_back(name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(ThreadRanks, Collectives,
                         ::testing::Combine(::testing::ValuesIn(threadBackends()), ::testing::Values(1, 2, 3, 4, 5)),
                         collectivesParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Collectives);

}  // namespace
}  // namespace cohort::dist::testing
