/*
 * Work: the handle of one collective in flight. Every collective returns one at once; the
 * operation runs on the backend's threads. The handle wraps the shared Future (its value is the
 * op's output tensors), so callers may wait, poll, or chain with then().
 *
 * wait() blocks until the op's deadline (creation + its timeout) plus a short grace that lets the
 * backend report its own, more precise error; wait(timeout) blocks at most `timeout`. They throw:
 *  - TimeoutError when the op did not finish in time: the message names the op, the group, the
 *    sequence number and, when the group could find out through the store, the ranks that never
 *    reached this op;
 *  - the op's own error (PeerError when a peer died or disconnected, DistError otherwise).
 * A failed or timed-out Work never leaves a thread blocked forever: the backend aborts the op.
 * Thread-safe.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/future.h>
#include <cohort/distributed/types.h>

namespace cohort::dist {

class Work {
 public:
  Work(OpType op, uint64_t seq, std::string groupName, Millis timeout);
  virtual ~Work() = default;

  OpType op() const { return op_; }
  uint64_t sequenceNumber() const { return seq_; }
  const std::string& groupName() const { return group_; }
  Millis timeout() const { return timeout_; }

  bool isCompleted() const { return future_.isCompleted(); }
  bool isSuccess() const { return future_.isCompleted() && !future_.hasError(); }
  std::exception_ptr exception() const { return future_.exception(); }
  // Waits up to the op's timeout (or the given one); throws as described above.
  void wait();
  void wait(Millis timeout);
  // The op's outputs once complete.
  std::vector<Tensor> result() const { return future_.value(); }
  Future<std::vector<Tensor>> future() const { return future_; }

  // When the op must be over: creation + timeout. Backends give their transport what is left
  // (remaining()), so a dead peer fails the op by the time wait() gives up.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  Millis remaining() const;  // until deadline(), at least 1 ms

  // For backends: complete the work (from any thread).
  void finish(std::vector<Tensor> outputs);
  void fail(std::exception_ptr error);
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
  void setObserver(std::shared_ptr<Observer> observer, uint64_t token) {
    observer_ = std::move(observer);
    observerToken_ = token;
  }
  std::string diagnosis() const;
  // Called once when wait() times out, before throwing (backends abort the op's transport here).
  using AbortFn = std::function<void()>;
  void setAbort(AbortFn fn) { abort_ = std::move(fn); }

  // Point-to-point ops carry no group sequence number; their label says who and which tag
  // ("to rank 1, tag 7") and describe() shows it.
  void setLabel(std::string label) { label_ = std::move(label); }
  std::string describe() const;  // "allreduce #12 in group 'world'", "send (to rank 1, tag 7) in group 'world'"

 private:
  OpType op_;
  uint64_t seq_;
  std::string group_;
  Millis timeout_;
  std::chrono::steady_clock::time_point deadline_;
  Future<std::vector<Tensor>> future_;
  std::string label_;
  std::shared_ptr<Observer> observer_;
  uint64_t observerToken_ = 0;
  std::atomic<bool> observed_{false};
  AbortFn abort_;
  std::once_flag abortOnce_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace cohort::dist
