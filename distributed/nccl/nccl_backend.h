/*
 * NcclBackend: the collectives on CUDA tensors over NCCL, registered as "nccl" (built with
 * COHORT_USE_NCCL). A communicator backend (watchdog/comm_backend.h): ProcessGroup numbers and
 * records every op as for the CPU backends, the ops map onto NCCL as comm_backend.h lists, and
 * the watchdog (watchdog/watchdog.h) completes the Works and handles timeouts and errors.
 *
 * Communicators. One per CUDA device the group's tensors live on, made at the first op on that
 * device (as c10d, lazily: a group that never touches a GPU never creates one): rank 0 makes the
 * NCCL unique id and publishes it in the group's store ("uid/<n>" under the backend's prefix),
 * every rank joins with ncclCommInitRank. Every rank must therefore issue its first op on a
 * device at the same point, which a correct program does. A subgroup whose parent already has a
 * communicator is made from it with ncclCommSplit instead (no store round, shares the parent's
 * resources): ProcessGroup calls splitInto() on every rank of the parent, members and not.
 *
 * Streams. Each communicator has its own stream (from the device's pool). An op: that stream
 * waits for everything queued so far on the caller's current stream (an event, no host wait),
 * NCCL runs on it between a start and an end event, and every tensor the op touches is announced
 * to the caching allocator with cuda::recordStream, so memory the caller frees meanwhile is not
 * reused before the op is done; the watchdog also holds the tensors until the end event fired.
 * Work::wait() makes the caller's current stream wait for the end event and returns without
 * blocking the host (Work::setDeviceWait); result() is then usable on that stream. A barrier's
 * wait does block the host (it is a host barrier), and so does every wait with
 * COHORT_NCCL_BLOCKING_WAIT=1 (c10d's TORCH_NCCL_BLOCKING_WAIT) or wait(timeout). The Work
 * completes (isCompleted, future()) when the end event fired.
 *
 * Failures: the watchdog's (timeouts with the ranks that never arrived, ncclCommGetAsyncError,
 * abort; flight recorders dumped first; ncclCommAbort; every pending and later op of the group
 * fails on every rank; COHORT_WATCHDOG_KILL=1 ends the process instead).
 */
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include <cohort/core/cuda/cuda.h>
#include <cohort/distributed/watchdog/comm_backend.h>

namespace cohort::dist::nccl {

class NcclCommunicator;

class NcclBackend : public CommBackend {
 public:
  NcclBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts);
  ~NcclBackend() override;

  bool supportsDevice(DeviceType type) const override { return type == DeviceType::CUDA; }

  // ncclCommSplit of every communicator this backend has, for a subgroup being made (Backend::
  // splitInto): the members' communicators go to `child` when it is an NcclBackend.
  void splitInto(int color, int key, Backend* child) override;
  // The communicators this backend has, by device (for tests).
  std::vector<int> devices() const;

 protected:
  Target prepare(Device device) override;
  void* address(const Tensor& t) const override;
  void launched(Device device, const Target& target, const CommCompletionPtr& done, const std::vector<Tensor>& tensors,
                const std::vector<Tensor>& outputs, const WorkPtr& work, bool barrier) override;
  Tensor barrierTensor() override;

 private:
  struct DeviceComm {
    std::shared_ptr<NcclCommunicator> comm;
    cuda::Stream stream;
    cuda::Event sync;  // the caller's stream -> ours; reused (a wait takes the event as recorded then)
    Tensor barrier;
  };
  DeviceComm& deviceComm(int device);  // mu_ held
  void adopt(int device, std::shared_ptr<NcclCommunicator> comm);

  StorePtr store_;
  Millis timeout_;
  bool blockingWait_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<DeviceComm>> comms_;
  uint64_t created_ = 0;  // communicators made through the store (the unique id's key)
};

}  // namespace cohort::dist::nccl
