// CUDA streams, events, pinned host memory and asynchronous copies (core/cuda/cuda.h).
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include <cohort/core/autograd/function.h>
#include <cohort/core/cuda/detail/check.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/caching_allocator.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda {
namespace {

int resolve(int device) {
  if (device >= 0) {
    int n = deviceCount();
    COHORT_CHECK_T(IndexError, device < n, "cuda:{} does not exist ({} devices)", device, n);
    return device;
  }
  return currentDevice();
}

void requireAvailable(const char* what) {
  if (!isAvailable()) {
    DeviceRuntime* rt = deviceRuntime(DeviceType::CUDA);
    throw NotSupportedError(fmt::format("{}: no CUDA device is usable: {}", what,
                                        rt != nullptr ? rt->unavailableReason() : "this build has no CUDA"));
  }
}

// The calling thread's current stream per device (nullptr = the default stream).
std::vector<cudaStream_t>& currentStreams() {
  thread_local std::vector<cudaStream_t> streams;
  if (streams.empty()) streams.assign(static_cast<size_t>(std::max(deviceCount(), 1)), nullptr);
  return streams;
}

constexpr int kPoolSize = 32;
struct StreamPool {
  std::once_flag once;
  std::array<cudaStream_t, kPoolSize> streams{};
  std::atomic<uint32_t> next{0};
};
StreamPool& pool(int device, bool high) {
  static std::vector<StreamPool>* pools = [] {
    return new std::vector<StreamPool>(static_cast<size_t>(2 * std::max(deviceCount(), 1)));
  }();
  return (*pools)[static_cast<size_t>(2 * device + (high ? 1 : 0))];
}

std::atomic<bool> gAllowTf32{false};

}  // namespace

bool isAvailable() { return cudaAvailable(); }
int deviceCount() { return cudaDeviceCount(); }

int currentDevice() {
  requireAvailable("currentDevice");
  int d = 0;
  COHORT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void setDevice(int index) {
  requireAvailable("setDevice");
  COHORT_CUDA_CHECK(cudaSetDevice(resolve(index)));
}

void synchronize(int device) {
  DeviceGuard g(resolve(device));
  COHORT_CUDA_CHECK(cudaDeviceSynchronize());
}

bool Stream::query() const {
  DeviceGuard g(device_);
  cudaError_t e = cudaStreamQuery(reinterpret_cast<cudaStream_t>(handle_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  COHORT_CUDA_CHECK(e);
  return true;
}

void Stream::synchronize() const {
  DeviceGuard g(device_);
  COHORT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(handle_)));
}

std::string Stream::str() const {
  return handle_ == nullptr ? fmt::format("cuda:{} default stream", device_)
                            : fmt::format("cuda:{} stream {}", device_, handle_);
}

Stream defaultStream(int device) { return Stream::fromHandle(resolve(device), nullptr); }

Stream currentStream(int device) {
  int d = resolve(device);
  return Stream::fromHandle(d, currentStreams()[static_cast<size_t>(d)]);
}

void setCurrentStream(const Stream& s) {
  resolve(s.deviceIndex());
  currentStreams()[static_cast<size_t>(s.deviceIndex())] = reinterpret_cast<cudaStream_t>(s.handle());
}

Stream streamFromPool(int device, bool highPriority) {
  int d = resolve(device);
  StreamPool& p = pool(d, highPriority);
  std::call_once(p.once, [&] {
    DeviceGuard g(d);
    int lo = 0, hi = 0;
    COHORT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (cudaStream_t& s : p.streams)
      COHORT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, highPriority ? hi : lo));
  });
  uint32_t i = p.next.fetch_add(1, std::memory_order_relaxed) % kPoolSize;
  return Stream::fromHandle(d, p.streams[i]);
}

StreamGuard::StreamGuard(const Stream& s) : prevDevice_(currentDevice()), prevStream_(currentStream(s.deviceIndex())) {
  COHORT_CUDA_CHECK(cudaSetDevice(s.deviceIndex()));
  setCurrentStream(s);
}
StreamGuard::~StreamGuard() {
  setCurrentStream(prevStream_);
  cudaSetDevice(prevDevice_);
}

DeviceGuard::DeviceGuard(int index) : prev_(currentDevice()) {
  if (index != prev_) COHORT_CUDA_CHECK(cudaSetDevice(resolve(index)));
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
}

