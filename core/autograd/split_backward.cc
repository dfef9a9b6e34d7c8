#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/split_backward.h>

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <cohort/core/autograd/engine.h>

namespace cohort::autograd {
namespace detail {

// One split backward over one GraphTask: dependency counts and input buffers carry over from the
// input half to the weight half. A node "on the input path" has an edge that leads to an input
// (the edge is the input's gradient edge, or ends at a node on the input path); every producer of
// such a node is on the input path too, so the input half can run exactly those nodes with the
// task's usual dependency counting, and their masks say which edges it computes.
class SplitTask {
 public:
  explicit SplitTask(bool retainGraph) : task_(retainGraph), retain_(retainGraph) {}
  ~SplitTask() { discard(); }
  SplitTask(const SplitTask&) = delete;
  SplitTask& operator=(const SplitTask&) = delete;

  std::vector<Tensor> inputHalf(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                const std::vector<Tensor>& inputs);
  void weightHalf();
  bool hasWeightWork() const { return !deferred_.empty() || !kept_.empty(); }

 private:
  // Applies `node` to `grads` for the edges in `mask` only.
  std::vector<Tensor> applyMasked(Node* node, std::vector<Tensor> grads, const std::vector<bool>& mask);
  void findInputPath();
  void discard();

  GraphTask task_;
  bool retain_;
  std::vector<Edge> inputEdges_;                             // one per input
  std::unordered_map<Node*, std::vector<size_t>> inputsAt_;  // node -> inputs whose edge ends there
  std::unordered_set<Node*> inputLeaves_;                    // accumulators of leaf inputs: never run
  std::unordered_map<Node*, std::vector<bool>> onPath_;      // input-path node -> its input-half mask
  std::vector<Node*> deferred_;                              // ready in the input half, not on the path
  std::unordered_map<Node*, std::vector<Tensor>> kept_;      // applied again in the weight half
};

void SplitTask::findInputPath() {
  auto isInputEdge = [&](const Edge& e) {
    auto it = inputsAt_.find(e.fn.get());
    if (it == inputsAt_.end()) return false;
    for (size_t j : it->second)
      if (inputEdges_[j].inputNr == e.inputNr) return true;
    return false;
  };
  // Post-order over the graph from the roots: a node is on the path when one of its edges is.
  enum State : char { kVisiting, kOff, kOn };
  std::unordered_map<Node*, State> state;
  std::vector<std::pair<Node*, size_t>> stack;
  for (const auto& root : task_.roots_) {
    if (state.contains(root.get())) continue;
    state[root.get()] = kVisiting;
    stack.emplace_back(root.get(), 0);
    while (!stack.empty()) {
      Node* n = stack.back().first;
      size_t i = stack.back().second;
      const auto& next = n->nextEdges();
      if (i < next.size()) {
        ++stack.back().second;
        Node* child = next[i].fn.get();
        if (child != nullptr && !state.contains(child)) {
          state[child] = kVisiting;
          stack.emplace_back(child, 0);
        }
        continue;
      }
      stack.pop_back();
      std::vector<bool> mask(next.size(), false);
      bool on = false;
      for (size_t k = 0; k < next.size(); ++k) {
        const Edge& e = next[k];
        if (e.valid() && (isInputEdge(e) || state[e.fn.get()] == kOn)) mask[k] = on = true;
      }
      state[n] = on ? kOn : kOff;
      if (on) onPath_.emplace(n, std::move(mask));
    }
  }
}

namespace {
// Sets a node's edge mask for one apply().
class MaskScope {
 public:
  MaskScope(Node* node, const std::vector<bool>* mask) : node_(node) { node_->setEdgeMask(mask); }
  ~MaskScope() { node_->setEdgeMask(nullptr); }
  MaskScope(const MaskScope&) = delete;
  MaskScope& operator=(const MaskScope&) = delete;

 private:
  Node* node_;
};
}  // namespace

std::vector<Tensor> SplitTask::applyMasked(Node* node, std::vector<Tensor> grads, const std::vector<bool>& mask) {
  MaskScope scope(node, &mask);
  amp::detail::ExcludeGuard noAutocast;  // as the engine runs backward functions
  return node->apply(std::move(grads));
}

std::vector<Tensor> SplitTask::inputHalf(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                         const std::vector<Tensor>& inputs) {
  COHORT_CHECK_EQ(roots.size(), grads.size(), "backwardInput: one gradient per root");
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Tensor& x = inputs[j];
    if (!x.defined()) throw ValueError(fmt::format("backwardInput: input {} is undefined", j));
    if (!x.requiresGrad())
      throw ValueError(fmt::format("backwardInput: input {} (shape {}) does not require grad, so it has no gradient", j,
                                   shapeStr(x.sizes())));
    Edge e = gradientEdge(x);
    inputsAt_[e.fn.get()].push_back(j);
    if (dynamic_cast<AccumulateGrad*>(e.fn.get()) != nullptr) inputLeaves_.insert(e.fn.get());
    inputEdges_.push_back(std::move(e));
  }
  for (size_t i = 0; i < roots.size(); ++i) {
    auto [e, g] = checkedRoot(roots[i], grads[i], i, "backwardInput");
    task_.addRoot(e, std::move(g));
  }
  findInputPath();
  task_.discover();

