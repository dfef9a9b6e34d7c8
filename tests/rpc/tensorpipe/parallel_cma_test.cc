// The cross-memory channel's factory (rpc/tensorpipe/detail/parallel_cma.h) refuses a thread count outside
// 1..64 with a cohort ValueError naming the bad value, like every other bad argument in cohort.
#include <gtest/gtest.h>

#include <string>

#include <cohort/core/util/error.h>
#include <cohort/rpc/tensorpipe/detail/parallel_cma.h>

namespace cohort::rpc {
namespace {

TEST(ParallelCmaChannel, ABadThreadCountIsAValueErrorNamingIt) {
  for (int bad : {0, -3, 65}) {
    try {
      createParallelCmaChannel(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()),
                "createParallelCmaChannel: copyThreads must be 1 to 64, got " + std::to_string(bad));
    }
  }
  EXPECT_NE(createParallelCmaChannel(2), nullptr);
}

}  // namespace
}  // namespace cohort::rpc
