#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/engine.h>

#include <algorithm>
#include <cctype>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort::autograd {
namespace {

void accumulateInto(std::vector<Tensor>& buffer, uint32_t pos, Tensor g) {
  if (buffer.size() <= pos) buffer.resize(pos + 1);
  if (!buffer[pos].defined()) buffer[pos] = std::move(g);
  else buffer[pos] = add(buffer[pos], g);
}

// What this thread is executing (innermost when backward is reentrant).
thread_local GraphTask* tTask = nullptr;
thread_local std::vector<std::function<void()>>* tCallbacks = nullptr;
thread_local GradStore* tStore = nullptr;

bool fits(const Tensor& t, const TensorImpl& leaf) {
  return t.defined() && t.isContiguous() && t.sizes() == leaf.sizes && t.dtype() == leaf.dtype;
}

}  // namespace

namespace detail {

// A producer may write straight into a leaf's gradient when its gradient is the leaf's only one
// still to come and nothing else has arrived (no other edge will add to it, and nothing sits in
// the leaf's input buffer), and the leaf has no gradient hooks (they must see the gradient before
// it is accumulated). Not into a GradStore: its gradients are made by the store itself.
GradSink gradSinkFor(const Edge& e) {
  if (tTask == nullptr || tTask->store_ != nullptr || !e.valid()) return {};
  auto* acc = dynamic_cast<AccumulateGrad*>(e.fn.get());
  if (acc == nullptr) return {};
  auto d = tTask->deps_.find(acc);
  if (d == tTask->deps_.end() || d->second != 1 || tTask->buffers_.contains(acc)) return {};
  TensorImpl& leaf = *acc->leaf();
  if (!leaf.autograd || !leaf.autograd->hooks.empty()) return {};
  AutogradMeta& meta = *leaf.autograd;
  GradSink sink;
  if (meta.grad.defined()) {
    if (!fits(meta.grad, leaf)) return {};
    sink = {meta.grad, true};
  } else if (fits(meta.gradTarget, leaf)) {
    sink = {meta.gradTarget, false};
  } else {
    return {};
  }
  acc->expectSink(sink.target.impl());
  return sink;
}

}  // namespace detail

void setGradTarget(const Tensor& leaf, const Tensor& target) {
  if (!leaf.defined()) throw ValueError("setGradTarget: the leaf is undefined");
  if (!leaf.isLeaf() || !leaf.requiresGrad())
    throw ValueError(fmt::format("setGradTarget: only leaf tensors that require grad accumulate gradients (got a "
                                 "tensor of shape {} that {})",
                                 shapeStr(leaf.sizes()),
                                 leaf.requiresGrad() ? "is not a leaf" : "does not require grad"));
  if (target.defined() && !fits(target, *leaf.impl()))
    throw ValueError(fmt::format("setGradTarget: the target (shape {}, {}, {}) must be a contiguous tensor of the "
                                 "leaf's shape {} and dtype {}",
                                 shapeStr(target.sizes()), target.dtype(),
                                 target.isContiguous() ? "contiguous" : "not contiguous", shapeStr(leaf.sizes()),
                                 leaf.dtype()));
  autogradMeta(leaf).gradTarget = target;
}

void queueCallback(std::function<void()> fn) {
  if (tCallbacks == nullptr) throw ValueError("autograd::queueCallback: called outside backward()");
  tCallbacks->push_back(std::move(fn));
}

bool inBackward() { return tCallbacks != nullptr; }

GradStore* currentGradStore() { return tStore; }

namespace detail {
bool emitGradient(Node& from, size_t i, Tensor grad) {
  return tTask != nullptr && tTask->emit(&from, i, std::move(grad));
}
}  // namespace detail

Tensor gradOf(const Tensor& leaf) { return tStore != nullptr ? tStore->get(*leaf.impl()) : leaf.grad(); }

void setGradOf(const Tensor& leaf, Tensor grad) {
  if (tStore != nullptr) tStore->set(leaf.implPtr(), std::move(grad));
  else Tensor(leaf).setGrad(grad);
}

// ---- GraphTask -------------------------------------------------------------------------------

GraphTask::GraphTask(bool retainGraph, GradStore* store) : retainGraph_(retainGraph), store_(store) {}
GraphTask::~GraphTask() = default;

