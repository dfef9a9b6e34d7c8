/*
 * Internal to the MPI backend (mpi_backend.cc runs the threads, mpi_collectives.cc builds the
 * ops): the queue of ops, the worker, watchdog and send/recv poller threads, and the
 * communicator, all shared with those threads through one shared_ptr so a thread left blocked
 * inside MPI keeps what it uses alive.
 */
#pragma once

// The C API only: OpenMPI's C++ bindings would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

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

#include <cohort/distributed/mpi/mpi_backend.h>
#include <cohort/distributed/mpi/mpi_comm.h>
#include <cohort/distributed/mpi/mpi_environment.h>

namespace cohort::dist::mpi {

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

}  // namespace cohort::dist::mpi

namespace cohort::dist {

struct MpiBackend::State : std::enable_shared_from_this<MpiBackend::State> {
  std::unique_ptr<mpi::MpiComm> comm;
  std::string groupName;
  int size = 1;
  // COHORT_MPI_COLLECTIVE_THREAD: true (caller, the default) runs collectives on the thread that
  // issues them; false (worker) queues them for the worker thread.
  bool onCaller = true;

  // Collectives (and the issuing of send/recv), run in order by the worker.
  std::mutex mu;
  std::condition_variable workerCv;   // queue not empty, or stop
  std::condition_variable monitorCv;  // an earlier deadline, or stop
  std::condition_variable idleCv;     // the worker finished (destructor)
  std::deque<std::shared_ptr<mpi::PendingOp>> queue;
  std::atomic<size_t> queued{0};  // queue.size(), read without the lock by the spinning worker
  std::shared_ptr<mpi::PendingOp> current;
  std::shared_ptr<mpi::PendingOp> callerOp;  // the collective running on its caller's thread
  bool currentStuck = false;  // current failed by the watchdog and still inside MPI
  bool aborted = false;
  std::string abortReason;
  bool stop = false;
  bool workerDone = false;
  std::chrono::steady_clock::time_point monitorWake = std::chrono::steady_clock::time_point::max();
  std::thread worker, monitor;

  // Send/recv in flight, completed by the poller.
  std::mutex p2pMu;
  std::condition_variable p2pCv;
  std::vector<std::shared_ptr<mpi::P2pOp>> incoming;
  bool p2pStop = false;
  std::atomic<bool> p2pAbortAll{false};  // the backend was aborted: cancel every transfer
  std::thread poller;

  void start();
  void shutdown();
  // A collective: runs it on this thread (caller mode) or queues it for the worker.
  void enqueue(const WorkPtr& work, mpi::OpFn fn);
  // Send/recv: `fn` issues the transfer and hands it to addP2p; `abortFlag` is shared with it.
  void enqueueP2p(const WorkPtr& work, mpi::OpFn fn, std::shared_ptr<std::atomic<bool>> abortFlag);
  void addP2p(std::shared_ptr<mpi::P2pOp> op);
  void abortAll(const std::string& reason);

 private:
  void workerLoop();
  void monitorLoop();
  void pollerLoop();
  void runOne(const std::shared_ptr<mpi::PendingOp>& op);
  void runOnCaller(const WorkPtr& work, mpi::OpFn& fn);
  // A collective on its caller's thread passed its deadline: MPI cannot interrupt it, so this
  // reports the error (with the group's diagnosis) and ends the job with MPI_Abort.
  [[noreturn]] void abortJobForStuckCaller(const std::shared_ptr<mpi::PendingOp>& op);
  void push(std::shared_ptr<mpi::PendingOp> op);
};

}  // namespace cohort::dist
