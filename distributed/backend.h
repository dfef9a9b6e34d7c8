/*
 * Backend: one transport's implementation of the collectives (gloo, mpi, shm, hierarchical), for
 * one process group. ProcessGroup validates arguments, assigns the sequence number, records the op
 * in the flight recorder and creates the Work; then it calls the backend, which completes `work`
 * (Work::finish / Work::fail) in one of two ways:
 *  - on the caller's thread, before it returns: shm and mpi do this by default
 *    (COHORT_COLLECTIVE_THREAD=caller, collectiveThreadFromEnv below), since handing a small op to another thread
 *    costs more than the op; the caller is blocked for the op's duration;
 *  - on its own threads, returning at once: gloo, hierarchical, and shm and mpi in worker mode.
 * Either way no op stays pending past its deadline: a caller-thread op bounds every wait by it
 * (shm), or a watchdog acts at the deadline (mpi, which ends the job then, since MPI cannot
 * interrupt a blocking call; mpi/mpi_backend.h).
 *
 * Tensors arrive validated (same dtype and shape rules as the op requires, contiguous, on a
 * device the backend supports). float16/bfloat16 reductions accumulate in float32.
 * Every op a backend does not override throws NotSupportedError "backend <name> does not
 * support <op>"; supports(op) answers in advance.
 *
 * Backends are created by name through the registry (registerBackend / createBackend), so core
 * and ProcessGroup code never tests which backends were built.
 */
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/store/store.h>
#include <cohort/distributed/work.h>

namespace cohort::dist {

class Backend {
 public:
  Backend(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual bool supports(OpType /*op*/) const { return false; }
  virtual bool supportsDevice(DeviceType type) const { return type == DeviceType::CPU; }

  virtual void allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work);
  virtual void allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work);
  virtual void broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work);
  virtual void reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work);
  virtual void allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts,
                         const WorkPtr& work);
  virtual void allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts,
                                   const WorkPtr& work);
  virtual void allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                  const AllgatherOptions& opts, const WorkPtr& work);
  virtual void reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                             const WorkPtr& work);
  virtual void reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                   const WorkPtr& work);
  // Equal splits along dim 0 when the options' split sizes are empty, else AlltoallV.
  virtual void alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work);
  virtual void alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const AlltoallOptions& opts,
                            const WorkPtr& work);
  // outputs is used on the root only (size() tensors shaped like input).
  virtual void gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                      const WorkPtr& work);
  // inputs is used on the root only.
  virtual void scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                       const WorkPtr& work);
  virtual void barrier(const BarrierOptions& opts, const WorkPtr& work);
  virtual void send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work);
  virtual void recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work);

  // Memory for a tensor this group will communicate again and again (DDP's buckets): a zeroed
  // contiguous tensor of `sizes` and `dtype` that the backend may place where its collectives
  // reach it without a copy (shm: a shared segment that every rank maps, so that an allreduce of
  // it reads and writes the peers' buffers directly). Collective where the backend places it:
  // every rank calls it in the same order with the same sizes and dtype, and a mismatch is a
  // DistError on every rank. The default is plain memory and involves no peer.
  virtual Tensor allocateCommBuffer(const Shape& sizes, DType dtype, Millis timeout);

  // Called by ProcessGroup on every rank of this group, in the same order, when a subgroup is
  // made (newGroup, split): `color` is the subgroup's (negative on ranks outside it), `key` the
  // rank's place in it, `child` the subgroup's backend for the same device type on its members
  // (null elsewhere). A backend that can derive the subgroup's transport from its own does it
  // here (nccl: ncclCommSplit, collective over this group); the default does nothing.
  virtual void splitInto(int /*color*/, int /*key*/, Backend* /*child*/) {}

  // Stops all transport activity: pending and future ops fail with `reason`. Used when a peer is
  // known dead or on timeout, so no thread stays blocked. Idempotent.
  virtual void abort(const std::string& /*reason*/) {}

 protected:
  [[noreturn]] void unsupported(OpType op) const;
  // The key to Work's completion API (work.h): finish, fail, setAbort, setLabel... Every backend
  // completes its Works with it; helpers a backend runs its ops on (its queue) get it from it.
  static Work::CompletionKey completionKey() { return {}; }

 private:
  std::string name_;
  int rank_;
  int size_;
};

using BackendPtr = std::shared_ptr<Backend>;

struct BackendOptions {
  std::string groupName = "world";
  Millis timeout = kDefaultGroupTimeout;
  std::vector<int> globalRanks{};  // this group's members as ranks of the world group
  // This rank's node (empty: COHORT_NODE_ID, else the hostname; see topology.h), and every rank's
  // when the group already exchanged them (empty: a backend that needs them exchanges them).
  std::string nodeId{};
  std::vector<std::string> nodeIds{};
  // The group's own store (the backend's `store` is it under "backend/<name>/"), where
  // ProcessGroup publishes what each rank issued: the communicator backends' watchdog reads it
  // to name the ranks that never reached an op (watchdog/watchdog.h). May be null.
  StorePtr groupStore{};
};

// Where a backend that has the choice (shm, mpi) runs its collectives, from
// COHORT_COLLECTIVE_THREAD=caller|worker (default caller): on the issuing thread, the Work complete
// on return, or on one worker thread per group, the Work asynchronous. Read when a backend is
// created. Throws ValueError naming the variable for any other value, and also when a variable it
// was renamed from is set: COHORT_SHM_THREAD (renamed) or COHORT_MPI_COLLECTIVE_THREAD (renamed).
enum class CollectiveThread { Caller, Worker };
CollectiveThread collectiveThreadFromEnv();

// Makes a backend for one process group. `store` is already prefixed for this group.
using BackendFactory = std::function<BackendPtr(const StorePtr& store, int rank, int size, const BackendOptions&)>;
void registerBackend(const std::string& name, BackendFactory factory);
bool hasBackend(const std::string& name);
std::vector<std::string> availableBackends();
// Throws NotSupportedError listing the available backends when `name` is unknown.
BackendPtr createBackend(const std::string& name, const StorePtr& store, int rank, int size,
                         const BackendOptions& opts);

}  // namespace cohort::dist