  std::vector<Tensor> result(inputs.size());
  std::vector<bool> captured(inputs.size(), false);
  auto capture = [&](Node* n) {
    // Every gradient of an input arrives in the input half, along edges of input-path nodes.
    auto at = inputsAt_.find(n);
    if (at == inputsAt_.end()) return;
    auto buf = task_.buffers_.find(n);
    for (size_t j : at->second) {
      uint32_t nr = inputEdges_[j].inputNr;
      if (buf != task_.buffers_.end() && nr < buf->second.size()) result[j] = buf->second[nr];
      captured[j] = true;
    }
  };

  task_.store_ = currentGradStore();
  task_.noInline_ = true;  // an input's node (a receive function, say) must not run here
  {
    GraphTask::ExecScope scope(task_);
    while (!task_.ready_.empty()) {
      Node* n = task_.ready_.top();
      task_.ready_.pop();
      capture(n);
      auto path = onPath_.find(n);
      if (path == onPath_.end()) {
        if (inputLeaves_.contains(n)) {  // its gradient is returned, not accumulated
          task_.buffers_.erase(n);
          ++task_.executed_;
        } else {
          deferred_.push_back(n);  // its buffer waits in the task
        }
        continue;
      }
      std::vector<Tensor> in = task_.takeInputs(n);
      n->runPreHooks(in);
      std::vector<Tensor> again = in;  // handles: the weight half applies the node to the same gradients
      std::vector<Tensor> out = applyMasked(n, std::move(in), path->second);
      bool rest = n->keepsWeightWork();
      const auto& next = n->nextEdges();
      for (size_t k = 0; k < next.size() && !rest; ++k) rest = next[k].valid() && !path->second[k];
      if (rest) {
        kept_.emplace(n, std::move(again));
      } else {
        if (!retain_) n->releaseSaved();
        ++task_.executed_;
      }
      task_.propagateMasked(n, std::move(out), path->second);
    }
  }
  task_.noInline_ = false;
  for (size_t j = 0; j < inputs.size(); ++j)
    if (!captured[j]) capture(inputEdges_[j].fn.get());
  task_.finishCallbacks();
  return result;
}

void SplitTask::weightHalf() {
  task_.store_ = currentGradStore();
  {
    GraphTask::ExecScope scope(task_);
    for (Node* n : deferred_) task_.ready_.push(n);
    deferred_.clear();
    for (auto& [n, g] : kept_) task_.ready_.push(n);
    while (!task_.ready_.empty()) {
      Node* n = task_.ready_.top();
      task_.ready_.pop();
      if (auto k = kept_.find(n); k != kept_.end()) {
        std::vector<Tensor> g = std::move(k->second);
        kept_.erase(k);
        const std::vector<bool>& first = onPath_.at(n);
        std::vector<bool> mask(first.size());
        for (size_t i = 0; i < mask.size(); ++i) mask[i] = !first[i];
        std::vector<Tensor> out = applyMasked(n, std::move(g), mask);
        if (!retain_) n->releaseSaved();
        ++task_.executed_;
        task_.propagateMasked(n, std::move(out), mask);
      } else if (inputLeaves_.contains(n)) {
        task_.buffers_.erase(n);
        ++task_.executed_;
      } else {
        std::vector<Tensor> in = task_.takeInputs(n);
        task_.propagate(n, task_.runNode(n, std::move(in)));
      }
    }
  }
  task_.finishCallbacks();
}

void SplitTask::discard() {
  for (auto& [n, g] : kept_) {
    n->discardWeightWork();
    if (!retain_) n->releaseSaved();
  }
  kept_.clear();
  deferred_.clear();
}

}  // namespace detail

std::vector<Tensor> backwardInput(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& inputs, WeightBackward& rest, bool retainGraph) {
  if (rest.pending())
    throw ValueError(
        "backwardInput: `rest` still holds the weight half of an earlier backwardInput; run() it (or drop it) first");
  auto task = std::make_unique<detail::SplitTask>(retainGraph);
  std::vector<Tensor> result = task->inputHalf(roots, grads, inputs);
  if (task->hasWeightWork()) rest.task_ = std::move(task);
  return result;
}

WeightBackward::WeightBackward() = default;
WeightBackward::~WeightBackward() = default;
WeightBackward::WeightBackward(WeightBackward&& other) noexcept = default;
WeightBackward& WeightBackward::operator=(WeightBackward&& other) noexcept {
  if (this != &other) {
    task_.reset();
    task_ = std::move(other.task_);
  }
  return *this;
}

void WeightBackward::run() {
  if (!task_) return;
  std::unique_ptr<detail::SplitTask> task = std::move(task_);  // at most once, even when it throws
  task->weightHalf();
}

}  // namespace cohort::autograd