void GraphTask::addRoot(const Edge& e, Tensor grad) {
  accumulateInto(buffers_[e.fn.get()], e.inputNr, std::move(grad));
  roots_.push_back(e.fn);
}

std::vector<Node*> GraphTask::discover(const std::shared_ptr<Node>& start) {
  std::vector<Node*> fresh;
  std::vector<Node*> stack;
  auto visit = [&](Node* n) {
    if (seen_.insert(n).second) {
      fresh.push_back(n);
      stack.push_back(n);
    }
  };
  if (start) {
    roots_.push_back(start);
    visit(start.get());
  } else {
    for (auto& n : roots_) visit(n.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->nextEdges()) {
      if (!e.valid()) continue;
      deps_[e.fn.get()]++;
      visit(e.fn.get());
    }
  }
  if (!start) {
    for (auto& n : roots_)
      if (deps_[n.get()] == 0) {
        deps_[n.get()] = -1;  // queued (a root may be listed twice)
        ready_.push(n.get());
      }
  }
  return fresh;
}

void GraphTask::expectExternal(Node* node) { deps_[node]++; }

void GraphTask::deliver(Node* node, uint32_t inputNr, Tensor grad) {
  accumulateInto(buffers_[node], inputNr, std::move(grad));
  if (--deps_[node] == 0) ready_.push(node);
}

std::vector<Tensor> GraphTask::takeInputs(Node* node) {
  std::vector<Tensor> inputs;
  auto it = buffers_.find(node);
  if (it != buffers_.end()) {
    inputs = std::move(it->second);
    buffers_.erase(it);
  }
  auto& meta = node->outputMeta();
  if (inputs.size() < meta.size()) inputs.resize(meta.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined() && i < meta.size())
      inputs[i] = zeros(meta[i].sizes, {.dtype = meta[i].dtype, .device = meta[i].device});
  return inputs;
}

Node* GraphTask::popReady(std::vector<Tensor>& inputs) {
  if (ready_.empty()) return nullptr;
  Node* node = ready_.top();
  ready_.pop();
  inputs = takeInputs(node);
  return node;
}

bool GraphTask::emit(Node* node, size_t i, Tensor grad) {
  // Only a gradient that completes a node that runs inline gains from leaving early; any other
  // is handed on by propagate() as usual, with no bookkeeping here.
  const Edge& e = node->nextEdges()[i];
  Node* target = e.fn.get();
  if (!target->runsInline() || noInline_) return false;
  std::unique_lock<std::mutex> lock;
  if (lock_ != nullptr) lock = std::unique_lock<std::mutex>(*lock_);
  if (!seen_.contains(node) || pendingInputs(target) != 1 || hasInput(target)) return false;
  emitted_[node].push_back(i);
  deps_[target] = 0;
  accumulateInto(buffers_[target], e.inputNr, std::move(grad));
  std::vector<Tensor> in = takeInputs(target);
  if (lock.owns_lock()) lock.unlock();
  std::vector<Tensor> out = runNode(target, std::move(in));
  if (lock_ != nullptr) lock.lock();
  propagate(target, std::move(out));
  return true;
}

namespace {
// A backward function's span in a profile: "mm" -> "mmBackward", so it is not counted with the
// forward op of the same name; nodes named for themselves ("AccumulateGrad") keep their name.
std::string backwardSpanName(const std::string& node) {
  if (node.empty() || std::isupper(static_cast<unsigned char>(node[0])) || node.ends_with("Backward")) return node;
  return node + "Backward";
}
}  // namespace

std::vector<Tensor> GraphTask::runNode(Node* node, std::vector<Tensor> inputs) {
  node->runPreHooks(inputs);
  // Backward functions run in the dtypes their forward recorded, whatever autocast scope the
  // thread calling backward() has open.
  amp::detail::ExcludeGuard noAutocast;
  profiler::detail::SpanHandle span;
  if (profiler::detail::active()) [[unlikely]]
    span =
        profiler::detail::beginSpan(profiler::EventKind::Backward, backwardSpanName(node->name()), node->sequenceNr());
  std::vector<Tensor> out = node->apply(std::move(inputs));
  if (span.id >= 0) profiler::detail::endSpan(span);
  if (!retainGraph_) node->releaseSaved();
  return out;
}

