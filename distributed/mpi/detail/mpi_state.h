/*
 * Internal to the MPI backend (mpi_backend.cc runs the threads, mpi_collectives.cc builds the
 * ops): the queue of ops, the worker, watchdog and send/recv poller threads, and the
 * communicator, all shared with those threads through one shared_ptr so a thread left blocked
 * inside MPI keeps what it uses alive.
 */
#pragma once

#include <cohort/distributed/mpi/detail/mpi_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cohort/distributed/mpi/detail/mpi_comm.h>
#include <cohort/distributed/mpi/detail/mpi_environment.h>
#include <cohort/distributed/mpi/mpi_backend.h>

namespace cohort::dist::mpi_backend {

// An MPI call returned an error code; the worker turns it into the Work's DistError.
class MpiCallError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
void check(int rc, const char* call);

// What one op does on the worker thread. Returns the Work's outputs, or nullopt when the op
// completes later elsewhere (send/recv hand their request to the poller).
using OpFn = std::function<std::optional<std::vector<Tensor>>(MPI_Comm comm)>;

struct PendingOp {
  WorkPtr work;
  OpFn run;
  bool pointToPoint = false;
  std::atomic<bool> completed{false};
  // Send/recv: set when the Work's wait() gives up; the poller then cancels the transfer.
  std::shared_ptr<std::atomic<bool>> p2pAbort;
  // True for the one caller that may complete the Work (worker, watchdog or abort).
  bool claim() { return !completed.exchange(true); }
};

// A send or receive in flight, owned by the poller.
struct P2pOp {
  WorkPtr work;
  Tensor tensor;  // keeps the buffer alive until MPI is done with it
  MPI_Request request = MPI_REQUEST_NULL;
  bool isRecv = false;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int peer = 0;
  int tag = 0;
  bool cancelled = false;  // MPI_Cancel was asked for (the Work already failed)
  std::shared_ptr<std::atomic<bool>> abortRequested;
};

struct MpiBackend::State : std::enable_shared_from_this<MpiBackend::State> {
  std::unique_ptr<MpiComm> comm;
  std::string groupName;
  int size = 1;
  // COHORT_COLLECTIVE_THREAD: true (caller, the default) runs collectives on the thread that
  // issues them; false (worker) queues them for the worker thread.
  bool onCaller = true;

  // Collectives (and the issuing of send/recv), run in order by the worker.
  //
  // Why this is not the OpQueue that gloo, hierarchical and shm's worker mode share: OpQueue's
  // contract is that every task returns, because those backends can break off their transport (gloo
  // closes its connections, shm marks the group broken and every wait on a peer checks it), so it joins
  // its workers and fails what is still queued when it stops. MPI cannot interrupt a blocking
  // collective, so this queue must (1) let the watchdog see the deadline of every queued op and fail
  // them, each exactly once (PendingOp::claim) in a race with the worker and abortAll, and (2)
  // abandon a worker stuck inside MPI at shutdown instead of joining it forever. Latency is not the
  // reason: a hand-off through a mutex and a condition variable is what both queues do (a spin
  // before sleeping, once here, gained nothing: 6.3-6.6 us against 6.3-7.3 us for a 64 B allreduce
  // in worker mode, mpirun -np 2, 5 rounds).
  std::mutex mu;
  std::condition_variable workerCv;   // queue not empty, or stop
  std::condition_variable monitorCv;  // an earlier deadline, or stop
  std::condition_variable idleCv;     // the worker finished (destructor)
  std::deque<std::shared_ptr<PendingOp>> queue;
  std::shared_ptr<PendingOp> current;
  bool currentStuck = false;  // current failed by the watchdog and still inside MPI
  bool aborted = false;
  std::string abortReason;
  bool stop = false;
  std::atomic<bool> broken{false};  // aborted || stop, for the caller path to read without mu
  bool workerDone = false;
  std::chrono::steady_clock::time_point monitorWake = std::chrono::steady_clock::time_point::max();
  std::thread worker, monitor;

  // Send/recv in flight, completed by the poller.
  std::mutex p2pMu;
  std::condition_variable p2pCv;
  std::vector<std::shared_ptr<P2pOp>> incoming;
  bool p2pStop = false;
  std::atomic<bool> p2pAbortAll{false};  // the backend was aborted: cancel every transfer
  std::thread poller;

  // Caller mode: the collective running on its caller's thread, watched by the watchdog without a
  // lock or an allocation per op. While an op runs, callerRunning holds its ticket (0: none);
  // callerWork and callerDeadline describe it. The watchdog claims an op past its deadline by
  // setting kCallerClaimed on its ticket, takes a reference to the Work, then clears the slot;
  // the caller, finding its ticket claimed, waits for that, leaves the Work to the watchdog
  // (which fails it and ends the job) and returns.
  static constexpr uint64_t kCallerClaimed = uint64_t{1} << 63;
  std::atomic<uint64_t> callerRunning{0};
  std::atomic<uint64_t> callerTickets{0};
  std::atomic<const WorkPtr*> callerWork{nullptr};
  std::atomic<std::chrono::steady_clock::rep> callerDeadline{0};

  void start();
  void shutdown();
  // A collective: runs `fn` on this thread (caller mode) or queues it for the worker.
  template <typename F>
  void enqueue(const WorkPtr& work, F&& fn) {
    if (!onCaller) {
      enqueueOnWorker(work, OpFn(std::forward<F>(fn)));
      return;
    }
    const uint64_t ticket = beginOnCaller(work);
    if (ticket == 0) return;
    std::optional<std::vector<Tensor>> outputs;
    std::exception_ptr error;
    try {
      auto lock = comm->env().lock();
      outputs = fn(comm->get());
    } catch (const std::exception& e) {
      error = work->distError(e.what());
    }
    endOnCaller(*work, ticket, std::move(outputs), std::move(error));
  }
  // Send/recv: `fn` issues the transfer and hands it to addP2p; `abortFlag` is shared with it.
  void enqueueP2p(const WorkPtr& work, OpFn fn, std::shared_ptr<std::atomic<bool>> abortFlag);
  void addP2p(std::shared_ptr<P2pOp> op);
  void abortAll(const std::string& reason);

 private:
  void workerLoop();
  void monitorLoop();
  void pollerLoop();
  void runOne(const std::shared_ptr<PendingOp>& op);
  void enqueueOnWorker(const WorkPtr& work, OpFn fn);
  // Caller mode: publishes the op for the watchdog and returns its ticket, or fails the Work and
  // returns 0 when the backend is aborted or shut down.
  uint64_t beginOnCaller(const WorkPtr& work);
  void endOnCaller(Work& work, uint64_t ticket, std::optional<std::vector<Tensor>> outputs, std::exception_ptr error);
  // The watchdog's look at the caller's op (mu held; released if it ends the job).
  void checkCallerDeadline(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point now);
  // A collective on its caller's thread passed its deadline: MPI cannot interrupt it, so this
  // reports the error (with the group's diagnosis) and ends the job with MPI_Abort.
  [[noreturn]] void abortJobForStuckCaller(const WorkPtr& work);
  void push(std::shared_ptr<PendingOp> op);
};

}  // namespace cohort::dist::mpi_backend
