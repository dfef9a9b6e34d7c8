/*
 * Distributed autograd: backward through a graph that spans RPC workers.
 *
 *   rpc::autograd::Context ctx;                             // this thread is now in ctx
 *   Tensor h = rpc::rpcSync<Tensor>("stage1", "forward", x); // records a send here, a receive there
 *   Tensor loss = lossFn(rpc::rpcSync<Tensor>("stage2", "forward", h), target);
 *   ctx.backward({loss});                                   // runs on every worker the forward touched
 *   opt.step(ctx);                                          // rpc::DistributedOptimizer
 *   // leaving the scope releases the context on every worker it reached
 *
 * Recording. While a thread is in a context (a Context it opened, or a request it serves that
 * was sent in one), every RPC it makes carries the context's id, and every tensor in the request
 * that requires grad records a send function on the caller (its next edge is the tensor's
 * history) and a receive function on the callee (the received tensor's gradFn). Results and
 * values fetched through an RRef record the same way in the other direction. Calls to oneself
 * share tensors and so the local graph. A tensor that requires grad sent outside any context
 * travels as a plain copy: the receiver's tensor does not require grad, as in PyTorch. A
 * function served in a context sees it as currentContextId() on the thread that runs it (an
 * asynchronous function's continuations do not).
 *
 * Backward. ctx.backward(roots) runs on the worker that owns the context, in two phases:
 *  1. Discovery: the owner walks its local graph from the roots; every receive function it
 *     reaches names a send on another worker, which walks on from that send, and so on. When it
 *     ends, each worker knows exactly which of its sends will get a gradient and has counted the
 *     dependencies of every node it will run. A send whose result is not on the loss's path (an
 *     RPC result never used) is never waited for: its gradient is zero and nothing is computed
 *     for it, as local autograd treats an unused output (PyTorch's FAST mode would wait for it
 *     until the RPC timeout).
 *     Then the owner plans pass-throughs: a tensor it received and sent on unchanged, for
 *     nothing else, only hands its gradient back; that gradient goes straight from the worker
 *     that computes it to the worker that sent the tensor, one transfer instead of two.
 *  2. Execution: the owner runs its part on the calling thread; a receive function sends its
 *     gradient to the worker that sent the tensor as soon as it runs, and that worker runs the
 *     nodes it unblocks on its RPC threads. Each worker tells the owner when its part is done and
 *     its gradients were delivered; backward returns when every worker is done.
 * Leaf gradients go to the context (gradients()), never to .grad, so several contexts (several
 * trainers sharing a parameter server) can run at once through shared parameters. Gradient hooks
 * and post-accumulate hooks run as usual; hooks that read a leaf's gradient use
 * autograd::gradOf() (DDP does, which is how it works inside a context). A second backward in one
 * context needs retainGraph on the first, and then accumulates into the same gradients.
 *
 * Lifetime. A context lives until its Context is destroyed (or end() is called): then every
 * worker it reached drops it, even after an exception or a failed backward. Every worker that
 * receives a context reports to its owner, so the owner knows whom to release and the worker
 * notices when the owner is gone: the contexts of a worker that dies are dropped by all others.
 *
 * Failures. A worker that dies during backward fails the owner's backward with an RpcError naming
 * the worker and the context, as soon as a worker connected to it notices and at the latest when
 * no progress was made for the RPC timeout. A gradient that cannot be delivered fails backward;
 * nothing is ever replaced by zeros silently. Misuse (backward after end(), a second backward
 * without retainGraph, a local backward through a graph that crosses workers) is a ValueError.
 *
 * Threads: a Context belongs to the thread that made it (construct and destroy it there); its
 * methods are thread-safe. Contexts nest: the inner one is current until it ends.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/rpc/value.h>

namespace cohort::rpc::autograd {

// A context's id: its owner's rank and a number the owner gave it. Printed "<owner>:<number>".
struct ContextId {
  int32_t owner = -1;
  uint64_t local = 0;
  bool valid() const { return owner >= 0; }
  std::string str() const;
  bool operator==(const ContextId& o) const { return owner == o.owner && local == o.local; }
  bool operator<(const ContextId& o) const { return owner != o.owner ? owner < o.owner : local < o.local; }
};

// A context's gradients on one worker: leaf tensor -> its accumulated gradient (a snapshot).
class Gradients {
 public:
  explicit Gradients(std::vector<std::pair<Tensor, Tensor>> items = {});
  // The gradient of `t` (undefined when t got none in this context on this worker).
  Tensor get(const Tensor& t) const;
  bool contains(const Tensor& t) const { return get(t).defined(); }
  size_t size() const { return items_.size(); }
  const std::vector<std::pair<Tensor, Tensor>>& items() const { return items_; }

 private:
  std::vector<std::pair<Tensor, Tensor>> items_;  // (leaf, gradient)
  std::unordered_map<const TensorImpl*, size_t> index_;
};

class Context {
 public:
  // A new context owned by this worker (rpc::init must have run), current on this thread.
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ContextId id() const { return id_; }
  // Backward across workers from `roots` (one-element tensors; or pass `grads`, one per root).
  void backward(const std::vector<Tensor>& roots, bool retainGraph = false);
  void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph = false);
  // This context's gradients on this worker.
  Gradients gradients() const;
  // Ends the context now (what the destructor does): released here and on every worker it
  // reached. Later use is a ValueError. Idempotent.
  void end();
  bool ended() const { return ended_; }

 private:
  ContextId id_;
  ContextId outer_;  // the context current before this one
  bool ended_ = false;
};

// The context this thread is in: the innermost live Context it made, or the one the request it
// is serving was sent in. Invalid when none.
ContextId currentContextId();
// Gradients of context `id` on this worker (for functions served in it, e.g. an optimizer step).
// ValueError when this worker does not hold the context.
Gradients gradientsOf(ContextId id);
// The contexts this worker holds now (owned or received), for tests and leak checks.
size_t liveContexts();

}  // namespace cohort::rpc::autograd

namespace cohort::rpc {
template <>
struct Convert<autograd::ContextId> {
  static Value to(const autograd::ContextId& id) {
    return Value(List{Value(int64_t{id.owner}), Value(static_cast<int64_t>(id.local))});
  }
  static autograd::ContextId from(const Value& v, const std::string& where) {
    auto [owner, local] = Convert<std::tuple<int32_t, uint64_t>>::from(v, where);
    return {owner, local};
  }
  static std::string name() { return "context id"; }
};
}  // namespace cohort::rpc
