#include <cohort/distributed/nccl/nccl_communicator.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>

namespace cohort::dist::nccl {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<UniqueId>, "UniqueId must hold an ncclUniqueId");

namespace {

[[noreturn]] void throwNccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  throw DistError(fmt::format("NCCL error in {}: {}{}{}", what, ncclGetErrorString(r), last && *last ? ": " : "",
                              last ? last : ""));
}

#define COHORT_NCCL_CHECK(expr, comm)                                          \
  do {                                                                         \
    ncclResult_t cohort_nccl_r_ = (expr);                                      \
    if (cohort_nccl_r_ != ncclSuccess) throwNccl(cohort_nccl_r_, #expr, comm); \
  } while (0)

ncclDataType_t ncclType(DType d) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int64: return ncclInt64;
    case DType::Int32: return ncclInt32;
    case DType::UInt8: return ncclUint8;
    case DType::Bool: return ncclUint8;
  }
  throw ValueError(fmt::format("NCCL: unsupported dtype {}", dtypeName(d)));
}

ncclRedOp_t ncclOp(ReduceOp op, DType d) {
  if (d == DType::Bool) {  // 0/1 bytes: or = max, and = min
    return op == ReduceOp::Product || op == ReduceOp::Min ? ncclMin : ncclMax;
  }
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// Restores the calling thread's device (NCCL launches on the communicator's, but the events and
// the host-side CUDA calls around them go to the current one).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
  }
  ~CurrentDevice() {
    int now = -1;
    cudaGetDevice(&now);
    if (now != prev_) cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

UniqueId makeUniqueId() {
  ncclUniqueId id;
  COHORT_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  UniqueId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

UniqueId exchangeUniqueId(Store& store, const std::string& key, int rank, Millis timeout) {
  if (rank == 0) {
    UniqueId id = makeUniqueId();
    store.set(key, Bytes(id.begin(), id.end()));
    return id;
  }
  store.wait({key}, timeout);
  Bytes b = store.get(key);
  UniqueId id;
  if (b.size() != id.size()) {
    throw DistError(fmt::format("NCCL unique id under '{}' in {} has {} bytes, expected {}", key, store.describe(),
                                b.size(), id.size()));
  }
  std::memcpy(id.data(), b.data(), id.size());
  return id;
}

std::string version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, int device)
    : comm_(comm), rank_(rank), size_(size), device_(device) {}

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(const UniqueId& id, int rank, int size, int device) {
  CurrentDevice guard(device);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclComm_t comm = nullptr;
  COHORT_NCCL_CHECK(ncclCommInitRank(&comm, size, uid, rank), nullptr);
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(comm, rank, size, device));
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::split(NcclCommunicator& parent, int color, int key) {
  std::lock_guard<std::timed_mutex> lock(parent.mu_);
  if (parent.aborted()) throw DistError(fmt::format("{}: cannot split an aborted communicator", parent.describe()));
  CurrentDevice guard(parent.device_);
  ncclComm_t comm = nullptr;
  COHORT_NCCL_CHECK(ncclCommSplit(parent.comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, nullptr),
                    parent.comm_);
  if (color < 0 || comm == nullptr) return nullptr;
  int rank = 0, size = 0;
  COHORT_NCCL_CHECK(ncclCommUserRank(comm, &rank), comm);
  COHORT_NCCL_CHECK(ncclCommCount(comm, &size), comm);
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(comm, rank, size, parent.device_));
}

NcclCommunicator::~NcclCommunicator() {
  if (aborted() || comm_ == nullptr) return;
  // A communicator still held when the process exits (by the default process group, a global
  // destroyed after main returns) can outlive the CUDA runtime. The runtime then answers every
  // call with cudaErrorCudartUnloading and has released the device's resources: nothing is left to
  // destroy, and ncclCommDestroy could only fail.
  int current = 0;
  const cudaError_t state = cudaGetDevice(&current);
  if (state == cudaErrorCudartUnloading) return;
  CurrentDevice guard(device_);
  ncclResult_t r = ncclCommDestroy(comm_);
  if (r != ncclSuccess) {
    COHORT_LOG(Warning, "{}: ncclCommDestroy: {} (the CUDA runtime had answered {})", describe(), ncclGetErrorString(r),
               cudaGetErrorName(state));
  }
}

