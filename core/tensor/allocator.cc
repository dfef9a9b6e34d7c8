#include <cohort/core/tensor/allocator.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/util/env.h>

#include <cohort/core/util/check.h>

namespace cohort {

void* Allocator::allocate(size_t nbytes) {
  void* p = rawAllocate(nbytes);
  if (p == nullptr && nbytes > 0) {
    AllocatorStats s = stats();
    throw Error(fmt::format("out of memory on {}: could not allocate {} bytes ({} bytes live in {} blocks, peak {})",
                            device(), nbytes, s.bytesLive, s.blocksLive(), s.peakBytes));
  }
  int64_t live =
      live_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) + static_cast<int64_t>(nbytes);
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
  s.cachedBytes = static_cast<int64_t>(cachedBytes());
  return s;
}

void Allocator::resetPeak() { peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

namespace {

// A function-local knob: the allocator may be created during another file's static
// initialisation, before this file's namespace-scope objects exist.
const env::Knob& cpuCacheKnob() {
  static const env::Knob kCacheKnob{
      "COHORT_CPU_ALLOCATOR_CACHE_MB", "1024",
      "Largest total size (MiB) of freed large CPU blocks kept for reuse; 0 disables the cache."};
  return kCacheKnob;
}
const env::Knob& hugePagesKnob() {
  static const env::Knob kHugePagesKnob{
      "COHORT_CPU_HUGE_PAGES", "1",
      "On: CPU blocks of 2 MiB or more start on a 2 MiB boundary and ask for transparent huge pages "
      "(madvise); 0: ordinary pages."};
  return kHugePagesKnob;
}
const bool kCpuCacheKnobListed = (cpuCacheKnob(), hugePagesKnob(), true);  // listed by --help-env from the start

constexpr size_t kHugePage = size_t{2} << 20;

// A block of `size` bytes (a multiple of 4 KiB) mapped on its own, starting on a 2 MiB boundary,
// with transparent huge pages asked for: every whole 2 MiB of it then costs one page fault and one
// TLB entry instead of 512. Null when the kernel has no memory. Where THP is off ("never") the
// advice does nothing and the block is ordinary pages.
void* mapHuge(size_t size) {
  const size_t span = size + kHugePage - 4096;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + span, used = aligned + size;
  if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
  madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

// CPU memory. Blocks of kCacheMin (128 KiB, glibc's default mmap threshold) or more are kept
// after they are freed, in buckets of the same (page-rounded) size, up to a byte budget, and
// handed out again: glibc returns such blocks to the kernel on free (mmap'd ones at once, heap
// ones when it trims the heap's top), so without the cache a tensor of that size costs a page
// fault per 4 KiB page on first touch — 16k faults for a 64 MiB tensor, more time than the kernel
// that fills it. Training allocates the same shapes every step, so reuse is nearly perfect. (The
// cache started at 1 MiB; a micro-batched GPT's 0.2-1 MiB activations then spent 6-8% of a step
// in page faults.)
// Blocks of 2 MiB or more are mapped by the allocator itself on huge-page boundaries with
// transparent huge pages asked for (COHORT_CPU_HUGE_PAGES): large GEMMs and elementwise passes
// then miss the TLB far less, and a tensor read by another process (the RPC layer's cross-memory
// reads pin the sender's pages one by one) pins 512 times fewer pages.
class CpuAllocator final : public Allocator {
 public:
  // A value that is not a whole number of MiB from 0 up is a ValueError naming the variable: the
  // registry below is then not made, so every allocation throws it until the variable is fixed.
  CpuAllocator() {
    const int64_t mb = cpuCacheKnob().integer();  // ValueError naming the variable when not an integer
    if (mb < 0 || mb > (int64_t{1} << 40))
      throw ValueError(fmt::format("environment variable {}='{}' must be a size in MiB from 0 (no cache) to 2^40",
                                   cpuCacheKnob().name(), cpuCacheKnob().str()));
    budget_ = static_cast<size_t>(mb) << 20;
    huge_ = hugePagesKnob().flag();  // ValueError naming the variable when not a yes/no value
  }
  Device device() const override { return Device::cpu(); }

  size_t cachedBytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void emptyCache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) release(p, size);
    cache_.clear();
    cached_ = 0;
  }

 protected:
  static constexpr size_t kCacheMin = size_t{128} << 10;

  static size_t rounded(size_t nbytes) {
    return nbytes >= kCacheMin ? (nbytes + 4095) & ~size_t{4095} : (nbytes + 63) & ~size_t{63};
  }

  void* rawAllocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t size = rounded(nbytes);
    if (size >= kCacheMin && budget_ > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(size);
      if (it != cache_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        return p;
      }
    }
    void* p = obtain(size);
    if (p == nullptr && cachedBytes() > 0) {  // memory is short: give the cache back and retry
      emptyCache();
      p = obtain(size);
    }
    return p;
  }
  void rawDeallocate(void* p, size_t nbytes) override {
    if (p == nullptr) return;
    size_t size = rounded(nbytes);
    if (size >= kCacheMin && budget_ > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + size <= budget_) {
        cache_[size].push_back(p);
        cached_ += size;
        return;
      }
    }
    release(p, size);
  }

 private:
  bool mapsHuge(size_t size) const { return huge_ && size >= kHugePage; }
  // A new block of a rounded size, or null.
  void* obtain(size_t size) const {
    if (mapsHuge(size)) return mapHuge(size);
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of the alignment.
    return std::aligned_alloc(64, size);
  }
  void release(void* p, size_t size) const {
    if (mapsHuge(size)) munmap(p, size);
    else std::free(p);
  }

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;
  size_t cached_ = 0;
  size_t budget_ = 0;
  bool huge_ = true;
};

