// The caching allocator's bookkeeping (core/tensor/caching_allocator.h) over a fake device: plain
// host memory for segments, streams that are numbers and events the test completes by hand. The
// CUDA device uses the same class (tests/core/cuda/cuda_runtime_test.cc runs it on a GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <cohort/core/tensor/caching_allocator.h>
#include <cohort/core/util/error.h>

namespace cohort {
namespace {

struct FakeDevice {
  uint64_t stream = 0;
  size_t capacity = size_t{1} << 30;  // bytes the device can hand out in segments
  size_t inUse = 0;
  std::map<void*, size_t> segments;
  std::vector<bool> events;  // event i done?
  int waits = 0;
};

class FakeBackend final : public DeviceMemoryBackend {
 public:
  explicit FakeBackend(FakeDevice& d) : d_(d) {}
  Device device() const override { return Device::cuda(7); }
  void* allocateSegment(size_t n) override {
    if (d_.inUse + n > d_.capacity) return nullptr;
    void* p = std::malloc(n);
    d_.inUse += n;
    d_.segments[p] = n;
    return p;
  }
  void freeSegment(void* p, size_t n) override {
    EXPECT_EQ(d_.segments.at(p), n) << "a segment must be freed whole, with its size";
    d_.segments.erase(p);
    d_.inUse -= n;
    std::free(p);
  }
  uint64_t currentStream() override { return d_.stream; }
  void* recordEvent(uint64_t) override {
    d_.events.push_back(false);
    return reinterpret_cast<void*>(d_.events.size());  // 1-based id
  }
  bool eventDone(void* e) override { return d_.events[reinterpret_cast<size_t>(e) - 1]; }
  void waitEvent(void* e) override {
    d_.waits += 1;
    d_.events[reinterpret_cast<size_t>(e) - 1] = true;
  }
  void destroyEvent(void*) override {}

 private:
  FakeDevice& d_;
};

constexpr size_t kMiB = size_t{1} << 20;

struct Fixture : ::testing::Test {
  FakeDevice dev;
  std::unique_ptr<CachingAllocator> alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeBackend>(dev));
};

TEST_F(Fixture, RoundsTo512AndServesSmallRequestsFromOneSegment) {
  EXPECT_EQ(CachingAllocator::roundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::roundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::roundSize(513), 1024u);
  void* a = alloc->allocate(100);
  void* b = alloc->allocate(1000);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 512) << "the second block follows the first in its segment";
  auto s = alloc->cacheStats();
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.reservedBytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(s.allocatedBytes, 512 + 1024);
  alloc->deallocate(a, 100);
  alloc->deallocate(b, 1000);
  EXPECT_EQ(alloc->cacheStats().allocatedBytes, 0);
  EXPECT_EQ(alloc->cachedBytes(), 2 * kMiB) << "freed blocks merge back into the whole segment";
}

TEST_F(Fixture, ReusesFreedBlocksWithoutNewSegments) {
  void* a = alloc->allocate(3 * kMiB);
  alloc->deallocate(a, 3 * kMiB);
  void* b = alloc->allocate(3 * kMiB);
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc->cacheStats().segmentAllocations, 1);
  EXPECT_GE(alloc->cacheStats().cacheHits, 1);
  alloc->deallocate(b, 3 * kMiB);
}

TEST_F(Fixture, LargeRequestsShare20MiBSegmentsAndHugeOnesGetTheirOwn) {
  void* a = alloc->allocate(4 * kMiB);
  void* b = alloc->allocate(4 * kMiB);
  EXPECT_EQ(alloc->cacheStats().segments, 1) << "two 4 MiB blocks split one 20 MiB segment";
  EXPECT_EQ(alloc->cacheStats().reservedBytes, static_cast<int64_t>(20 * kMiB));
  void* c = alloc->allocate(33 * kMiB);
  EXPECT_EQ(alloc->cacheStats().segments, 2);
  EXPECT_EQ(alloc->cacheStats().reservedBytes, static_cast<int64_t>((20 + 34) * kMiB)) << "rounded up to 2 MiB";
  for (auto [p, n] : {std::pair{a, 4 * kMiB}, {b, 4 * kMiB}, {c, 33 * kMiB}}) alloc->deallocate(p, n);
  alloc->emptyCache();
  EXPECT_EQ(alloc->cacheStats().reservedBytes, 0);
  EXPECT_TRUE(dev.segments.empty());
}

