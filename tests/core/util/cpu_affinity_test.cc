// util::cpuSlice shares a node's CPUs out among its local ranks (equal contiguous slices, disjoint,
// covering every CPU; ranks wrap around when there are fewer CPUs than ranks), cpuListString
// writes the kernel's cpulist format, and bindToCpus binds the calling thread (and the threads it
// starts) or says why not.
#include <gtest/gtest.h>

#include <sched.h>

#include <set>
#include <thread>
#include <vector>

#include <cohort/core/util/cpu_affinity.h>
#include <cohort/core/util/error.h>

#include "core/test_util.h"

using namespace cohort;
using cohort::testing::expectError;

TEST(CpuAffinity, SlicesAreEqualContiguousDisjointAndCoverEveryCpu) {
  const std::vector<int> cpus{0, 1, 2, 3, 8, 9, 10};  // not consecutive, as a cpuset may be
  for (int size = 1; size <= 7; ++size) {
    std::vector<int> all;
    size_t smallest = 100, largest = 0;
    for (int r = 0; r < size; ++r) {
      auto s = util::cpuSlice(cpus, r, size);
      smallest = std::min(smallest, s.size());
      largest = std::max(largest, s.size());
      all.insert(all.end(), s.begin(), s.end());
    }
    EXPECT_EQ(all, cpus) << size << " ranks: every CPU once, in order";
    EXPECT_LE(largest - smallest, 1u) << size << " ranks";
  }
  EXPECT_EQ(util::cpuSlice(cpus, 0, 3), (std::vector<int>{0, 1, 2}));  // 7 = 3 + 2 + 2
  EXPECT_EQ(util::cpuSlice(cpus, 1, 3), (std::vector<int>{3, 8}));
  EXPECT_EQ(util::cpuSlice(cpus, 2, 3), (std::vector<int>{9, 10}));
  EXPECT_EQ(util::cpuSlice({4, 5}, 1, 2), (std::vector<int>{5}));
}

TEST(CpuAffinity, MoreRanksThanCpusShareThemOneCpuEach) {
  const std::vector<int> cpus{2, 5};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(util::cpuSlice(cpus, r, 5), (std::vector<int>{cpus[r % 2]})) << r;
}

TEST(CpuAffinity, BadArgumentsAreValueErrors) {
  expectError<ValueError>([] { util::cpuSlice({0, 1}, 0, 0); }, {"local world size must be at least 1", "0"});
  expectError<ValueError>([] { util::cpuSlice({0, 1}, 2, 2); }, {"local rank 2 is outside [0, 2)"});
  expectError<ValueError>([] { util::cpuSlice({0, 1}, -1, 2); }, {"local rank -1"});
  expectError<ValueError>([] { util::cpuSlice({}, 0, 1); }, {"no CPUs"});
  expectError<ValueError>([] { util::bindToCpus({}); }, {"no CPUs given"});
  expectError<ValueError>([] { util::bindToCpus({-1}); }, {"CPU -1 is outside"});
  expectError<ValueError>([] { util::bindToCpus({1 << 20}); }, {"CPU 1048576 is outside"});
  expectError<ValueError>([] { util::cpuSet({}); }, {"cpuSet", "no CPUs given"});
  const cpu_set_t set = util::cpuSet({1, 3, 3});
  EXPECT_EQ(CPU_COUNT(&set), 2);
  EXPECT_TRUE(CPU_ISSET(1, &set) && CPU_ISSET(3, &set));
}

TEST(CpuAffinity, ListStringIsTheKernelsFormat) {
  EXPECT_EQ(util::cpuListString({0}), "0");
  EXPECT_EQ(util::cpuListString({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(util::cpuListString({3, 1, 2, 2}), "1-3");  // sorted, duplicates once
  EXPECT_EQ(util::cpuListString({}), "");
}

// Binding a thread to one allowed CPU holds for it and for a thread it starts afterwards; the
// previous set is restored at the end. A CPU the process may not use is refused with the kernel's
// reason, and the binding is unchanged.
TEST(CpuAffinity, BindingHoldsForTheThreadAndTheThreadsItStarts) {
  std::thread([] {
    const std::vector<int> before = util::allowedCpus();
    ASSERT_FALSE(before.empty());
    const int last = before.back();
    util::bindToCpus({last});
    EXPECT_EQ(util::allowedCpus(), std::vector<int>{last});
    std::vector<int> child;
    std::thread([&] { child = util::allowedCpus(); }).join();
    EXPECT_EQ(child, std::vector<int>{last});
    // A CPU beyond every one this machine has (but inside the kernel's set size).
    expectError<Error>([&] { util::bindToCpus({CPU_SETSIZE - 1}); }, {"refused CPUs", "1023"});
    EXPECT_EQ(util::allowedCpus(), std::vector<int>{last});
    util::bindToCpus(before);
    EXPECT_EQ(util::allowedCpus(), before);
  }).join();
}
