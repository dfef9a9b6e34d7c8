#include <cohort/core/tensor/caching_allocator.h>

#include <algorithm>

#include <cohort/core/util/check.h>
#include <cohort/core/util/logging.h>

namespace cohort {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallRequest = size_t{1} << 20;  // requests up to this share small segments
constexpr size_t kSmallSegment = size_t{2} << 20;  // segment size of the small pool
constexpr size_t kMidRequest = size_t{10} << 20;   // large requests under this share 20 MiB segments
constexpr size_t kLargeSegment = size_t{20} << 20;
constexpr size_t kSegmentRound = size_t{2} << 20;   // bigger requests get their own segment, rounded
constexpr size_t kLargeSplitMin = size_t{1} << 20;  // a large block is split only if more than this remains

}  // namespace

struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  uint64_t stream = 0;
  bool small = false;
  bool allocated = false;  // handed out, or freed but waiting for other streams' events
  Block* prev = nullptr;   // neighbours in the same segment
  Block* next = nullptr;
  std::vector<uint64_t> streams;  // other streams that used the block (recordStream)
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend) : backend_(std::move(backend)) {
  COHORT_CHECK(backend_ != nullptr, "CachingAllocator: a backend is required");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Pending& p : pending_)
    for (void* e : p.events) backend_->destroyEvent(e);
  // Only allocators made for tests are destroyed (the devices' live for the process); every tensor
  // of this allocator must be gone by now.
  for (Block* head : segmentHeads_) {
    char* base = head->ptr;
    size_t total = 0;
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      total += b->size;
      delete b;
      b = next;
    }
    backend_->freeSegment(base, total);
  }
}

size_t CachingAllocator::roundSize(size_t nbytes) {
  if (nbytes < kMinBlock) return kMinBlock;
  return (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

CachingAllocator::Pool& CachingAllocator::poolFor(size_t size) { return size <= kSmallRequest ? small_ : large_; }

CachingAllocator::Block* CachingAllocator::findFree(Pool& pool, uint64_t stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  cached_ -= b->size;
  return b;
}

CachingAllocator::Block* CachingAllocator::newSegment(size_t size, uint64_t stream, bool small) {
  size_t segSize = small                ? kSmallSegment
                   : size < kMidRequest ? kLargeSegment
                                        : (size + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
  void* p = backend_->allocateSegment(segSize);
  if (p == nullptr) return nullptr;
  Block* b = new Block();
  b->ptr = static_cast<char*>(p);
  b->size = segSize;
  b->stream = stream;
  b->small = small;
  segmentHeads_.push_back(b);
  stats_.reservedBytes += static_cast<int64_t>(segSize);
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  stats_.segments += 1;
  stats_.segmentAllocations += 1;
  return b;
}

CachingAllocator::Block* CachingAllocator::splitIfWorthIt(Block* b, size_t size, bool small) {
  size_t rest = b->size - size;
  if (small ? rest < kMinBlock : rest <= kLargeSplitMin) return b;
  Block* r = new Block();
  r->ptr = b->ptr + size;
  r->size = rest;
  r->stream = b->stream;
  r->small = b->small;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = size;
  (r->small ? small_ : large_).insert(r);
  cached_ += rest;
  stats_.splits += 1;
  return b;
}

void* CachingAllocator::rawAllocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  processPendingFrees(false);
  const size_t size = roundSize(nbytes);
  const bool small = size <= kSmallRequest;
  const uint64_t stream = backend_->currentStream();
  Block* b = findFree(poolFor(size), stream, size);
  if (b != nullptr) {
    stats_.cacheHits += 1;
  } else {
    b = newSegment(size, stream, small);
    if (b == nullptr) {
      // The device is full: wait for held-back blocks, give every fully free segment back, retry.
      stats_.oomRetries += 1;
      processPendingFrees(true);
      releaseFreeSegments();
      b = findFree(poolFor(size), stream, size);
      if (b == nullptr) b = newSegment(size, stream, small);
      if (b == nullptr) return nullptr;  // Allocator::allocate reports the out-of-memory error
    }
  }
  b = splitIfWorthIt(b, size, small);
  b->allocated = true;
  live_[b->ptr] = b;
  stats_.allocatedBytes += static_cast<int64_t>(b->size);
  return b->ptr;
}

void CachingAllocator::rawDeallocate(void* p, size_t) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    // Never thrown: this runs in storage destructors. A pointer we did not hand out is a bug.
    COHORT_LOG(Error, "CachingAllocator({}): free of {} which it did not allocate (ignored)", backend_->device(), p);
    return;
  }
  Block* b = it->second;
  live_.erase(it);
  stats_.allocatedBytes -= static_cast<int64_t>(b->size);
  if (!b->streams.empty()) {
    Pending pend{b, {}};
    for (uint64_t s : b->streams) pend.events.push_back(backend_->recordEvent(s));
    b->streams.clear();
    pending_.push_back(std::move(pend));
    stats_.pendingFrees += 1;
    return;
  }
  freeBlock(b);
}

void CachingAllocator::freeBlock(Block* b) {
  b->allocated = false;
  Pool& pool = b->small ? small_ : large_;
  if (b->prev != nullptr && !b->prev->allocated) {
    Block* prev = b->prev;
    pool.erase(prev);
    cached_ -= prev->size;
    prev->size += b->size;
    prev->next = b->next;
    if (b->next != nullptr) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (b->next != nullptr && !b->next->allocated) {
    Block* next = b->next;
    pool.erase(next);
    cached_ -= next->size;
    b->size += next->size;
    b->next = next->next;
    if (next->next != nullptr) next->next->prev = b;
    delete next;
  }
  pool.insert(b);
  cached_ += b->size;
}

void CachingAllocator::processPendingFrees(bool wait) {
  if (pending_.empty()) return;
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    bool done = true;
    for (void* e : p.events) {
      if (wait) backend_->waitEvent(e);
      else if (!backend_->eventDone(e)) done = false;
    }
    if (!done) {
      still.push_back(std::move(p));
      continue;
    }
    for (void* e : p.events) backend_->destroyEvent(e);
    stats_.pendingFrees -= 1;
    freeBlock(p.block);
  }
  pending_ = std::move(still);
}

void CachingAllocator::releaseFreeSegments() {
  std::vector<Block*> kept;
  for (Block* head : segmentHeads_) {
    if (head->allocated || head->prev != nullptr || head->next != nullptr) {
      kept.push_back(head);
      continue;
    }
    (head->small ? small_ : large_).erase(head);
    cached_ -= head->size;
    backend_->freeSegment(head->ptr, head->size);
    stats_.reservedBytes -= static_cast<int64_t>(head->size);
    stats_.segments -= 1;
    stats_.segmentFrees += 1;
    delete head;
  }
  segmentHeads_ = std::move(kept);
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  processPendingFrees(true);
  releaseFreeSegments();
}

size_t CachingAllocator::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

CachingAllocator::Block* CachingAllocator::liveBlock(const void* p) const {
  auto it = live_.find(p);
  if (it == live_.end())
    throw ValueError(fmt::format("{} is not the start of memory allocated on {} by cohort's caching allocator", p,
                                 backend_->device()));
  return it->second;
}

void CachingAllocator::recordStream(const void* p, uint64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Block* b = liveBlock(p);
  if (stream == b->stream) return;
  if (std::find(b->streams.begin(), b->streams.end(), stream) == b->streams.end()) b->streams.push_back(stream);
}

uint64_t CachingAllocator::streamOf(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  return liveBlock(p)->stream;
}

CachingAllocatorStats CachingAllocator::cacheStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace cohort
