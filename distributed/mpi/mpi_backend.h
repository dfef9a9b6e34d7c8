/*
 * MpiBackend: the collectives over MPI (OpenMPI 4.1), registered as backend "mpi". It works when
 * the program runs under mpirun: group ranks must be the MPI_COMM_WORLD ranks (initProcessGroup
 * takes them from OMPI_COMM_WORLD_RANK), and each group gets its own communicator (MpiComm).
 *
 * Threads. Collectives are blocking MPI calls: they are OpenMPI's fastest (the tuned and
 * shared-memory components; MPI_Iallreduce took twice as long at every size here), and float32
 * runs with no copy (MPI_IN_PLACE on the caller's tensor). Where they run is chosen per process by
 * COHORT_COLLECTIVE_THREAD:
 *  - "caller" (the default): on the thread that issues the collective, which needs
 *    MPI_THREAD_MULTIPLE for several threads or groups (else calls take turns through
 *    MpiEnvironment::lock). The returned Work is already complete. This is MPI's own call plus
 *    cohort's fixed cost per op (the Work, sequence number, flight-recorder entry: ~0.3 µs, see
 *    docs/benchmarks.md), where handing each op to another thread costs two context switches on
 *    the rank's core (mpirun binds each rank to one core by default): tens of µs against MPI's
 *    1 µs at 4 KiB.
 *    Timeouts: MPI cannot interrupt a blocking call, so when a collective passes its deadline the
 *    watchdog thread logs the TimeoutError it would have raised (op, group, sequence number, the
 *    ranks that never reached it), dumps the flight recorder, and ends the job with MPI_Abort, as
 *    NCCL's watchdog does. Use "worker" to get the error as an exception instead.
 *  - "worker": one worker thread per group runs its collectives one at a time, in issue order (as
 *    c10d's ProcessGroupMPI); Works complete asynchronously, so communication overlaps the
 *    caller's computation when a core is free for it, and a timeout is an exception (below).
 * Send and recv are MPI_Isend/MPI_Irecv, issued in order by the worker and completed by a second
 * thread that polls them (MPI_Testsome), so a blocking receive never holds up the collectives
 * behind it and a send/recv pair in any order cannot deadlock the queue.
 *
 * Timeouts in worker mode. MPI has no per-op timeout and no way to cancel a blocking collective. A
 * watchdog thread fails any collective still pending at its deadline with a TimeoutError, and aborts the
 * backend: the op's thread stays blocked inside MPI, ops behind it fail at once (running them
 * would mismatch the other ranks), and MPI_Finalize is skipped at exit (MpiEnvironment). The job
 * is then ended by mpirun when a process exits, or dies with a rank that failed: that is MPI's
 * failure model. Timed-out send/recv are cancelled (MPI_Cancel) and do not abort the backend.
 *
 * Errors: MPI calls return codes (MPI_ERRORS_RETURN), which fail the op's Work with a DistError
 * naming the op, the group and the sequence number, and MPI's own text.
 */
#pragma once

#include <memory>
#include <string>

#include <cohort/distributed/backend.h>

namespace cohort::dist::mpi_backend {

class MpiBackend : public Backend {
 public:
  // Collective over the group's members. Throws DistError when the group's ranks are not the
  // MPI_COMM_WORLD ranks of the processes (the program was not started by mpirun, or ranks were
  // assigned otherwise).
  MpiBackend(int rank, int size, const BackendOptions& opts);
  ~MpiBackend() override;

  bool supports(OpType op) const override;

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

  struct State;  // queue, threads and communicator, shared with the threads (mpi_backend.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace cohort::dist::mpi_backend
