// The backend-neutral collectives suite (collectives_suite.h) on the "fake" communicator backend:
// every op, dtype, reduction and count at world sizes 1 to 5 through the very op mapping the NCCL
// backend uses (watchdog/comm_backend.h), which a one-GPU machine can only run at world size 1.
#include "distributed/collectives_suite.h"

namespace cohort::dist::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Fake, Collectives,
                         ::testing::Combine(::testing::Values(std::string("fake")), ::testing::Values(1, 2, 3, 4, 5)),
                         collectivesParamName);

}  // namespace
}  // namespace cohort::dist::testing
