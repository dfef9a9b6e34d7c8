/*
 * Work: the handle of one collective in flight. Every collective returns one at once; the
 * operation runs on the backend's threads (or, in the shm and mpi backends' default caller mode,
 * has already run on the caller's). Callers may wait, poll, or chain with future().then(); the
 * Future (its value is the op's output tensors) is made on the first call to future(), so an op
 * nobody chains on costs one allocation (the Work) and no lock beyond its completion.
 *
 * wait() blocks until the op's deadline (creation + its timeout) plus a short grace that lets the
 * backend report its own, more precise error; wait(timeout) blocks at most `timeout`. They throw:
 *  - TimeoutError when the op did not finish in time: the message names the op, the group, the
 *    sequence number and, when the group could find out through the store, the ranks that never
 *    reached this op;
 *  - the op's own error (PeerError when a peer died or disconnected, DistError otherwise).
 * A failed or timed-out Work never leaves a thread blocked forever: the backend aborts the op (the
 * mpi backend in caller mode ends the job instead: mpi/mpi_backend.h).
 * Only a backend completes a Work: finish/fail and the setters backends use take a CompletionKey,
 * which Backend hands to its subclasses (Backend::completionKey(), so a backend of one's own,
 * registered with registerBackend, completes its Works the same way) and nothing else can make.
 * Thread-safe.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/future.h>
#include <cohort/distributed/collective_options.h>

namespace cohort::dist {

class Backend;
class ProcessGroup;

class Work {
 public:
  // `start` is when the op was issued (its deadline is start + timeout); ProcessGroup passes the
  // time it read once for the op and its flight-recorder entry.
  Work(OpType op, uint64_t seq, std::string groupName, Millis timeout,
       std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  OpType op() const { return op_; }
  uint64_t sequenceNumber() const { return seq_; }
  const std::string& groupName() const { return group_; }
  Millis timeout() const { return timeout_; }

  bool isCompleted() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool isSuccess() const { return state_.load(std::memory_order_acquire) == kSucceeded; }
  // The op's error; nullptr while pending or after success.
  std::exception_ptr exception() const { return state_.load(std::memory_order_acquire) == kFailed ? error_ : nullptr; }
  // Waits up to the op's timeout (or the given one); throws as described above.
  void wait();
  void wait(Millis timeout);
  // The op's outputs: wait()s first (so it throws as wait() does).
  std::vector<Tensor> result();
  // A Future completed with the outputs or the error (made on the first call; later calls return
  // the same one).
  Future<std::vector<Tensor>> future() const;

  // When the op must be over: creation + timeout. Backends give their transport what is left
  // (remaining()), so a dead peer fails the op by the time wait() gives up.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  Millis remaining() const;  // until deadline(), at least 1 ms

  // The key to the completion API below (finish, fail, setObserver, setAbort, setAbortBackend,
  // setLabel): only a backend completes a Work, so only Backend, which hands the key to its
  // subclasses (Backend::completionKey(): a backend of your own registered with registerBackend
  // uses it too), and ProcessGroup can make one. Users wait, poll and chain; they do not complete.
  class CompletionKey {
    CompletionKey() {}  // user-provided, so that not even `{}` makes one outside the friends
    friend class Backend;
    friend class ProcessGroup;
  };

  // For backends: complete the work (from any thread), exactly once; a second completion is a
  // broken invariant (an Error naming the op). The completing thread holds a reference (a
  // WorkPtr) for the call: a waiter may drop every other one the moment it sees the Work done.
  void finish(CompletionKey, std::vector<Tensor> outputs);
  void fail(CompletionKey, std::exception_ptr error);
  // For backends: typed errors whose message names this op ("allreduce #12 in group 'world'"),
  // the transport's `detail`, and the group's diagnosis of which ranks did not reach or finish
  // the op (asked of the store by the diagnoser ProcessGroup installs).
  std::exception_ptr timeoutError(const std::string& detail) const;
  std::exception_ptr peerError(const std::string& detail) const;
  std::exception_ptr distError(const std::string& detail) const;

  // Installed by ProcessGroup, one per group and shared by all its Works (nothing allocated per
  // op). onComplete() runs once, on the completing thread, before the Future completes (so a
  // waiter it wakes sees what it recorded); `token` is the observer's own tag for this Work (the
  // group's flight-recorder entry). diagnose() explains, from the ranks' published progress, who
  // is missing; "" when it has nothing to add; may block briefly (it reads the store).
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void onComplete(const Work& work, uint64_t token, const std::exception_ptr& error) = 0;
    virtual std::string diagnose(const Work& work) const = 0;
  };
  void setObserver(CompletionKey, std::shared_ptr<Observer> observer, uint64_t token) {
    observer_ = std::move(observer);
    observerToken_ = token;
  }
  std::string diagnosis() const;
  // What wait() does once when it times out, before throwing: run the backend's abort function
  // when it installed one, else abort the backend the op was launched on (ProcessGroup names it;
  // a weak reference, so nothing is allocated per op and a Work does not keep a backend alive).
  using AbortFn = std::function<void()>;
  void setAbort(CompletionKey, AbortFn fn) { abort_ = std::move(fn); }
  void setAbortBackend(CompletionKey, std::weak_ptr<Backend> backend) { abortBackend_ = std::move(backend); }

  // For device backends (nccl): makes wait() stream-ordered, as c10d's WorkNCCL. While the op is
  // pending, wait() calls `fn` — which makes the caller's current stream wait for the op's end
  // (an event) — and returns without blocking the host; result() then returns `outputs`, whose
  // values are ready for work queued on that stream after the wait. The Work itself completes
  // later, when the backend's watchdog sees the op done; an op that failed by the time wait() is
  // called throws as usual, and one that fails later fails every later op and wait of the group
  // (watchdog/watchdog.h). wait(timeout) still blocks the host (an explicit timeout asks for it).
  // Set before the Work is handed to the caller.
  using DeviceWaitFn = std::function<void()>;
  void setDeviceWait(CompletionKey, DeviceWaitFn fn, std::vector<Tensor> outputs) {
    deviceWait_ = std::move(fn);
    deviceOutputs_ = std::move(outputs);
  }
  bool waitsOnDevice() const { return deviceWait_ != nullptr; }

  // Point-to-point ops carry no group sequence number; their label says who and which tag
  // ("to rank 1, tag 7") and describe() shows it.
  void setLabel(CompletionKey, std::string label) { label_ = std::move(label); }
  std::string describe() const;  // "allreduce #12 in group 'world'", "send (to rank 1, tag 7) in group 'world'"

  // While the profiler records (core/profiler/record.h): what the op's trace event says, filled by
  // ProcessGroup when the op is issued; its completion records the span on the group's track.
  struct Profiled {
    int64_t startNs = 0;
    std::string shapes, detail, backend;
    int64_t bytes = 0;
    int rank = 0;
  };
  void setProfiled(CompletionKey, std::unique_ptr<Profiled> p) { profiled_ = std::move(p); }
  Profiled* profiled(CompletionKey) { return profiled_.get(); }

 private:
  OpType op_;
  uint64_t seq_;
  std::string group_;
  Millis timeout_;
  std::chrono::steady_clock::time_point deadline_;

  // Completion: state_ is written once, under mu_, after outputs_/error_; read without the lock.
  enum : uint8_t { kPending, kSucceeded, kFailed };
  void complete(std::vector<Tensor>* outputs, std::exception_ptr error);
  bool waitUntilDone(std::chrono::steady_clock::time_point until) const;
  void rethrowIfFailed() const;
  std::atomic<uint8_t> state_{kPending};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Tensor> outputs_;
  std::exception_ptr error_;
  mutable std::optional<Future<std::vector<Tensor>>> future_;  // made by future()
  std::string label_;
  std::shared_ptr<Observer> observer_;
  uint64_t observerToken_ = 0;
  std::atomic<bool> observed_{false};
  AbortFn abort_;
  DeviceWaitFn deviceWait_;
  std::vector<Tensor> deviceOutputs_;  // result() after a stream-ordered wait()
  std::weak_ptr<Backend> abortBackend_;
  std::once_flag abortOnce_;
  void abortOnce();
  std::unique_ptr<Profiled> profiled_;
  void recordProfiled(bool failed) const;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace cohort::dist
