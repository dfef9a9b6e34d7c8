// The CPU allocator keeps freed large blocks for reuse (core/tensor/allocator.cc) so large tensors
// do not pay a page fault per page on every allocation. Accounting stays exact.
#include <gtest/gtest.h>

#include <cohort/cohort.h>

using namespace cohort;

TEST(CpuAllocatorCache, LargeBlocksAreReusedAndAccountedSeparately) {
  emptyCache();
  AllocatorStats before = memoryStats();
  void* first = nullptr;
  {
    Tensor t = empty({1 << 20});  // 4 MiB
    first = t.dataPtr();
    EXPECT_EQ(memoryStats().bytesLive, before.bytesLive + (4 << 20));
  }
  AllocatorStats freed = memoryStats();
  EXPECT_EQ(freed.bytesLive, before.bytesLive);    // freed memory is not live
  EXPECT_GE(freed.cachedBytes, int64_t{4} << 20);  // but kept for reuse
  Tensor again = empty({1 << 20});
  EXPECT_EQ(again.dataPtr(), first);  // the same block comes back
  EXPECT_EQ(memoryStats().cachedBytes, freed.cachedBytes - (int64_t{4} << 20));
  emptyCache();
  EXPECT_EQ(memoryStats().cachedBytes, 0);
}

TEST(CpuAllocatorCache, SmallBlocksAreNotCached) {
  emptyCache();
  { Tensor t = empty({1000}); }
  EXPECT_EQ(memoryStats().cachedBytes, 0);
}

TEST(CpuAllocatorCache, ReusedBlocksHoldNewValues) {
  emptyCache();
  { Tensor a = full({1 << 19}, 3.0f); }
  Tensor b = zeros({1 << 19});
  EXPECT_EQ(b.sum().item<double>(), 0.0);
}
