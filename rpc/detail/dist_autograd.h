/*
 * Internal to RpcAgent: distributed autograd's state on one worker (rpc/autograd.h is what users
 * see and states the semantics; this is how messages carry them out).
 *
 * Each context this worker holds keeps the send functions recorded for it here (by send id,
 * which keeps the graph behind them alive), the workers it exchanged tensors with, its leaf
 * gradients (it is the GradStore of its backwards), and the backward round in flight. Requests
 * (wire.h's Op::Autograd; the function names the message, the body starts with the context id):
 *   join        worker -> owner, when a worker first holds a context it does not own. The owner
 *               answers true and will release that worker, or false when the context has ended
 *               (the worker drops it). It also opens the worker's pipe to the owner, through which
 *               it learns that the owner died.
 *   release     owner -> every worker that joined: drop the context.
 *   discover    [id, round, retain, send ids] a worker whose receive functions are on the path
 *               of this round's loss -> the worker that recorded the sends. It walks on from
 *               them, forwards discover for the receive functions it reaches, and answers with
 *               every rank its walk reached once all forwarded walks answered.
 *   redirect    [id, round, send id, target rank, target send id] owner -> the worker holding
 *               the receive function of one of the owner's sends that only passes a received
 *               tensor's gradient on: that receive function sends to the target instead (the
 *               owner's pass-through plan, made once discovery is over).
 *   grads       [id, round, send id, gradient] a receive function ran -> the sender, which
 *               answers once the gradient is queued and then runs what it unblocked.
 *   done        [id, round] a worker ran every node of its part and its gradients were
 *               delivered -> the owner.
 *   abort       [id, round, message] a worker's part failed -> the owner, whose backward fails
 *               with the message.
 *   peer_failed [id, rank, why] a worker saw a peer of the context die -> the owner.
 *
 * Threads: thread-safe. One lock guards the table of contexts; each context has its own lock for
 * its sends, peers and round (the graph task's bookkeeping), and one for its gradients. Nodes run
 * outside every lock, one thread at a time per round (the owner's calling thread, or an RPC pool
 * thread on the others). No lock is held while sending.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/core/util/future.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/value.h>
#include <cohort/rpc/wire.h>

namespace cohort::rpc {

class RpcAgent;

class DistAutograd {
 public:
  // `runOnPool` runs a task on the agent's pool (false once the pool stopped).
  DistAutograd(RpcAgent& agent, std::function<bool(std::function<void()>)> runOnPool);
  ~DistAutograd();
  DistAutograd(const DistAutograd&) = delete;
  DistAutograd& operator=(const DistAutograd&) = delete;

  // ---- contexts (rpc::autograd::Context) ----
  autograd::ContextId create();
  // The owner ends `id`: dropped here, released on every worker that joined.
  void end(autograd::ContextId id);
  std::vector<std::pair<Tensor, Tensor>> gradients(autograd::ContextId id) const;
  size_t live() const;
  void backward(autograd::ContextId id, const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                bool retainGraph);

  // ---- what the agent calls ----
  // A request or response in context `id` is about to leave for `to`: records a send for each
  // tensor of `body` that requires grad and fills `tag`. ValueError when the context has ended.
  void tagOutgoing(autograd::ContextId id, int to, Value& body, ContextTag& tag);
  // `frame` arrived from `from`: the tensors its tag names become outputs of receive functions.
  // RpcError when the tag is inconsistent with the body or the context has ended on its owner.
  void attachIncoming(int from, Frame& frame);
  // An Op::Autograd request (on the pool).
  Future<Value> serve(int from, const std::string& what, const Value& body);
  void onPeerFailed(int rank, const std::string& why);
  // The agent stops: every context goes.
  void shutdown();

  struct Context;
  struct Round;

 private:
  friend class RecvNode;
  std::shared_ptr<Context> find(autograd::ContextId id) const;
  // The context, created (and joined at its owner) when this worker does not hold it yet; null
  // when it is this worker's own and has ended.
  std::shared_ptr<Context> ensure(autograd::ContextId id);
  void drop(autograd::ContextId id);
  // Runs the round's ready nodes on this thread; when its part is finished runs the hooks'
  // callbacks. Returns at once when another thread is running them.
  void drain(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round);
  void drainOnWorker(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round);
  void sendGradient(int to, uint64_t sendId, Tensor grad);
  void maybeReportDone(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round);
  void reportFailure(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round, std::string message);
  Future<Value> serveDiscover(const List& body);
  Future<Value> serveGrads(int from, const List& body);
  std::string workerName(int rank) const;

  RpcAgent& agent_;
  const int self_;
  const std::function<bool(std::function<void()>)> runOnPool_;
  std::atomic<uint64_t> nextContext_{1};
  std::atomic<uint64_t> nextSend_{1};
  mutable std::mutex mu_;  // contexts_, stopped_
  std::map<autograd::ContextId, std::shared_ptr<Context>> contexts_;
  bool stopped_ = false;
};

namespace detail {
// The context this thread is in (rpc/autograd.h's currentContextId()).
autograd::ContextId currentContext();
// Makes `id` the thread's current context for a scope (serving a request sent in it).
class ContextScope {
 public:
  explicit ContextScope(autograd::ContextId id);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  autograd::ContextId outer_;
};
inline autograd::ContextId contextOf(const ContextTag& tag) { return {tag.owner, tag.local}; }
}  // namespace detail

}  // namespace cohort::rpc
