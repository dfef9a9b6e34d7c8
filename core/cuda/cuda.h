/*
 * CUDA streams, events, pinned host memory and the knobs of the CUDA kernels. This header needs no
 * CUDA headers and exists in every build: in a build without CUDA (or with no GPU visible) the
 * functions that need a device throw NotSupportedError saying why, and isAvailable() is false.
 *
 * Streams follow PyTorch's model. Every thread has a current stream per device, the device's
 * default stream until changed; kernels and copies for tensors on a device are queued on its
 * current stream and return without waiting. Work on one stream runs in order; work on two streams
 * is ordered only through events. Memory freed by a tensor goes back to the caching allocator's
 * pool for the stream it was allocated on and is reused by later work on that stream; a tensor
 * used on another stream must be announced with recordStream() so its memory is not reused before
 * that stream is done with it.
 */
#pragma once

#include <cstdint>
#include <string>

#include <cohort/core/tensor/caching_allocator.h>
#include <cohort/core/tensor/device.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::cuda {

bool isAvailable();  // this build has CUDA and the runtime sees at least one device
int deviceCount();
int currentDevice();
void setDevice(int index);
// Waits until all work queued on every stream of the device (the current device by default) is done.
void synchronize(int device = -1);

class Stream {
 public:
  Stream() = default;  // the default stream of device 0
  Device device() const { return Device::cuda(device_); }
  int deviceIndex() const { return device_; }
  // The cudaStream_t, for calling CUDA libraries on it (cast back with reinterpret_cast).
  void* handle() const { return handle_; }
  bool isDefault() const { return handle_ == nullptr; }
  // True when all work queued so far has finished.
  bool query() const;
  void synchronize() const;
  bool operator==(const Stream& o) const { return device_ == o.device_ && handle_ == o.handle_; }
  std::string str() const;

  // Wraps an existing cudaStream_t of `device` (not owned).
  static Stream fromHandle(int device, void* handle) { return Stream(device, handle); }

 private:
  Stream(int device, void* handle) : device_(device), handle_(handle) {}
  int device_ = 0;
  void* handle_ = nullptr;  // nullptr = the legacy default stream
};

Stream defaultStream(int device = -1);
Stream currentStream(int device = -1);
// Makes `s` the calling thread's current stream for its device.
void setCurrentStream(const Stream& s);
// A stream from a per-device pool of non-blocking streams (created once, reused round-robin).
Stream streamFromPool(int device = -1, bool highPriority = false);

// Makes a stream (and its device) current for a scope, restoring both at the end.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int prevDevice_;
  Stream prevStream_;
};

// Makes a device current for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

class Event {
 public:
  // timing: the event can measure elapsed time (costs a little; off by default as in CUDA).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `s` so far (the current stream by default).
  void record();
  void record(const Stream& s);
  // Makes later work on `s` wait for the captured work; the host does not block.
  void block(const Stream& s) const;
  bool query() const;  // captured work done (true for an event never recorded)
  void synchronize() const;
  // Milliseconds between this event and `end`, both recorded with timing = true and complete.
  float elapsedMs(const Event& end) const;
  bool recorded() const { return handle_ != nullptr; }

 private:
  bool timing_;
  int device_ = -1;
  void* handle_ = nullptr;  // cudaEvent_t, created at the first record
};

// Announces that `t`'s memory is used by work on `s`: when t's storage is freed, its block is reused
// only after the work queued on `s` up to that moment has finished.
void recordStream(const Tensor& t, const Stream& s);

// The caching allocator's figures for a device (segments, cache hits, splits, held-back frees);
// memoryStats(Device::cuda(i)) gives the bytes live and peak as for every device.
CachingAllocatorStats allocatorStats(int device = -1);

// Host memory that the GPU can copy asynchronously (page-locked), from a caching pool. The tensor
// is a CPU tensor; to(Device, nonBlocking = true) from or into it does not block the host.
Tensor pinnedEmpty(const Shape& shape, DType dtype = DType::Float32);
bool isPinned(const Tensor& t);

// Copies `t` to `device` (either side may be the CPU) on the current stream of the CUDA device
// involved. With nonBlocking and pinned host memory (or device to device) the host does not wait;
// otherwise the call returns when the data has arrived.
Tensor copyTo(const Tensor& t, Device device, bool nonBlocking);

// float32 matrix products may use TF32 tensor cores (about 10 bits of mantissa in the products).
// Off by default: float32 GEMMs then compute in full float32, as on the CPU.
void setAllowTf32(bool allow);
bool allowTf32();

}  // namespace cohort::cuda