// ---- events -------------------------------------------------------------------------------------

Event::Event(bool timing) : timing_(timing) {}
Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(handle_));
}
Event::Event(Event&& o) noexcept : timing_(o.timing_), device_(o.device_), handle_(o.handle_) { o.handle_ = nullptr; }
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(handle_));
    timing_ = o.timing_;
    device_ = o.device_;
    handle_ = o.handle_;
    o.handle_ = nullptr;
  }
  return *this;
}

void Event::record() { record(currentStream()); }

void Event::record(const Stream& s) {
  DeviceGuard g(s.deviceIndex());
  if (handle_ == nullptr) {
    cudaEvent_t e;
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = e;
    device_ = s.deviceIndex();
  }
  COHORT_CHECK_T(ValueError, device_ == s.deviceIndex(),
                 "Event::record: the event belongs to cuda:{}, the stream to {}", device_, s.device());
  COHORT_CUDA_CHECK(
      cudaEventRecord(reinterpret_cast<cudaEvent_t>(handle_), reinterpret_cast<cudaStream_t>(s.handle())));
}

void Event::block(const Stream& s) const {
  if (handle_ == nullptr) return;
  DeviceGuard g(s.deviceIndex());
  COHORT_CUDA_CHECK(
      cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(s.handle()), reinterpret_cast<cudaEvent_t>(handle_), 0));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(handle_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  COHORT_CUDA_CHECK(e);
  return true;
}

void Event::synchronize() const {
  if (handle_ != nullptr) COHORT_CUDA_CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(handle_)));
}

float Event::elapsedMs(const Event& end) const {
  COHORT_CHECK_T(ValueError, timing_ && end.timing_, "Event::elapsedMs: both events must be made with timing = true");
  COHORT_CHECK_T(ValueError, handle_ != nullptr && end.handle_ != nullptr,
                 "Event::elapsedMs: both events must be recorded first");
  float ms = 0;
  COHORT_CUDA_CHECK(
      cudaEventElapsedTime(&ms, reinterpret_cast<cudaEvent_t>(handle_), reinterpret_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

// ---- the caching allocator's stream bookkeeping ---------------------------------------------------

void recordStream(const Tensor& t, const Stream& s) {
  COHORT_CHECK_T(ValueError, t.defined() && t.device().isCuda(), "recordStream: expects a CUDA tensor");
  COHORT_CHECK_T(ValueError, t.device() == s.device(), "recordStream: the tensor is on {}, the stream on {}",
                 t.device(), s.device());
  auto* cache = dynamic_cast<CachingAllocator*>(allocatorFor(t.device()));
  if (cache == nullptr) return;  // a user-installed allocator (setAllocator) keeps its own rules
  const void* base = t.storage()->data();
  if (base == nullptr) return;  // empty storage
  cache->recordStream(base, reinterpret_cast<uint64_t>(s.handle()));
}

CachingAllocatorStats allocatorStats(int device) {
  auto* cache = dynamic_cast<CachingAllocator*>(allocatorFor(Device::cuda(resolve(device))));
  COHORT_CHECK_T(NotSupportedError, cache != nullptr, "allocatorStats: cuda:{}'s allocator was replaced (setAllocator)",
                 device);
  return cache->cacheStats();
}

// ---- pinned host memory ---------------------------------------------------------------------------

namespace {

// Page-locked host blocks, cached by size. A block used by an asynchronous copy remembers the
// stream; freed, it is reused only after the work queued on that stream by then has finished.
class PinnedPool {
 public:
  void* allocate(size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    reap(false);
    auto it = free_.find(nbytes);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      live_[p] = Block{nbytes, {}};
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      reap(true);
      for (auto& [size, list] : free_)
        for (void* q : list) cudaFreeHost(q);
      free_.clear();
      COHORT_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
    }
    live_[p] = Block{nbytes, {}};
    return p;
  }
  void free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    Block b = std::move(it->second);
    live_.erase(it);
    if (b.streams.empty()) {
      free_[b.size].push_back(p);
      return;
    }
    std::vector<cudaEvent_t> events;
    for (auto [device, stream] : b.streams) {
      cudaEvent_t e;
      int prev = 0;
      cudaGetDevice(&prev);
      cudaSetDevice(device);
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
        cudaEventRecord(e, stream);
        events.push_back(e);
      }
      cudaSetDevice(prev);
    }
    pending_.push_back({p, b.size, std::move(events)});
  }
  void recordUse(const void* p, int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it != live_.end()) it->second.streams.push_back({device, stream});
  }
  bool owns(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(p) > 0;
  }

 private:
  struct Block {
    size_t size;
    std::vector<std::pair<int, cudaStream_t>> streams;
  };
  struct PendingBlock {
    void* p;
    size_t size;
    std::vector<cudaEvent_t> events;
  };
  void reap(bool wait) {
    std::vector<PendingBlock> still;
    for (PendingBlock& pb : pending_) {
      bool done = true;
      for (cudaEvent_t e : pb.events) {
        if (wait) cudaEventSynchronize(e);
        else if (cudaEventQuery(e) != cudaSuccess) done = false;
      }
      cudaGetLastError();
      if (!done) {
        still.push_back(std::move(pb));
        continue;
      }
      for (cudaEvent_t e : pb.events) cudaEventDestroy(e);
      free_[pb.size].push_back(pb.p);
    }
    pending_ = std::move(still);
  }
  std::mutex mu_;
  std::map<const void*, Block> live_;
  std::map<size_t, std::vector<void*>> free_;
  std::vector<PendingBlock> pending_;
};

