#include <cohort/core/tensor/allocator.h>

#include <cstdlib>
#include <mutex>

#include <cohort/core/util/check.h>

namespace cohort {

void* Allocator::allocate(size_t nbytes) {
  void* p = rawAllocate(nbytes);
  if (p == nullptr && nbytes > 0) {
    AllocatorStats s = stats();
    throw Error(fmt::format("out of memory on {}: could not allocate {} bytes ({} bytes live in {} blocks, peak {})",
                            device(), nbytes, s.bytesLive, s.blocksLive(), s.peakBytes));
  }
  int64_t live = live_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  allocs_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void Allocator::deallocate(void* p, size_t nbytes) {
  rawDeallocate(p, nbytes);
  live_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  frees_.fetch_add(1, std::memory_order_relaxed);
}

AllocatorStats Allocator::stats() const {
  AllocatorStats s;
  s.bytesLive = live_.load(std::memory_order_relaxed);
  s.peakBytes = peak_.load(std::memory_order_relaxed);
  s.allocations = allocs_.load(std::memory_order_relaxed);
  s.frees = frees_.load(std::memory_order_relaxed);
  return s;
}

void Allocator::resetPeak() { peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

namespace {

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

 protected:
  void* rawAllocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of the alignment.
    return std::aligned_alloc(64, (nbytes + 63) & ~size_t{63});
  }
  void rawDeallocate(void* p, size_t) override { std::free(p); }
};

struct Registry {
  std::mutex mu;
  Allocator* cpu = nullptr;
  DeviceRuntime* runtimes[kNumDeviceTypes] = {};
  Allocator* overrides[kNumDeviceTypes] = {};
};
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->cpu = new CpuAllocator();  // lives for the process: storage may be freed during teardown
    return reg;
  }();
  return *r;
}

}  // namespace

void registerDeviceRuntime(DeviceType type, DeviceRuntime* runtime) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.runtimes[static_cast<int>(type)] = runtime;
}

DeviceRuntime* deviceRuntime(DeviceType type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.runtimes[static_cast<int>(type)];
}

Allocator* allocatorFor(Device d) {
  auto& r = registry();
  if (d.isCpu()) return r.cpu;
  DeviceRuntime* rt = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (Allocator* o = r.overrides[static_cast<int>(d.type())]) return o;
    rt = r.runtimes[static_cast<int>(d.type())];
  }
  if (rt == nullptr)
    throw NotSupportedError(fmt::format("{} was asked for, but this build of cohort has no CUDA support "
                                        "(configure with -DCOHORT_USE_CUDA=ON on a machine with the CUDA toolkit)",
                                        d));
  int count = rt->deviceCount();
  if (count == 0)
    throw NotSupportedError(fmt::format("{} was asked for, but no CUDA device is usable: {}", d, rt->unavailableReason()));
  if (d.index() < 0 || d.index() >= count)
    throw IndexError(fmt::format("{} was asked for, but only {} CUDA device(s) are visible", d, count));
  return rt->allocator(d.index());
}

Allocator* setAllocator(Device d, Allocator* a) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Allocator*& slot = d.isCpu() ? r.cpu : r.overrides[static_cast<int>(d.type())];
  Allocator* prev = slot;
  slot = a;
  return prev;
}

AllocatorStats memoryStats(Device d) { return allocatorFor(d)->stats(); }
void resetPeakMemory(Device d) { allocatorFor(d)->resetPeak(); }

}  // namespace cohort
