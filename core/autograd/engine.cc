#include <cohort/core/autograd/engine.h>

#include <queue>
#include <unordered_map>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>

namespace cohort::autograd {
namespace {

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const { return a->sequenceNr() < b->sequenceNr(); }
};

void accumulateInto(std::vector<Tensor>& buffer, uint32_t pos, Tensor g) {
  if (buffer.size() <= pos) buffer.resize(pos + 1);
  if (!buffer[pos].defined()) buffer[pos] = std::move(g);
  else buffer[pos] = add(buffer[pos], g);
}

// The callbacks of the backward running on this thread (innermost when backward is reentrant).
thread_local std::vector<std::function<void()>>* tCallbacks = nullptr;

struct CallbackFrame {
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* outer;
  CallbackFrame() : outer(tCallbacks) { tCallbacks = &callbacks; }
  ~CallbackFrame() { tCallbacks = outer; }
  CallbackFrame(const CallbackFrame&) = delete;
  CallbackFrame& operator=(const CallbackFrame&) = delete;
};

// The dependency counts and input buffers of the backward running on this thread (innermost).
struct TaskFrame {
  std::unordered_map<Node*, std::vector<Tensor>>& buffers;
  std::unordered_map<Node*, int>& deps;
  TaskFrame* outer;
};
thread_local TaskFrame* tTask = nullptr;

struct TaskScope {
  TaskFrame frame;
  TaskScope(std::unordered_map<Node*, std::vector<Tensor>>& b, std::unordered_map<Node*, int>& d) : frame{b, d, tTask} {
    tTask = &frame;
  }
  ~TaskScope() { tTask = frame.outer; }
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;
};

bool fits(const Tensor& t, const TensorImpl& leaf) {
  return t.defined() && t.isContiguous() && t.sizes() == leaf.sizes && t.dtype() == leaf.dtype;
}

}  // namespace

namespace detail {

// A producer may write straight into a leaf's gradient when its gradient is the leaf's only one
// still to come and nothing else has arrived (no other edge will add to it, and nothing sits in
// the leaf's input buffer), and the leaf has no gradient hooks (they must see the gradient before
// it is accumulated).
GradSink gradSinkFor(const Edge& e) {
  if (tTask == nullptr || !e.valid()) return {};
  auto* acc = dynamic_cast<AccumulateGrad*>(e.fn.get());
  if (acc == nullptr) return {};
  auto d = tTask->deps.find(acc);
  if (d == tTask->deps.end() || d->second != 1 || tTask->buffers.contains(acc)) return {};
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

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph) {
  COHORT_CHECK_EQ(roots.size(), grads.size(), "backward: one gradient per root");
  // A graph task: the root grads go into a virtual node feeding each root's edge.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, int> deps;
  std::vector<std::shared_ptr<Node>> rootNodes;

  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    if (!r.defined()) throw ValueError("backward: a root tensor is undefined");
    Edge e = gradientEdge(r);
    if (!e.valid())
      throw ValueError(fmt::format("backward: tensor {} of shape {} does not require grad and has no gradFn", i,
                                   shapeStr(r.sizes())));
    Tensor g = grads[i];
    if (!g.defined()) {
      if (r.numel() != 1)
        throw ValueError(fmt::format("backward: a gradient can be created implicitly only for one-element outputs; "
                                     "this output has shape {}: pass a gradient of that shape",
                                     shapeStr(r.sizes())));
      g = onesLike(r);
    } else if (g.sizes() != r.sizes()) {
      throw ValueError(fmt::format("backward: gradient of shape {} does not match the output's shape {}",
                                   shapeStr(g.sizes()), shapeStr(r.sizes())));
    }
    accumulateInto(buffers[e.fn.get()], e.inputNr, g.detach());
    rootNodes.push_back(e.fn);
  }

  // Count, for every reachable node, how many edges lead into it.
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& n : rootNodes) {
    if (!seen[n.get()]) {
      seen[n.get()] = true;
      stack.push_back(n.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->nextEdges()) {
      if (!e.valid()) continue;
      deps[e.fn.get()]++;
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (auto& n : rootNodes)
    if (deps[n.get()] == 0) {
      deps[n.get()] = -1;  // queued
      ready.push(n.get());
    }

  NoGradGuard noGrad;
  CallbackFrame frame;
  TaskScope task(buffers, deps);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffers[node]);
    buffers.erase(node);
    auto& meta = node->outputMeta();
    if (in.size() < meta.size()) in.resize(meta.size());
    for (size_t i = 0; i < in.size(); ++i)
      if (!in[i].defined() && i < meta.size()) in[i] = zeros(meta[i].sizes, {.dtype = meta[i].dtype});
    node->runPreHooks(in);
    std::vector<Tensor> out = node->apply(std::move(in));
    if (!retainGraph) node->releaseSaved();
    auto& next = node->nextEdges();
    for (size_t i = 0; i < next.size(); ++i) {
      const Edge& e = next[i];
      if (!e.valid()) continue;
      if (i < out.size() && out[i].defined()) accumulateInto(buffers[e.fn.get()], e.inputNr, std::move(out[i]));
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
  // Indexed, not iterated: a callback may queue another.
  for (size_t i = 0; i < frame.callbacks.size(); ++i) {
    auto fn = std::move(frame.callbacks[i]);
    fn();
  }
}

}  // namespace cohort::autograd
