#include <cohort/distributed/nccl/nccl_backend.h>

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/nccl/nccl_communicator.h>

namespace cohort::dist::nccl {

COHORT_ENV_KNOB(kBlockingWait, "COHORT_NCCL_BLOCKING_WAIT", "0",
                "1: Work::wait() on an NCCL op blocks the host until the op finished on the GPU (and throws its "
                "error there); 0: wait() makes the caller's current CUDA stream wait for the op, the host does not");

namespace {
const bool kRegistered = [] {
  registerBackend("nccl", [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    return std::make_shared<NcclBackend>(store, rank, size, opts);
  });
  return true;
}();
}  // namespace

NcclBackend::NcclBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts)
    : CommBackend("nccl", store, rank, size, opts), store_(store), timeout_(opts.timeout),
      blockingWait_(kBlockingWait.flag()) {
  (void)kRegistered;
}

NcclBackend::~NcclBackend() {
  // Ops still running on the GPU get a few seconds to finish; after that the watchdog aborts the
  // communicators (ncclCommAbort) and fails them. Then the communicators are destroyed.
  stopWatchdog(Millis(10'000));
}

std::vector<int> NcclBackend::devices() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [d, dc] : comms_) out.push_back(d);
  return out;
}

void NcclBackend::adopt(int device, std::shared_ptr<NcclCommunicator> comm) {
  auto dc = std::make_unique<DeviceComm>();
  dc->comm = std::move(comm);
  dc->stream = cuda::streamFromPool(device);
  watchdog_->addCommunicator(dc->comm);
  comms_[device] = std::move(dc);
}

NcclBackend::DeviceComm& NcclBackend::deviceComm(int device) {
  auto it = comms_.find(device);
  if (it != comms_.end()) return *it->second;
  if (!cuda::isAvailable()) {
    throw NotSupportedError(
        fmt::format("backend nccl in group '{}': no CUDA device is available to this process", group_));
  }
  const UniqueId id = exchangeUniqueId(*store_, fmt::format("uid/{}", created_++), rank(), timeout_);
  auto comm = NcclCommunicator::create(id, rank(), size(), device);
  if (rank() == 0) {
    COHORT_LOG(Info, "process group '{}': NCCL {} communicator of {} ranks made (rank 0 on cuda:{})", group_, version(),
               size(), device);
  }
  adopt(device, std::move(comm));
  return *comms_[device];
}

void NcclBackend::splitInto(int color, int key, Backend* child) {
  auto* target = dynamic_cast<NcclBackend*>(child);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device, dc] : comms_) {
    auto comm = NcclCommunicator::split(*dc->comm, color, key);
    if (comm && target) {
      std::lock_guard<std::mutex> childLock(target->mu_);
      if (!target->comms_.count(device)) target->adopt(device, std::move(comm));
    }
    // A member whose subgroup does not run NCCL drops its communicator here (ncclCommDestroy).
  }
}

CommBackend::Target NcclBackend::prepare(Device device) {
  if (!device.isCuda()) {
    throw NotSupportedError(fmt::format("backend nccl serves CUDA tensors, got a tensor on {}", device));
  }
  std::lock_guard<std::mutex> lock(mu_);
  DeviceComm& dc = deviceComm(device.index());
  // The op runs after everything the caller queued so far on its stream (which produced its
  // inputs), without the host waiting.
  dc.sync.record(cuda::currentStream(device.index()));
  dc.sync.block(dc.stream);
  return {dc.comm.get(), dc.stream.handle()};
}

void* NcclBackend::address(const Tensor& t) const { return cuda::detail::devicePtr(t); }

void NcclBackend::launched(Device device, const Target& target, const CommCompletionPtr& done,
                           const std::vector<Tensor>& tensors, const std::vector<Tensor>& outputs, const WorkPtr& work,
                           bool barrier) {
  const cuda::Stream stream = cuda::Stream::fromHandle(device.index(), target.stream);
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) cuda::recordStream(t, stream);
  }
  if (blockingWait_ || barrier) return;
  auto completion = std::static_pointer_cast<NcclCompletion>(done);
  const int index = device.index();
  work->setDeviceWait(
      completionKey(), [completion, index] { completion->end.block(cuda::currentStream(index)); }, outputs);
}

Tensor NcclBackend::barrierTensor() {
  std::lock_guard<std::mutex> lock(mu_);
  // The device the group already talks on, else the caller's current one.
  const int device = comms_.empty() ? cuda::currentDevice() : comms_.begin()->first;
  DeviceComm& dc = deviceComm(device);
  if (!dc.barrier.defined()) {
    // Its value does not matter; zeroed on the communicator's stream so nothing reads garbage.
    dc.barrier = empty({1}, TensorOptions{.dtype = DType::Float32, .device = Device::cuda(device)});
    cuda::DeviceGuard guard(device);
    COHORT_CUDA_CHECK(cudaMemsetAsync(cuda::detail::devicePtr(dc.barrier), 0, sizeof(float),
                                      static_cast<cudaStream_t>(dc.stream.handle())));
  }
  return dc.barrier;
}

}  // namespace cohort::dist::nccl
