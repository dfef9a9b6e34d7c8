// CUDA device storage: an allocator over cudaMalloc and copies between host and devices.
// Built only when COHORT_USE_CUDA; registers itself with the device registry at load, so core code
// reaches it without any #if. No kernel runs on CUDA tensors yet: kernels refuse them with a
// NotSupportedError (Tensor::dataPtr).
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include <cohort/core/tensor/allocator.h>
#include <cohort/core/util/check.h>

namespace cohort {
namespace {

void checkCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(fmt::format("CUDA {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }

 protected:
  void* rawAllocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    checkCuda(cudaSetDevice(index_), "cudaSetDevice");
    void* p = nullptr;
    if (cudaMalloc(&p, nbytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky allocation error; Allocator::allocate reports OOM
      return nullptr;
    }
    return p;
  }
  void rawDeallocate(void* p, size_t) override {
    if (p != nullptr) cudaFree(p);
  }

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
      for (int i = 0; i < n; ++i) allocators_.push_back(new CudaAllocator(i));  // live for the process
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
  void copy(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t nbytes) override {
    cudaMemcpyKind kind = srcDevice.isCpu()   ? cudaMemcpyHostToDevice
                          : dstDevice.isCpu() ? cudaMemcpyDeviceToHost
                                              : cudaMemcpyDeviceToDevice;
    checkCuda(cudaSetDevice(dstDevice.isCuda() ? dstDevice.index() : srcDevice.index()), "cudaSetDevice");
    checkCuda(cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy");
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
}  // namespace cohort
