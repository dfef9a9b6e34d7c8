/*
 * HierarchicalBackend: collectives for jobs on several nodes with several ranks per node,
 * registered as "hierarchical". Only one hop per node touches the network.
 *
 * Topology. At creation every rank publishes its node id (BackendOptions::nodeId, else
 * COHORT_NODE_ID, else the hostname; see distributed/topology.h) through the group's store —
 * unless ProcessGroup already exchanged them (BackendOptions::nodeIds). Ranks with one id form a
 * node; the lowest rank of each node is its leader. Three inner backends, each an ordinary
 * registered backend over a prefix of the group's store:
 *  - intra: "shm" over the ranks of this node (none when the node has one rank);
 *  - inter: COHORT_HIERARCHICAL_INTER (default "gloo", or "mpi") over the leaders, leaders only
 *    (none when there is one node);
 *  - flat: the same transport over the whole group, for every op not done hierarchically.
 *
 * Ops done in stages (on this backend's worker thread, in issue order):
 *  - allreduce (and its coalesced form, packed into one buffer): reduce to the leader over shm →
 *    allreduce across leaders → broadcast from the leader over shm. Avg runs as Sum and divides
 *    once at the end; float16/bfloat16 sums and products travel as float32 and are rounded once.
 *  - broadcast: over shm from the root on the root's node, across leaders from the root's leader,
 *    then over shm from the leader on the other nodes.
 *  - reduce: to each leader over shm, across leaders to the root's leader, then (when the root is
 *    not its node's leader) over shm to the root. Non-root tensors are left as they were.
 *  - allgather (list and tensor forms): gather to the leader over shm, allgather across leaders
 *    (each node's block padded to the largest node), broadcast of the whole result over shm.
 * Every other op (reduce_scatter, alltoall, gather, scatter, barrier, allgather_coalesced,
 * send/recv) is handed to the flat backend as is: it completes the group's Work itself.
 *
 * Errors and deadlines. Each stage is an inner Work whose deadline is what is left of the op's;
 * the op waits for it no longer than that. A stage's failure fails the op with the same kind of
 * error (TimeoutError, PeerError, else DistError) named after the op, the group and the sequence
 * number, with the stage (and its members as group ranks) and the inner error as detail. After a
 * failure all three inner backends are aborted, so peers blocked in any stage on this rank fail
 * promptly too (a dead non-leader → its leader fails the shm stage → the other leaders fail the
 * network stage → their nodes fail the final shm stage), and later ops fail at once.
 *
 * Threads. The caller enqueues; one worker thread per group runs the staged ops. Flat ops go to
 * the flat backend's own thread directly, so a staged op and a flat op issued after it may run at
 * the same time (on different transports): as with any asynchronous backend, wait for an op
 * before handing its tensors to another.
 */
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cohort/distributed/backend.h>
#include <cohort/distributed/topology.h>

namespace cohort::dist {
class OpQueue;  // detail/op_queue.h
}  // namespace cohort::dist

namespace cohort::dist::hierarchical_backend {

class HierarchicalBackend : public Backend {
 public:
  HierarchicalBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts);
  ~HierarchicalBackend() override;

  bool supports(OpType op) const override { return flat_->supports(op); }

  void allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) override;
  void allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) override;
  void broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) override;
  void reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) override;
  void allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts,
                 const WorkPtr& work) override;
  void allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts,
                           const WorkPtr& work) override;
  void allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                          const AllgatherOptions& opts, const WorkPtr& work) override;
  void reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                     const WorkPtr& work) override;
  void reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                           const WorkPtr& work) override;
  void alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) override;
  void alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const AlltoallOptions& opts,
                    const WorkPtr& work) override;
  void gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
              const WorkPtr& work) override;
  void scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
               const WorkPtr& work) override;
  void barrier(const BarrierOptions& opts, const WorkPtr& work) override;
  void send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) override;
  void recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) override;

  void abort(const std::string& reason) override;

  const NodeLayout& layout() const { return layout_; }
  bool isLeader() const { return layout_.localRank[rank()] == 0; }

 private:
  enum class FailKind { Timeout, Peer, Other };
  struct Failure {  // a stage failed; run() maps it onto the op's typed error
    FailKind kind;
    std::string detail;
  };

  // Queues `body` for the worker, which fails the Work at once when the backend is broken, else
  // runs it and completes the Work with its outputs or its typed error.
  void run(const WorkPtr& work, std::function<std::vector<Tensor>(const WorkPtr&)> body);
  void breakWith(const std::string& reason);

  // One stage: `call` starts an op of `inner` on a fresh inner Work (deadline: what is left of
  // `outer`'s); waits for it within that deadline; throws Failure naming `stage` when it fails.
  void stage(const WorkPtr& outer, OpType op, const BackendPtr& inner, const std::string& stage,
             const std::function<void(const WorkPtr&)>& call);

  // The staged algorithms (hierarchical_ops.cc), run on the worker.
  void allreduceStaged(Tensor& tensor, ReduceOp op, const WorkPtr& work);
  void broadcastStaged(Tensor& tensor, int root, const WorkPtr& work);
  void reduceStaged(Tensor& tensor, ReduceOp op, int root, const WorkPtr& work);
  // Every rank's `input` into `full` ([size * input.numel()], rank order).
  void allgatherStaged(Tensor& full, const Tensor& input, const WorkPtr& work);

  std::string group_;
  NodeLayout layout_;
  std::string intraName_, interName_;  // "world/node1 (ranks [2, 3])", for error messages
  BackendPtr intra_;                   // shm over this node's ranks; null when the node has one rank
  BackendPtr inter_;                   // across the leaders; null on non-leaders and when there is one node
  BackendPtr flat_;                    // the whole group

  std::mutex mu_;  // broken_, brokenReason_
  bool broken_ = false;
  std::string brokenReason_;
  std::unique_ptr<OpQueue> ops_;  // every op, in issue order
};

}  // namespace cohort::dist::hierarchical_backend
