/*
 * Work: the handle of one collective in flight. Every collective returns one at once; the
 * operation runs on the backend's threads. The handle wraps the shared Future (its value is the
 * op's output tensors), so callers may wait, poll, or chain with then().
 *
 * wait(timeout) blocks at most `timeout` (the op's own timeout by default) and throws:
 *  - TimeoutError when the op did not finish in time: the message names the op, the group, the
 *    sequence number and, when the group could find out through the store, the ranks that never
 *    reached this op;
 *  - the op's own error (PeerError when a peer died or disconnected, DistError otherwise).
 * A failed or timed-out Work never leaves a thread blocked forever: the backend aborts the op.
 * Thread-safe.
 */
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
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

  // For backends: complete the work.
  void finish(std::vector<Tensor> outputs);
  void fail(std::exception_ptr error);
  // Called by wait() when the timeout expires before completion: returns the TimeoutError to
  // throw (ProcessGroup installs one that asks the store which ranks are missing).
  using TimeoutExplainer = std::function<std::exception_ptr(const Work&, Millis waited)>;
  void setTimeoutExplainer(TimeoutExplainer fn) { explain_ = std::move(fn); }
  // Called once when wait() times out, before throwing (backends abort the op's transport here).
  using AbortFn = std::function<void()>;
  void setAbort(AbortFn fn) { abort_ = std::move(fn); }

  std::string describe() const;  // "allreduce #12 in group 'world'"

 private:
  OpType op_;
  uint64_t seq_;
  std::string group_;
  Millis timeout_;
  Future<std::vector<Tensor>> future_;
  TimeoutExplainer explain_;
  AbortFn abort_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace cohort::dist
