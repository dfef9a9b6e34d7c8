// Guards against a GCC 12.2 miscompile seen on this project's build machines: with AVX-512 code
// generation (-march=native on an AVX-512 CPU, or -mavx512f), a default-initialised aggregate of
// std::pair fields passed by value arrives with wrong field values (padding {0,0} read as {1,0}).
// The build targets x86-64-v3 by default for this reason (CMakeLists.txt, COHORT_ARCH); this test
// fails if the build flags bring the bug back.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include <cohort/core/ops/functional.h>

namespace {

struct Opts {
  std::pair<int64_t, int64_t> stride{1, 1};
  std::pair<int64_t, int64_t> padding{0, 0};
  std::pair<int64_t, int64_t> dilation{1, 1};
  int64_t groups = 1;
};

__attribute__((noinline)) Opts passThrough(const int& /*unused*/, Opts o = {}) { return o; }

}  // namespace

TEST(Codegen, DefaultInitialisedPairAggregatesArriveIntact) {
  int x = 1;
  Opts o = passThrough(x);
  EXPECT_EQ(o.stride, (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_EQ(o.padding, (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_EQ(o.dilation, (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_EQ(o.groups, 1);
  // The same shape of struct as cohort's own option types.
  cohort::nn::functional::Conv2dOptions c;
  EXPECT_EQ(c.padding, (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_EQ(c.stride, (std::pair<int64_t, int64_t>{1, 1}));
}