PinnedPool& pinnedPool() {
  static PinnedPool* p = new PinnedPool();
  return *p;
}

}  // namespace

Tensor pinnedEmpty(const Shape& shape, DType dtype) {
  requireAvailable("pinnedEmpty");
  int64_t n = 1;
  for (int64_t s : shape) {
    COHORT_CHECK_T(ValueError, s >= 0, "pinnedEmpty: negative size in shape {}", shapeStr(shape));
    n *= s;
  }
  size_t nbytes = static_cast<size_t>(n) * elementSize(dtype);
  void* p = nbytes == 0 ? nullptr : pinnedPool().allocate(nbytes);
  auto storage = std::make_shared<Storage>(p, nbytes, Device::cpu(), [](void* q) {
    if (q != nullptr) pinnedPool().free(q);
  });
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, shape, contiguousStrides(shape), dtype));
}

bool isPinned(const Tensor& t) {
  if (!t.defined() || !t.device().isCpu() || !isAvailable()) return false;
  const void* base = t.storage()->data();
  if (base == nullptr) return false;
  if (pinnedPool().owns(base)) return true;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, base) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// ---- copies -------------------------------------------------------------------------------------

Tensor copyTo(const Tensor& t, Device device, bool nonBlocking) {
  COHORT_CHECK_T(ValueError, t.defined(), "copyTo: undefined tensor");
  if (t.device() == device) return t;
  if (!nonBlocking || (t.device().isCuda() && device.isCuda())) return t.to(device);
  requireAvailable("copyTo");
  Tensor src = t.contiguous();
  Tensor out =
      device.isCpu() ? pinnedEmpty(t.sizes(), t.dtype()) : empty(t.sizes(), {.dtype = t.dtype(), .device = device});
  if (t.numel() > 0) {
    const bool h2d = src.device().isCpu();
    int gpu = h2d ? device.index() : src.device().index();
    DeviceGuard g(gpu);
    cudaStream_t stream = detail::currentCudaStream(gpu);
    const void* from = h2d ? static_cast<const char*>(src.storage()->data()) +
                                 src.storageOffset() * static_cast<int64_t>(src.elementSize())
                           : detail::devicePtr(src);
    void* into = h2d ? detail::devicePtr(out) : out.storage()->data();
    COHORT_CUDA_CHECK(
        cudaMemcpyAsync(into, from, t.nbytes(), h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
    const Tensor& host = h2d ? src : out;
    if (isPinned(host)) {
      pinnedPool().recordUse(host.storage()->data(), gpu, stream);
      if (!h2d) recordStream(src, Stream::fromHandle(gpu, stream));
    } else {
      COHORT_CUDA_CHECK(cudaStreamSynchronize(stream));  // pageable host memory: the copy is not asynchronous
    }
  }
  Device from = t.device();
  autograd::record("to", {t}, {out}, {}, [from](autograd::Ctx&, const std::vector<Tensor>& g) -> std::vector<Tensor> {
    return {g[0].to(from)};
  });
  return out;
}

void setAllowTf32(bool allow) { gAllowTf32.store(allow); }
bool allowTf32() { return gAllowTf32.load(); }

}  // namespace cohort::cuda