std::string NcclCommunicator::describe() const {
  return fmt::format("NCCL communicator of rank {} of {} on cuda:{}", rank_, size_, device_);
}

CommCompletionPtr NcclCommunicator::enqueue(std::span<const CommOp> ops, void* streamHandle) {
  std::lock_guard<std::timed_mutex> lock(mu_);
  if (aborted()) throw DistError(fmt::format("{} was aborted", describe()));
  CurrentDevice guard(device_);
  auto stream = static_cast<cudaStream_t>(streamHandle);
  const cuda::Stream s = cuda::Stream::fromHandle(device_, streamHandle);
  auto c = std::make_shared<NcclCompletion>();
  c->start.record(s);
  bool group = ops.size() > 1;
  for (const CommOp& op : ops) group = group || op.kind == CommOpKind::Send || op.kind == CommOpKind::Recv;
  if (group) COHORT_NCCL_CHECK(ncclGroupStart(), comm_);
  try {
    for (const CommOp& op : ops) {
      if (op.count == 0) continue;
      const ncclDataType_t t = ncclType(op.dtype);
      const ncclRedOp_t r = ncclOp(op.op, op.dtype);
      switch (op.kind) {
        case CommOpKind::Allreduce:
          COHORT_NCCL_CHECK(ncclAllReduce(op.send, op.recv, op.count, t, r, comm_, stream), comm_);
          break;
        case CommOpKind::Broadcast:
          COHORT_NCCL_CHECK(ncclBroadcast(op.send ? op.send : op.recv, op.recv, op.count, t, op.peer, comm_, stream),
                            comm_);
          break;
        case CommOpKind::Reduce:
          COHORT_NCCL_CHECK(ncclReduce(op.send, op.recv, op.count, t, r, op.peer, comm_, stream), comm_);
          break;
        case CommOpKind::Allgather:
          COHORT_NCCL_CHECK(ncclAllGather(op.send, op.recv, op.count, t, comm_, stream), comm_);
          break;
        case CommOpKind::ReduceScatter:
          COHORT_NCCL_CHECK(ncclReduceScatter(op.send, op.recv, op.count, t, r, comm_, stream), comm_);
          break;
        case CommOpKind::Send: COHORT_NCCL_CHECK(ncclSend(op.send, op.count, t, op.peer, comm_, stream), comm_); break;
        case CommOpKind::Recv: COHORT_NCCL_CHECK(ncclRecv(op.recv, op.count, t, op.peer, comm_, stream), comm_); break;
      }
    }
  } catch (...) {
    if (group) ncclGroupEnd();  // leave NCCL's group state balanced; its own error is the one thrown
    throw;
  }
  if (group) COHORT_NCCL_CHECK(ncclGroupEnd(), comm_);
  c->end.record(s);
  return c;
}

std::string NcclCommunicator::asyncError() {
  if (aborted()) return "";
  // Never wait behind an enqueue: the watchdog asks again in a moment.
  std::unique_lock<std::timed_mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || aborted()) return "";
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(r));
  if (state == ncclSuccess || state == ncclInProgress) return "";
  const char* last = ncclGetLastError(comm_);
  return fmt::format("{}{}{}", ncclGetErrorString(state), last && *last ? ": " : "", last ? last : "");
}

void NcclCommunicator::abort() {
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::seconds(2))) {
    COHORT_LOG(Warning, "{}: an enqueue has been inside NCCL for 2 s; aborting the communicator under it", describe());
  }
  if (aborted_.exchange(true)) return;
  CurrentDevice guard(device_);
  ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess) COHORT_LOG(Warning, "{}: ncclCommAbort: {}", describe(), ncclGetErrorString(r));
}

}  // namespace cohort::dist::nccl
