/*
 * Allocators and their accounting. Every byte of tensor storage comes from the Allocator
 * registered for its device; the base class counts bytes live, peak bytes and allocation counts
 * per device so the FSDP memory benchmark, tests and out-of-memory messages can read them.
 * Thread-safe: any thread may allocate and free.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cohort/core/tensor/device.h>

namespace cohort {

struct AllocatorStats {
  int64_t bytesLive = 0;    // bytes currently allocated
  int64_t peakBytes = 0;    // high-water mark of bytesLive since the last resetPeak()
  int64_t allocations = 0;  // number of allocate() calls
  int64_t frees = 0;        // number of deallocate() calls
  int64_t cachedBytes = 0;  // freed bytes kept for reuse (not in bytesLive)
  int64_t blocksLive() const { return allocations - frees; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` (64-byte aligned on CPU). nbytes == 0 may return nullptr.
  // Throws Error with the device and the live/peak figures when the memory cannot be had.
  void* allocate(size_t nbytes);
  void deallocate(void* p, size_t nbytes);
  virtual Device device() const = 0;

  AllocatorStats stats() const;
  void resetPeak();
  // Bytes of freed blocks an allocator keeps for reuse (not counted in bytesLive), and giving them
  // back to the system. Allocators without a cache report 0.
  virtual size_t cachedBytes() const { return 0; }
  virtual void emptyCache() {}

 protected:
  virtual void* rawAllocate(size_t nbytes) = 0;
  virtual void rawDeallocate(void* p, size_t nbytes) = 0;

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, allocs_{0}, frees_{0};
};

// A device runtime (CUDA) registers itself here when its library part is loaded; core code never
// tests for a backend with #if. The CPU needs no runtime.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual int deviceCount() = 0;
  // Why no device is usable (driver missing, no GPU visible), for error messages.
  virtual std::string unavailableReason() = 0;
  virtual Allocator* allocator(int index) = 0;
  // Copies nbytes between any two devices of this runtime or the CPU; returns when done.
  virtual void copy(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t nbytes) = 0;
};
void registerDeviceRuntime(DeviceType type, DeviceRuntime* runtime);
DeviceRuntime* deviceRuntime(DeviceType type);  // null when this build has none

// The allocator for a device. Throws NotSupportedError for CUDA in a build without CUDA, or when
// no device is visible, and IndexError for a device index past the last device.
Allocator* allocatorFor(Device d);
// Replaces a device's allocator (for tests and custom memory pools); returns the previous one.
// The caller keeps ownership of both and must keep `a` alive while tensors use it.
Allocator* setAllocator(Device d, Allocator* a);

// What tensor memory is for, so memory can be broken down by purpose (the memory profiler's
// timeline, out-of-memory reports). A storage gets the category of the scope it is allocated in
// (MemoryCategoryScope), else Activations while grad mode is on and Other when it is off; code that
// learns later what a tensor is (Module::registerParameter, gradient accumulation, optimizers,
// DDP's buckets) re-tags its storage with setMemoryCategory (core/tensor/tensor.h).
enum class MemoryCategory : uint8_t { Activations, Parameters, Gradients, OptimizerState, Communication, Other };
inline constexpr int kNumMemoryCategories = 6;
const char* memoryCategoryName(MemoryCategory c);  // "activations", "parameters", ...

// Allocations on this thread get `c` for the scope's extent (scopes nest).
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory c);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  int prev_;
};
// The category an allocation made now on this thread gets.
MemoryCategory currentMemoryCategory();

// Bytes of live tensor storage on devices of `type`, per category (always counted, profiler on or
// off: one relaxed atomic add per allocation and free). Memory a storage wraps but does not own
// (from_blob-style) is not counted.
struct CategoryBytes {
  int64_t bytes[kNumMemoryCategories] = {};
  int64_t total() const;
};
CategoryBytes memoryByCategory(DeviceType type = DeviceType::CPU);
namespace detail {
void accountCategory(DeviceType type, MemoryCategory c, int64_t delta);
}  // namespace detail

// The accounting of the current allocator of `d`.
AllocatorStats memoryStats(Device d = Device::cpu());
void resetPeakMemory(Device d = Device::cpu());
// Returns the blocks the device's allocator keeps for reuse to the system.
void emptyCache(Device d = Device::cpu());

}  // namespace cohort
