// The CUDA device runtime: each device's caching allocator (core/tensor/caching_allocator.h) over
// cudaMalloc, and copies between host and devices. Registers itself with the device registry at
// load, so core code reaches CUDA without any #if.
#include <mutex>
#include <vector>

#include <cohort/core/cuda/detail/check.h>
#include <cohort/core/tensor/allocator.h>
#include <cohort/core/tensor/caching_allocator.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda {
namespace {

// What the caching allocator needs from a CUDA device. Stream ids are cudaStream_t values.
class CudaMemoryBackend final : public DeviceMemoryBackend {
 public:
  explicit CudaMemoryBackend(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  void* allocateSegment(size_t nbytes) override {
    DeviceGuard g(index_);
    void* p = nullptr;
    if (cudaMalloc(&p, nbytes) != cudaSuccess) {
      cudaGetLastError();  // clear the error; the allocator frees its cache and retries, then reports
      return nullptr;
    }
    return p;
  }
  void freeSegment(void* p, size_t) override {
    DeviceGuard g(index_);
    cudaFree(p);
  }
  uint64_t currentStream() override { return reinterpret_cast<uint64_t>(cuda::currentStream(index_).handle()); }
  void* recordEvent(uint64_t stream) override {
    DeviceGuard g(index_);
    cudaEvent_t e;
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    COHORT_CUDA_CHECK(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)));
    return e;
  }
  bool eventDone(void* event) override {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    return true;  // done, or failed (a failed context makes every later call report the error)
  }
  void waitEvent(void* event) override { cudaEventSynchronize(static_cast<cudaEvent_t>(event)); }
  void destroyEvent(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  int index_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  int deviceCount() override {
    std::call_once(probe_, [&] {
      int n = 0;
      cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        reason_ = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(e));
        cudaGetLastError();
        n = 0;
      } else if (n == 0) {
        reason_ = "the CUDA runtime sees no devices";
      }
      count_ = n;
      for (int i = 0; i < n; ++i)  // live for the process: tensors may be freed during exit
        allocators_.push_back(new CachingAllocator(std::make_unique<CudaMemoryBackend>(i)));
    });
    return count_;
  }
  std::string unavailableReason() override {
    deviceCount();
    return reason_;
  }
  Allocator* allocator(int index) override {
    COHORT_CHECK_T(IndexError, index >= 0 && index < deviceCount(), "cuda:{} does not exist ({} devices)", index,
                   deviceCount());
    return allocators_[static_cast<size_t>(index)];
  }
  // Synchronous for the caller: queued on the current stream of the CUDA device involved (so it
  // runs after the kernels that produced the data), then waited for.
  void copy(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t nbytes) override {
    int gpu = dstDevice.isCuda() ? dstDevice.index() : srcDevice.index();
    DeviceGuard g(gpu);
    cudaStream_t stream = detail::currentCudaStream(gpu);
    if (srcDevice.isCuda() && dstDevice.isCuda() && srcDevice != dstDevice) {
      // Between two GPUs: both devices' current work must be done first.
      COHORT_CUDA_CHECK(cudaStreamSynchronize(detail::currentCudaStream(srcDevice.index())));
      COHORT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dstDevice.index(), src, srcDevice.index(), nbytes, stream));
    } else {
      cudaMemcpyKind kind = srcDevice.isCpu()   ? cudaMemcpyHostToDevice
                            : dstDevice.isCpu() ? cudaMemcpyDeviceToHost
                                                : cudaMemcpyDeviceToDevice;
      COHORT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
    }
    COHORT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  std::once_flag probe_;
  int count_ = 0;
  std::string reason_;
  std::vector<Allocator*> allocators_;
};

const bool kRegistered = [] {
  static CudaRuntime* rt = new CudaRuntime();
  registerDeviceRuntime(DeviceType::CUDA, rt);
  return true;
}();

}  // namespace
}  // namespace cohort::cuda
