/*
 * ProcessGroup: what training code talks to. A group of `size` processes, this one being `rank`,
 * that meet through a Store and run collectives on one Backend per device type. Today only CPU
 * tensors have one (gloo, shm, mpi or hierarchical); no backend serves CUDA tensors yet.
 *
 * Every collective:
 *  - validates its arguments (ValueError naming the op, the group and the offending shapes/dtypes);
 *  - gets the group's next sequence number (the same on every rank, since every rank calls the
 *    same collectives in the same order — which is what COHORT_DEBUG=DETAIL checks);
 *  - is recorded in the flight recorder (op, seq, shapes, dtype, start/end, state);
 *  - returns a Work at once; Work::wait() throws TimeoutError naming the op, group, sequence
 *    number and the ranks that never reached it (each rank publishes "<last started> <last
 *    completed> <last failed>" under "progress/<rank>" in the group's store, from a background
 *    thread so the op's hot path never waits on the store).
 * Send/recv are point to point: they take no sequence number (ranks that do not take part would
 * fall out of step) and their Work is labelled with the peer and tag instead.
 * The group's store() is the given store under the prefix "<name>/" for a world group, and the
 * parent's under "sub<k>/" for a subgroup, so groups sharing one store never collide.
 *
 * Subgroups (newGroup, split) are independent ProcessGroups with their own sequence numbers,
 * store prefix and backend instances, so they may run collectives concurrently with the world.
 * Thread model: collectives may be issued from any one thread at a time per group (as c10d);
 * completion callbacks run on the thread that completes the op: a backend thread, or the issuing
 * thread when the backend ran the op there (shm and mpi by default; docs/thread_model.md).
 */
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/util/function_ref.h>
#include <cohort/distributed/backend.h>
#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/store/store.h>
#include <cohort/distributed/work.h>

namespace cohort::dist {

class FlightRecorder;
class HangDiagnoser;
class ProgressPublisher;
struct CollectiveFingerprint;

enum class DebugLevel { Off, Info, Detail };
DebugLevel debugLevelFromEnv();  // COHORT_DEBUG=OFF|INFO|DETAIL

struct ProcessGroupOptions {
  std::string name = "world";
  Millis timeout = kDefaultGroupTimeout;
  // Backends, as c10d's init_process_group takes them:
  //  - "auto": for CPU tensors shm when every rank is on one node (and shm is built), hierarchical
  //    when there are several nodes and some node has several ranks, else gloo; for CUDA tensors
  //    nccl when this build has it;
  //  - a registered name ("gloo", "mpi", "shm", "hierarchical", "nccl", "fake"): it serves the
  //    device types it supports ("nccl": CUDA tensors only, as c10d's "nccl");
  //  - per device type: "cpu:gloo,cuda:nccl" ("cpu:auto" for the CPU choice above).
  // Ops go to the backend of their tensors' device type (a barrier to the CPU one when there is
  // one). Subgroups choose again for their ranks.
  std::string backend = "auto";
  // This rank's node for grouping ranks by host; empty: COHORT_NODE_ID, else the hostname.
  // Ranks that are threads of one process set it to simulate several nodes.
  std::string nodeId{};
  DebugLevel debug = DebugLevel::Off;  // overridden by COHORT_DEBUG when set
  // Ops the group's flight recorder keeps (0: none); overridden by COHORT_FLIGHT_RECORDER_ENTRIES.
  size_t flightRecorderEntries = 2000;
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // Collective over all `size` ranks (they rendezvous through `store`).
  static std::shared_ptr<ProcessGroup> create(StorePtr store, int rank, int size, ProcessGroupOptions opts = {});
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return opts_.name; }
  Millis timeout() const { return opts_.timeout; }
  const StorePtr& store() const { return store_; }
  // This group's members as world ranks (identity for the world group).
  const std::vector<int>& globalRanks() const { return globalRanks_; }
  uint64_t sequenceNumber() const { return seq_; }
  FlightRecorder& flightRecorder() { return *recorder_; }
  DebugLevel debugLevel() const { return opts_.debug; }

  void setBackend(DeviceType type, BackendPtr backend);
  Backend& backend(DeviceType type) const;  // NotSupportedError when none serves that device
  bool supports(OpType op, DeviceType type = DeviceType::CPU) const;

