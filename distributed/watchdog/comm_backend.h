/*
 * CommBackend: a Backend whose ops are queued on Communicators (communicator.h) and completed by
 * a Watchdog (watchdog.h) — the shape of c10d's ProcessGroupNCCL, written once and device-
 * neutral. NcclBackend (nccl/nccl_backend.h) is one; FakeBackend (fake_backend.h, registered as
 * "fake", CPU tensors over the in-process FakeCommunicator) is the other, so every failure path
 * of the NCCL backend runs in tests without a GPU.
 *
 * Every op: fail at once if the watchdog already failed (the group is aborted); ask the subclass
 * for the communicator and stream of the tensors' device (prepare: NCCL makes the communicator
 * on first use and makes its stream wait for the caller's); translate the op into CommOps and
 * enqueue them as one group; let the subclass finish the launch (launched: NCCL records the
 * tensors' use on its stream and makes Work::wait stream-ordered); hand the op to the watchdog,
 * which holds the tensors until the op is done and then finishes the Work.
 *
 * How each op maps onto the communicator's primitives (all zero-copy, on the callers' tensors):
 *  allreduce, broadcast, reduce, allgatherIntoTensor, reduceScatterTensor, barrier: one op each
 *    (barrier: an allreduce of one element of the subclass's barrierTensor);
 *  allreduceCoalesced: one allreduce per tensor, in one group (DDP's buckets: one launch);
 *  allgather (list): one broadcast from each rank into its output, in one group;
 *  allgatherCoalesced: the same for every input;
 *  reduceScatter (list): one reduce to each rank r of inputs[r], in one group;
 *  alltoall (even or uneven), alltoallList, gather, scatter: sends and receives, in one group
 *    (to itself too: the communicator pairs them within the group);
 *  send, recv: one op; tags are not sent (NCCL has none): messages between two ranks are matched
 *    in the order they were issued.
 * Point-to-point ops and collectives share the communicator and its stream, so ranks must issue
 * them in compatible orders (a rank waiting in a recv holds back its collectives).
 */
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/distributed/backend.h>
#include <cohort/distributed/watchdog/communicator.h>
#include <cohort/distributed/watchdog/watchdog.h>

namespace cohort::dist {

class CommBackend : public Backend {
 public:
  ~CommBackend() override;

  bool supports(OpType /*op*/) const override { return true; }
  Watchdog& watchdog() { return *watchdog_; }

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

  // Dumps the flight recorders, aborts the communicators and fails every pending op (watchdog.h).
  void abort(const std::string& reason) override;

 protected:
  CommBackend(std::string name, const StorePtr& store, int rank, int size, const BackendOptions& opts);

  // Where an op on `device` goes. The communicator stays owned by the subclass (and registered
  // with the watchdog: Watchdog::addCommunicator).
  struct Target {
    Communicator* comm = nullptr;
    void* stream = nullptr;
  };
  // Called on the issuing thread for every op; may create the communicator (collectively: every
  // rank issues its first op on a device at the same point).
  virtual Target prepare(Device device) = 0;
  // The address of t's first element, for the communicator.
  virtual void* address(const Tensor& t) const = 0;
  // After the op was queued (before the watchdog sees it): `tensors` are every tensor it reads or
  // writes, `outputs` what its Work returns; `barrier` for a barrier (whose wait blocks the host).
  virtual void launched(Device /*device*/, const Target& /*target*/, const CommCompletionPtr& /*done*/,
                        const std::vector<Tensor>& /*tensors*/, const std::vector<Tensor>& /*outputs*/,
                        const WorkPtr& /*work*/, bool /*barrier*/) {}
  // A one-element tensor on the device barrier() runs on (the subclass keeps it).
  virtual Tensor barrierTensor() = 0;
  // Subclasses call this first in their destructor, before their communicators go: waits (up to
  // the ops' deadlines, at most `drain`) for the ops in flight, then stops the watchdog.
  void stopWatchdog(Millis drain);

  std::string group_;
  std::unique_ptr<Watchdog> watchdog_;

 private:
  // Queues `ops` as one group and hands them to the watchdog; `tensors` are held until done.
  void run(const WorkPtr& work, Device device, const std::vector<CommOp>& ops, std::vector<Tensor> tensors,
           std::vector<Tensor> outputs, bool barrier = false);
  CommOp op(CommOpKind kind, const Tensor* send, Tensor* recv, size_t count, DType dtype, int peer = -1,
            ReduceOp reduce = ReduceOp::Sum) const;
};

}  // namespace cohort::dist
