/*
 * The backward engine. A GraphTask is one backward's bookkeeping: the nodes reachable from its
 * roots, how many gradients each still waits for (dependency counting), their input buffers and
 * the nodes ready to run. Nodes run when every gradient they will receive has arrived; among
 * ready nodes the most recently created runs first, so gradients of the last layers reach their
 * leaves (and DDP's hooks) first. Each node runs with grad mode off.
 *
 * backward() is the local engine: one GraphTask run to the end on the calling thread.
 * Distributed autograd (rpc/autograd.h) drives GraphTasks itself: their roots include nodes whose
 * gradient comes from another worker (expectExternal/deliver), the graph is discovered in parts
 * as other workers name roots (discover), and leaf gradients go to a GradStore (the context's)
 * instead of .grad. A GraphTask is not thread-safe: whoever shares one serialises its calls;
 * only runNode() (the node's own work) may run outside that lock.
 * Split backward (split_backward.h) runs one GraphTask in two halves; checkpoint (checkpoint.h)
 * runs one inside a node's backward.
 */
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <cohort/core/autograd/node.h>

namespace cohort::autograd {

// Backward from `roots` with the given gradients (same length; undefined = ones for one-element
// roots). Without retainGraph, saved tensors are freed as nodes run.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph = false);

// Called from a hook while backward runs: `fn` runs on the same thread once the current backward
// has run every node, before backward() returns (callbacks queued by callbacks run too, in order).
// An exception from `fn` propagates out of backward(). When backward fails before the end, queued
// callbacks are dropped. DDP waits for its last bucket here. Outside backward: a ValueError.
void queueCallback(std::function<void()> fn);
bool inBackward();  // whether this thread is running backward()

// Gives the leaf `leaf` a gradient target: while its .grad is undefined, the next backward writes
// the leaf's gradient into `target` (same shape and dtype, contiguous) and makes it .grad, instead
// of allocating one. DDP points each parameter at its slice of the bucket, so that backward writes
// gradients straight into the memory the all-reduce reads. An undefined `target` clears it.
// Throws ValueError for a tensor that is not a leaf requiring grad, or a target that does not fit.
// (A backward into a GradStore ignores targets.)
void setGradTarget(const Tensor& leaf, const Tensor& target);

// Where a backward puts leaf gradients instead of .grad: a distributed autograd context keeps
// them per context, so that several backwards through shared parameters never mix. Leaf hooks
// and post-accumulate hooks run as usual; the gradient they see is the store's.
class GradStore {
 public:
  virtual ~GradStore() = default;
  // The gradient of `leaf` accumulated so far (undefined: none).
  virtual Tensor get(const TensorImpl& leaf) const = 0;
  virtual void set(const std::shared_ptr<TensorImpl>& leaf, Tensor grad) = 0;
};
// The store of the backward this thread is running (null: gradients go to .grad).
GradStore* currentGradStore();
// The gradient of `leaf` as the backward running on this thread sees it: its store's when it has
// one, else .grad. Hooks that read or replace gradients (DDP's) use these.
Tensor gradOf(const Tensor& leaf);
void setGradOf(const Tensor& leaf, Tensor grad);

namespace detail {
// The sink for the gradient flowing along `e` from the node now running (Ctx::gradSink).
GradSink gradSinkFor(const Edge& e);
// Ctx::emit: input i's gradient of `from` (running on this thread), handed on early.
bool emitGradient(Node& from, size_t i, Tensor grad);
class SplitTask;  // split_backward.cc: one split backward's two halves over one GraphTask
}  // namespace detail

// Root `i` of a backward named `op`: its gradient edge, and the gradient it starts with (`grad`
// detached, or ones for a one-element root when `grad` is undefined). ValueError naming `op` for
// an undefined root, one without history, or a gradient that does not fit.
std::pair<Edge, Tensor> checkedRoot(const Tensor& root, const Tensor& grad, size_t i, const char* op);

class GraphTask {
 public:
  explicit GraphTask(bool retainGraph, GradStore* store = nullptr);
  ~GraphTask();
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // A root: `grad` flows along `e` (a root tensor's gradientEdge). Call before discover().
  void addRoot(const Edge& e, Tensor grad);
  // Counts the dependencies of every node reachable from `start` (and from the roots, when
  // `start` is null) that this task has not seen yet, queues the roots that wait for nothing, and
  // returns the nodes newly seen.
  std::vector<Node*> discover(const std::shared_ptr<Node>& start = nullptr);
  // `node` (seen) waits for one more gradient from outside the graph: a deliver() call.
  void expectExternal(Node* node);
  // A gradient from outside the graph for input `inputNr` of `node`.
  void deliver(Node* node, uint32_t inputNr, Tensor grad);