  WorkPtr allreduce(Tensor& tensor, const AllreduceOptions& opts = {});
  WorkPtr allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts = {});
  WorkPtr broadcast(Tensor& tensor, const BroadcastOptions& opts = {});
  WorkPtr reduce(Tensor& tensor, const ReduceOptions& opts = {});
  WorkPtr allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts = {});
  WorkPtr allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts = {});
  WorkPtr allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                             const AllgatherOptions& opts = {});
  WorkPtr reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts = {});
  WorkPtr reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts = {});
  WorkPtr alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts = {});
  WorkPtr alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const AlltoallOptions& opts = {});
  WorkPtr gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts = {});
  WorkPtr scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts = {});
  WorkPtr barrier(const BarrierOptions& opts = {});
  WorkPtr send(const Tensor& tensor, int dst, const SendRecvOptions& opts = {});
  WorkPtr recv(Tensor& tensor, int src, const SendRecvOptions& opts = {});

  // A zeroed tensor for repeated communication. On the CPU the CPU backend places it (Backend::
  // allocateCommBuffer: on shm, memory every rank maps, so allreduces of it copy nothing); on
  // another device it is plain device memory, and NotSupportedError when no backend of this group
  // serves that device. Collective: every rank calls it in the same order with the same sizes and
  // dtype.
  Tensor allocateCommBuffer(const Shape& sizes, DType dtype, Device device = Device::cpu());

  // Subgroups. Both are collective over this group: every member calls them, in the same order.
  // newGroup returns null on ranks not in `ranks`; split groups ranks by color (negative color =
  // no group), ordered by (key, rank).
  std::shared_ptr<ProcessGroup> newGroup(const std::vector<int>& ranks, ProcessGroupOptions opts = {});
  std::shared_ptr<ProcessGroup> split(int color, int key, ProcessGroupOptions opts = {});

 private:
  ProcessGroup(StorePtr store, int rank, int size, ProcessGroupOptions opts, std::vector<int> globalRanks);
  void initBackends();
  std::string chooseCpuBackend(const std::vector<std::string>& nodeIds) const;
  // Backend::splitInto on each of this group's backends, on every rank (members and not).
  void splitBackends(int color, int key, ProcessGroup* sub);
  std::shared_ptr<ProcessGroup> makeSubgroup(const std::string& prefix, const std::vector<int>& parentRanks,
                                             int subRank, ProcessGroupOptions opts);
  // Checks the backend serving `device` supports `op` (NotSupportedError otherwise).
  const BackendPtr& backendFor(OpType op, DeviceType device) const;
  // Assigns the next sequence number (collectives) or a label (send/recv), records the op and
  // publishes this rank's progress; the Work updates both when it completes.
  // Under COHORT_DEBUG=DETAIL, `fingerprint` is checked against every other rank's call first.
  // `record(shapes, detail)` writes the flight-recorder text in place; `fingerprint` is only
  // called under DETAIL. Both are references to the caller's lambdas: nothing allocated for them.
  using RecordFn = FunctionRef<void(std::string& shapes, std::string& detail)>;
  using FingerprintFn = FunctionRef<CollectiveFingerprint()>;
  WorkPtr startWork(OpType op, Millis timeout, RecordFn record, FingerprintFn fingerprint, std::string p2pLabel = "");
  // Runs the backend call; a synchronous throw fails the Work and propagates.
  template <typename F>
  WorkPtr launch(const WorkPtr& work, const BackendPtr& backend, F&& call);

  StorePtr store_;
  int rank_;
  int size_;
  ProcessGroupOptions opts_;
  std::vector<int> globalRanks_;
  uint64_t seq_ = 0;
  uint64_t subgroupCounter_ = 0;
  std::map<DeviceType, BackendPtr> backends_;
  std::shared_ptr<FlightRecorder> recorder_;
  // The debugging aids of debug/detail/: this rank's published progress ("<group store>/
  // progress/<rank>"), the diagnosis of failed collectives (the observer holds it weakly, so
  // none runs once the group is being destroyed), and the one Work::Observer every Work of the
  // group reports its completion to (flight recorder, progress) and asks for that diagnosis.
  std::shared_ptr<ProgressPublisher> progress_;
  std::shared_ptr<const HangDiagnoser> diagnoser_;
  std::shared_ptr<Work::Observer> observer_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace cohort::dist