template <typename Keep>
void GraphTask::handOn(Node* node, std::vector<Tensor>& out, Keep keep) {
  std::vector<size_t> early;
  if (!emitted_.empty()) {
    if (auto it = emitted_.find(node); it != emitted_.end()) {
      early = std::move(it->second);
      emitted_.erase(it);
    }
  }
  auto& next = node->nextEdges();
  for (size_t i = 0; i < next.size(); ++i) {
    const Edge& e = next[i];
    if (!e.valid() || !keep(i) || std::find(early.begin(), early.end(), i) != early.end()) continue;
    if (i < out.size() && out[i].defined()) accumulateInto(buffers_[e.fn.get()], e.inputNr, std::move(out[i]));
    if (--deps_[e.fn.get()] == 0) ready_.push(e.fn.get());
  }
}

void GraphTask::propagate(Node* node, std::vector<Tensor> out) {
  ++executed_;
  handOn(node, out, [](size_t) { return true; });
}

void GraphTask::propagateMasked(Node* node, std::vector<Tensor> out, const std::vector<bool>& mask) {
  handOn(node, out, [&mask](size_t i) { return static_cast<bool>(mask[i]); });
}

void GraphTask::runCallbacks() {
  // Indexed, not iterated: a callback may queue another.
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    auto fn = std::move(callbacks_[i]);
    fn();
  }
  callbacks_.clear();
}

void GraphTask::finishCallbacks() {
  if (callbacks_.empty()) return;
  if (tCallbacks != nullptr) {
    for (auto& fn : callbacks_) tCallbacks->push_back(std::move(fn));
    callbacks_.clear();
    return;
  }
  ExecScope scope(*this);  // a callback may queue another
  runCallbacks();
}

GraphTask::ExecScope::ExecScope(GraphTask& task)
    : outerTask_(tTask), outerCallbacks_(tCallbacks), outerStore_(tStore), outerGradMode_(isGradEnabled()) {
  tTask = &task;
  tCallbacks = &task.callbacks_;
  tStore = task.store_;
  setGradEnabled(false);
}

GraphTask::ExecScope::~ExecScope() {
  tTask = outerTask_;
  tCallbacks = outerCallbacks_;
  tStore = outerStore_;
  setGradEnabled(outerGradMode_);
}

// ---- the local engine ------------------------------------------------------------------------

std::pair<Edge, Tensor> checkedRoot(const Tensor& r, const Tensor& grad, size_t i, const char* op) {
  if (!r.defined()) throw ValueError(fmt::format("{}: root {} is undefined", op, i));
  Edge e = gradientEdge(r);
  if (!e.valid())
    throw ValueError(
        fmt::format("{}: tensor {} of shape {} does not require grad and has no gradFn", op, i, shapeStr(r.sizes())));
  Tensor g = grad;
  if (!g.defined()) {
    if (r.numel() != 1)
      throw ValueError(fmt::format("{}: a gradient can be created implicitly only for one-element outputs; "
                                   "output {} has shape {}: pass a gradient of that shape",
                                   op, i, shapeStr(r.sizes())));
    g = onesLike(r);
  } else if (g.sizes() != r.sizes()) {
    throw ValueError(fmt::format("{}: gradient of shape {} does not match the shape {} of output {}", op,
                                 shapeStr(g.sizes()), shapeStr(r.sizes()), i));
  }
  return {e, g.detach()};
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph) {
  COHORT_CHECK_EQ(roots.size(), grads.size(), "backward: one gradient per root");
  // Inside a distributed backward's hook, a nested local backward keeps going to the same store.
  GraphTask task(retainGraph, tStore);
  for (size_t i = 0; i < roots.size(); ++i) {
    auto [e, g] = checkedRoot(roots[i], grads[i], i, "backward");
    task.addRoot(e, std::move(g));
  }
  task.discover();
  GraphTask::ExecScope scope(task);
  std::vector<Tensor> in;
  while (Node* node = task.popReady(in)) task.propagate(node, task.runNode(node, std::move(in)));
  task.runCallbacks();
}

}  // namespace cohort::autograd