TEST_F(Fixture, BlocksBelongToTheirStream) {
  dev.stream = 1;
  void* a = alloc->allocate(4096);
  alloc->deallocate(a, 4096);
  dev.stream = 2;
  void* b = alloc->allocate(4096);
  EXPECT_NE(a, b) << "a block freed on stream 1 is not handed to stream 2";
  EXPECT_EQ(alloc->streamOf(b), 2u);
  EXPECT_EQ(alloc->cacheStats().segments, 2);
  dev.stream = 1;
  void* c = alloc->allocate(4096);
  EXPECT_EQ(a, c) << "but it is reused by stream 1";
  alloc->deallocate(b, 4096);
  alloc->deallocate(c, 4096);
}

TEST_F(Fixture, RecordStreamHoldsTheBlockUntilTheOtherStreamsWorkIsDone) {
  dev.stream = 1;
  void* a = alloc->allocate(8192);
  alloc->recordStream(a, 5);
  alloc->recordStream(a, 1);  // its own stream: nothing to wait for
  alloc->deallocate(a, 8192);
  EXPECT_EQ(alloc->cacheStats().pendingFrees, 1);
  ASSERT_EQ(dev.events.size(), 1u) << "one event, on stream 5";
  void* b = alloc->allocate(8192);
  EXPECT_NE(a, b) << "not reused while stream 5 may still read it";
  dev.events[0] = true;
  void* c = alloc->allocate(8192);
  EXPECT_EQ(alloc->cacheStats().pendingFrees, 0);
  EXPECT_EQ(a, c) << "reused once stream 5's event completed";
  alloc->deallocate(b, 8192);
  alloc->deallocate(c, 8192);
}

TEST_F(Fixture, EmptyCacheWaitsForHeldBackBlocks) {
  void* a = alloc->allocate(8192);
  alloc->recordStream(a, 9);
  alloc->deallocate(a, 8192);
  alloc->emptyCache();
  EXPECT_EQ(dev.waits, 1);
  EXPECT_EQ(alloc->cacheStats().reservedBytes, 0);
  EXPECT_EQ(alloc->cacheStats().pendingFrees, 0);
}

TEST_F(Fixture, RecordStreamOfForeignPointerIsAValueError) {
  int x = 0;
  EXPECT_THROW(alloc->recordStream(&x, 1), ValueError);
}

TEST_F(Fixture, OutOfMemoryFreesTheCacheAndRetriesThenReportsTheDeviceAndFigures) {
  dev.capacity = 40 * kMiB;
  void* a = alloc->allocate(15 * kMiB);  // 10 MiB or more: a segment of its own, 16 MiB
  alloc->deallocate(a, 15 * kMiB);
  void* b = alloc->allocate(30 * kMiB);  // needs the cached segment given back first
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(alloc->cacheStats().oomRetries, 1);
  try {
    alloc->allocate(64 * kMiB);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cuda:7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("67108864"), std::string::npos) << msg;
  }
  alloc->deallocate(b, 30 * kMiB);
}

TEST_F(Fixture, SplitBlocksMergeWithFreeNeighboursInAnyOrder) {
  std::mt19937 rng(3);
  std::vector<std::pair<void*, size_t>> live;
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 50)) {
      size_t i = rng() % live.size();
      alloc->deallocate(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      size_t n = 1 + rng() % (3 * kMiB);
      void* p = alloc->allocate(n);
      std::memset(p, 0xab, n);  // every byte handed out is ours alone (ASan would see overlaps)
      live.push_back({p, n});
    }
  }
  for (auto [p, n] : live) alloc->deallocate(p, n);
  EXPECT_EQ(alloc->cacheStats().allocatedBytes, 0);
  EXPECT_EQ(alloc->cachedBytes(), static_cast<size_t>(alloc->cacheStats().reservedBytes))
      << "with nothing live every segment is one free block again";
  alloc->emptyCache();
  EXPECT_EQ(alloc->cacheStats().reservedBytes, 0);
}

TEST_F(Fixture, SteadyTrainingLoopDoesNotGrow) {
  // The same sizes every step, as a training loop allocates: after the first step no new segment.
  const std::vector<size_t> sizes = {4096, 300000, 5 * kMiB, 12 * kMiB, 700, 2 * kMiB};
  int64_t segmentsAfterFirst = 0;
  for (int step = 0; step < 10000; ++step) {
    std::vector<void*> ps;
    for (size_t n : sizes) ps.push_back(alloc->allocate(n));
    for (size_t i = 0; i < sizes.size(); ++i) alloc->deallocate(ps[i], sizes[i]);
    if (step == 0) segmentsAfterFirst = alloc->cacheStats().segmentAllocations;
  }
  EXPECT_EQ(alloc->cacheStats().segmentAllocations, segmentsAfterFirst);
  EXPECT_EQ(alloc->stats().bytesLive, 0);
}

}  // namespace
}  // namespace cohort
