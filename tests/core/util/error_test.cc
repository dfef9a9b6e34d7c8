// The error hierarchy (core/util/error.h): what derives from what, and messages caught through
// each base.
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

#include <cohort/core/util/error.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

TEST(Errors, Hierarchy) {
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(std::is_base_of_v<Error, ValueError>);
  static_assert(std::is_base_of_v<ValueError, IndexError>);
  static_assert(std::is_base_of_v<Error, NotSupportedError>);
  static_assert(std::is_base_of_v<Error, DistError>);
  static_assert(std::is_base_of_v<DistError, TimeoutError>);
  static_assert(std::is_base_of_v<DistError, PeerError>);
  static_assert(std::is_base_of_v<DistError, StoreError>);
  static_assert(std::is_base_of_v<Error, CheckpointError>);
  static_assert(std::is_base_of_v<Error, RpcError>);
  static_assert(!std::is_base_of_v<DistError, ValueError>);

  // Caught through each base, with the message intact.
  try {
    throw TimeoutError("allreduce #12 in group 'world' timed out waiting for ranks 1, 3");
  } catch (const DistError& e) {
    EXPECT_STREQ(e.what(), "allreduce #12 in group 'world' timed out waiting for ranks 1, 3");
  }
  EXPECT_THROW(throw TimeoutError("t"), Error);
  EXPECT_THROW(throw TimeoutError("t"), std::runtime_error);
  EXPECT_THROW(throw IndexError("i"), ValueError);
}
