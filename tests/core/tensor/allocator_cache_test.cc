// The CPU allocator keeps freed large blocks for reuse (core/tensor/allocator.cc) so large tensors
// do not pay a page fault per page on every allocation. Accounting stays exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include <cohort/cohort.h>

using namespace cohort;

namespace {

// The kernel's view of the mapping holding `p` (its /proc/self/smaps entry), or "" if none.
std::string smapsEntryOf(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line, entry;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {  // a mapping's first line: "lo-hi perms ..."
      if (in) return entry;
      in = addr >= lo && addr < hi;
      entry.clear();
    }
    if (in) entry += line + "\n";
  }
  return in ? entry : "";
}

std::string thpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s;  // e.g. "always [madvise] never"
}

}  // namespace

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
  { Tensor t = empty({(int64_t{128} << 10) / 4 - 16}); }  // just under 128 KiB
  EXPECT_EQ(memoryStats().cachedBytes, 0);
}

// From 128 KiB (where glibc starts giving freed blocks back to the kernel) blocks are kept: a
// micro-batch's 0.2-1 MiB activations come back without page faults.
TEST(CpuAllocatorCache, BlocksFrom128KiBAreReused) {
  emptyCache();
  for (int64_t floats : {int64_t{32} << 10, int64_t{48} << 10, int64_t{200} << 10}) {  // 128, 192, 800 KiB
    void* first = nullptr;
    {
      Tensor t = empty({floats});
      first = t.dataPtr();
    }
    EXPECT_GE(memoryStats().cachedBytes, floats * 4) << floats << " floats";
    Tensor again = empty({floats});
    EXPECT_EQ(again.dataPtr(), first) << floats << " floats";
  }
  emptyCache();
  EXPECT_EQ(memoryStats().cachedBytes, 0);
}

TEST(CpuAllocatorCache, ReusedBlocksHoldNewValues) {
  emptyCache();
  { Tensor a = full({1 << 19}, 3.0f); }
  Tensor b = zeros({1 << 19});
  EXPECT_EQ(b.sum().item<double>(), 0.0);
}

// Blocks of 2 MiB or more start on a 2 MiB boundary and are advised for transparent huge pages
// (COHORT_CPU_HUGE_PAGES, on by default); the kernel reports the advice as the mapping's "hg" flag.
// Every byte of such a block, including past its last whole huge page, is usable.
TEST(CpuAllocatorCache, LargeBlocksStartOnAHugePageBoundaryAndAskForHugePages) {
  emptyCache();
  for (int64_t floats : {int64_t{1} << 19, (int64_t{1} << 19) + 1, int64_t{5} << 20}) {  // 2 MiB, 2 MiB + 4, 20 MiB
    Tensor t = full({floats}, 2.0f);
    const auto addr = reinterpret_cast<uintptr_t>(t.dataPtr());
    EXPECT_EQ(addr % (uintptr_t{2} << 20), 0u) << floats << " floats at 0x" << std::hex << addr;
    EXPECT_EQ(t.sum().item<double>(), 2.0 * static_cast<double>(floats));
    t.data<float>()[floats - 1] = 5.0f;
    EXPECT_EQ(t.data<float>()[floats - 1], 5.0f);
    std::string entry = smapsEntryOf(t.dataPtr());
    ASSERT_FALSE(entry.empty()) << "no mapping holds 0x" << std::hex << addr;
    size_t flags = entry.find("VmFlags:");
    ASSERT_NE(flags, std::string::npos) << entry;
    std::string vmFlags = entry.substr(flags, entry.find('\n', flags) - flags);
    if (thpMode().find("[never]") == std::string::npos) {
      EXPECT_NE(vmFlags.find(" hg"), std::string::npos) << "not advised for huge pages: " << vmFlags;
    }
  }
  // Just under 2 MiB: an ordinary block, kept and reused as before.
  Tensor small = empty({(int64_t{1} << 19) - 1024});
  EXPECT_EQ(smapsEntryOf(small.dataPtr()).find(" hg"), std::string::npos);
  emptyCache();
  EXPECT_EQ(memoryStats().cachedBytes, 0);
}