  // The next ready node, with its inputs in `inputs` (zeros for outputs that got no gradient);
  // null when nothing is ready.
  Node* popReady(std::vector<Tensor>& inputs);
  // Runs `node` on `inputs` (pre-hooks, apply, then frees its saved tensors unless the graph is
  // retained). Needs an ExecScope on this thread; touches nothing of the task but its store.
  std::vector<Tensor> runNode(Node* node, std::vector<Tensor> inputs);
  // Hands `node`'s outputs to the nodes its edges lead to (but those it emitted already).
  void propagate(Node* node, std::vector<Tensor> outputs);
  // A gradient `node` emits for input i while it runs (Ctx::emit): when it is the last one a node
  // that runsInline() waits for, that node runs at once on this thread with it (true); otherwise
  // nothing happens (false) and the gradient goes the usual way. Takes the task's lock, if any.
  bool emit(Node* node, size_t i, Tensor grad);
  // The lock whoever shares this task holds around its calls, released while runNode runs: emit
  // (called from inside runNode) takes it.
  void setLock(std::mutex* lock) { lock_ = lock; }
  bool hasReady() const { return !ready_.empty(); }
  // How many gradients `node` still waits for (from edges and deliveries), and whether one is
  // already buffered for it (a root's, or a delivered one).
  int pendingInputs(Node* node) const {
    auto it = deps_.find(node);
    return it == deps_.end() ? 0 : it->second;
  }
  bool hasInput(Node* node) const { return buffers_.contains(node); }
  // Takes `node` (seen, not run) out of this task: it never runs and counts as done. Distributed
  // autograd skips a gradient's pass through this worker when it sends it straight on.
  void skip(Node* node) {
    deps_[node] = -1;
    ++executed_;
  }
  // Every node seen has run.
  bool finished() const { return executed_ == seen_.size(); }
  size_t seenCount() const { return seen_.size(); }
  // Runs the callbacks hooks queued (queueCallback), in order, on this thread.
  void runCallbacks();
  // For a task run inside a node's backward (checkpoint's recomputation) or standing for part of
  // a backward (split backward's halves), after its ExecScope closed: inside another backward on
  // this thread, the callbacks hooks queued while it ran are handed to that backward, to run when
  // it ends (DDP's finalize must wait for the gradients the rest of it produces); otherwise they
  // run now, as at the end of backward().
  void finishCallbacks();

  // While alive, this thread executes nodes of `task`: grad mode off, queueCallback and
  // inBackward() refer to it, leaf gradients go to its store.
  class ExecScope {
   public:
    explicit ExecScope(GraphTask& task);
    ~ExecScope();
    ExecScope(const ExecScope&) = delete;
    ExecScope& operator=(const ExecScope&) = delete;

   private:
    GraphTask* outerTask_;
    std::vector<std::function<void()>>* outerCallbacks_;
    GradStore* outerStore_;
    bool outerGradMode_;
  };

 private:
  struct ReadyOrder {
    bool operator()(const Node* a, const Node* b) const { return a->sequenceNr() < b->sequenceNr(); }
  };
  friend GradSink detail::gradSinkFor(const Edge& e);
  friend class detail::SplitTask;
  std::vector<Tensor> takeInputs(Node* node);
  // propagate() for the edges i with mask[i] only (split backward), without counting the node
  // as run.
  void propagateMasked(Node* node, std::vector<Tensor> outputs, const std::vector<bool>& mask);
  template <typename Keep>
  void handOn(Node* node, std::vector<Tensor>& outputs, Keep keep);

  bool retainGraph_;
  GradStore* store_;
  std::vector<std::shared_ptr<Node>> roots_;
  std::unordered_map<Node*, std::vector<Tensor>> buffers_;
  std::unordered_map<Node*, int> deps_;
  std::unordered_set<Node*> seen_;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready_;
  size_t executed_ = 0;
  std::vector<std::function<void()>> callbacks_;
  std::unordered_map<Node*, std::vector<size_t>> emitted_;  // edges whose gradient left early
  std::mutex* lock_ = nullptr;
  bool noInline_ = false;  // split backward's input half: emit() never runs a node inline
};

}  // namespace cohort::autograd
