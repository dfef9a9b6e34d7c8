/*
 * A caching allocator for devices whose work runs asynchronously on streams (CUDA), with the
 * device itself behind a small interface so its bookkeeping runs, and is tested, on any machine.
 *
 * Model (PyTorch's, simplified): memory comes from the device in segments and is handed out in
 * blocks. A block belongs to the stream that was current when it was allocated; freed, it goes back
 * to that stream's free pool at once (work queued later on the same stream runs after the work
 * that used it, so reuse needs no synchronization) and is merged with free neighbours of its
 * segment. A block used by other streams too (recordStream) is held back until an event recorded
 * on each of them at free time has completed. Requests are rounded up to 512 bytes; requests of
 * up to 1 MiB share 2 MiB segments ("small" pool), larger ones come from the "large" pool: 20 MiB
 * segments for requests under 10 MiB, else a segment of the request rounded up to 2 MiB. A cached
 * block larger than the request is split when the rest is worth keeping (≥ 512 bytes in the
 * small pool, > 1 MiB in the large one). When the device has no memory left, every fully free
 * segment is given back and the request retried before the out-of-memory error.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include <cohort/core/tensor/allocator.h>

namespace cohort {

// What a device gives the caching allocator. Stream ids are opaque (0 may be a valid stream).
class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  virtual Device device() const = 0;
  // A segment of nbytes from the device, or null when the device has no memory left.
  virtual void* allocateSegment(size_t nbytes) = 0;
  // Returns a segment; called only when no queued work can use it any more.
  virtual void freeSegment(void* p, size_t nbytes) = 0;
  // The stream that allocations made now are for (the calling thread's current stream).
  virtual uint64_t currentStream() = 0;
  // An event capturing the work queued on `stream` so far; eventDone polls it; destroyEvent frees it.
  virtual void* recordEvent(uint64_t stream) = 0;
  virtual bool eventDone(void* event) = 0;
  virtual void waitEvent(void* event) = 0;  // blocks the host until the event is done
  virtual void destroyEvent(void* event) = 0;
};

struct CachingAllocatorStats {
  int64_t reservedBytes = 0;       // bytes in segments held from the device
  int64_t peakReservedBytes = 0;   // high-water mark of reservedBytes
  int64_t allocatedBytes = 0;      // bytes in blocks handed out (rounded sizes)
  int64_t segments = 0;            // segments held
  int64_t segmentAllocations = 0;  // device allocations made (cudaMalloc calls)
  int64_t segmentFrees = 0;        // segments given back to the device
  int64_t cacheHits = 0;           // requests served from a cached block
  int64_t splits = 0;              // cached blocks split to serve a smaller request
  int64_t pendingFrees = 0;        // freed blocks waiting for another stream's work (recordStream)
  int64_t oomRetries = 0;          // times the cache was emptied to retry a failed device allocation
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend);
  ~CachingAllocator() override;
  Device device() const override { return backend_->device(); }

  size_t cachedBytes() const override;
  // Gives every fully free segment back to the device, waiting first for held-back blocks' events.
  void emptyCache() override;
  // Marks the live block at `p` (a pointer returned by allocate, or inside its block) as used by
  // `stream`; see the header comment. Throws ValueError when p is not memory of this allocator.
  void recordStream(const void* p, uint64_t stream);
  // The stream the block at p was allocated for.
  uint64_t streamOf(const void* p) const;
  CachingAllocatorStats cacheStats() const;
  DeviceMemoryBackend& backend() { return *backend_; }

  static size_t roundSize(size_t nbytes);

 protected:
  void* rawAllocate(size_t nbytes) override;
  void rawDeallocate(void* p, size_t nbytes) override;

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Pool& poolFor(size_t size);
  Block* findFree(Pool& pool, uint64_t stream, size_t size);
  Block* newSegment(size_t size, uint64_t stream, bool small);
  Block* splitIfWorthIt(Block* b, size_t size, bool small);
  void freeBlock(Block* b);  // back to its pool, merged with free neighbours
  void processPendingFrees(bool wait);
  void releaseFreeSegments();
  Block* liveBlock(const void* p) const;

  std::unique_ptr<DeviceMemoryBackend> backend_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::unordered_map<const void*, Block*> live_;  // block start -> live block
  struct Pending {
    Block* block;
    std::vector<void*> events;
  };
  std::vector<Pending> pending_;
  std::vector<Block*> segmentHeads_;
  CachingAllocatorStats stats_;
  size_t cached_ = 0;  // bytes in free blocks
};

}  // namespace cohort