// The default CPU allocator, made on first use rather than with the registry (device runtimes
// register while libraries load, before main): a bad COHORT_CPU_ALLOCATOR_CACHE_MB then throws its
// ValueError at the first allocation, where the program can catch it, and again at every later
// one until the variable is fixed.
Allocator* defaultCpuAllocator() {
  static Allocator* a = new CpuAllocator();  // lives for the process: storage may be freed during teardown
  return a;
}

struct Registry {
  std::mutex mu;
  Allocator* cpu = nullptr;  // set by setAllocator; null: the default
  DeviceRuntime* runtimes[kNumDeviceTypes] = {};
  Allocator* overrides[kNumDeviceTypes] = {};
};
Registry& registry() {
  static Registry* r = new Registry();
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
  if (d.isCpu()) {
    Allocator* a = r.cpu;
    return a ? a : defaultCpuAllocator();
  }
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
    throw NotSupportedError(
        fmt::format("{} was asked for, but no CUDA device is usable: {}", d, rt->unavailableReason()));
  if (d.index() < 0 || d.index() >= count)
    throw IndexError(fmt::format("{} was asked for, but only {} CUDA device(s) are visible", d, count));
  return rt->allocator(d.index());
}

Allocator* setAllocator(Device d, Allocator* a) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Allocator*& slot = d.isCpu() ? r.cpu : r.overrides[static_cast<int>(d.type())];
  Allocator* prev = slot != nullptr || !d.isCpu() ? slot : defaultCpuAllocator();
  slot = a;
  return prev;
}

AllocatorStats memoryStats(Device d) { return allocatorFor(d)->stats(); }
void resetPeakMemory(Device d) { allocatorFor(d)->resetPeak(); }
void emptyCache(Device d) { allocatorFor(d)->emptyCache(); }

}  // namespace cohort

namespace cohort {

namespace {
constexpr int kUnsetCategory = -1;
thread_local int tlsCategory = kUnsetCategory;
std::atomic<int64_t> gCategoryBytes[kNumDeviceTypes][kNumMemoryCategories];
}  // namespace

const char* memoryCategoryName(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer state";
    case MemoryCategory::Communication: return "communication";
    case MemoryCategory::Other: return "other";
  }
  return "?";
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory c) : prev_(tlsCategory) { tlsCategory = static_cast<int>(c); }
MemoryCategoryScope::~MemoryCategoryScope() { tlsCategory = prev_; }

MemoryCategory currentMemoryCategory() {
  if (tlsCategory != kUnsetCategory) return static_cast<MemoryCategory>(tlsCategory);
  return autograd::isGradEnabled() ? MemoryCategory::Activations : MemoryCategory::Other;
}

int64_t CategoryBytes::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

CategoryBytes memoryByCategory(DeviceType type) {
  CategoryBytes out;
  for (int c = 0; c < kNumMemoryCategories; ++c)
    out.bytes[c] = gCategoryBytes[static_cast<int>(type)][c].load(std::memory_order_relaxed);
  return out;
}

void detail::accountCategory(DeviceType type, MemoryCategory c, int64_t delta) {
  gCategoryBytes[static_cast<int>(type)][static_cast<int>(c)].fetch_add(delta, std::memory_order_relaxed);
}

}  // namespace cohort
