/*
 * The autograd graph. A Node is one recorded op: it maps the gradients of its outputs to the
 * gradients of its inputs. Edges point from a node to the nodes that produced its inputs (or to
 * AccumulateGrad for leaves). Nodes are owned by the tensors they produced (gradFn) and by the
 * edges of later nodes; the graph is freed when the last output tensor goes away.
 *
 * SavedTensor keeps a detached alias of a tensor an op needs in backward together with its
 * version at save time; unpacking after an in-place change raises an Error naming the op.
 * The engine (engine.h) runs nodes on the thread that called backward, in grad-disabled mode.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t inputNr = 0;
  bool valid() const { return fn != nullptr; }
};

// Shape, dtype and device of a tensor, to make zero gradients and to check gradient shapes.
struct TensorMeta {
  Shape sizes;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // The saved tensor; throws when it was released (backward ran twice without retainGraph) or
  // modified in place since it was saved.
  Tensor unpack(const Node& owner) const;
  void release() {
    data_ = Tensor();
    released_ = true;
  }
  bool defined() const { return data_.defined() || released_; }

 private:
  Tensor data_;
  uint32_t version_ = 0;
  bool released_ = false;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads[i] is the gradient of output i (never undefined: the engine fills zeros). Returns one
  // gradient per input edge (undefined for inputs that need none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors after backward when the graph is not retained.
  virtual void releaseSaved() {}
  // True for a node that only hands its gradient on, cheaply and without touching the graph
  // (distributed autograd's receive function, which sends it to another worker): the engine may
  // run it the moment its last gradient arrives, inside the backward that emitted it
  // (Ctx::emit), so the gradient leaves while that backward goes on.
  virtual bool runsInline() const { return false; }

  uint64_t sequenceNr() const { return seq_; }
  // Whether this application of the node computes the gradient of input i (Ctx::needsInputGrad):
  // edge i is valid and, while a split backward (split_backward.h) restricts the node to some of
  // its edges, one of them.
  bool computesEdge(size_t i) const {
    return i < next_.size() && next_[i].valid() && (edgeMask_ == nullptr || (*edgeMask_)[i]);
  }
  // Split backward only: the edges the next apply() computes (null, always outside split
  // backward: every valid edge). The engine sets it around apply().
  const std::vector<bool>* edgeMask() const { return edgeMask_; }
  void setEdgeMask(const std::vector<bool>* mask) { edgeMask_ = mask; }
  // Split backward only. A node whose backward does work beyond its own edges (checkpoint: the
  // weight gradients of the graph it recomputes) may keep that work after an input-half apply
  // (edgeMask() set) and answer true here; the weight half then applies it a second time, with
  // the complementary mask, even when none of its edges were left for that half. When the weight
  // half never runs, discardWeightWork() is called instead.
  virtual bool keepsWeightWork() const { return false; }
  virtual void discardWeightWork() {}
  std::vector<Edge>& nextEdges() { return next_; }
  const std::vector<Edge>& nextEdges() const { return next_; }
  std::vector<TensorMeta>& outputMeta() { return outputMeta_; }
  std::vector<TensorMeta>& inputMeta() { return inputMeta_; }

  // Gradient hooks on output `outputNr` (tensor hooks of non-leaf tensors), run before apply.
  int addPreHook(uint32_t outputNr, GradHook hook);
  void removePreHook(int handle);
  // Outputs whose gradient should be stored in the tensor's .grad (retainGrad).
  void addRetainGrad(uint32_t outputNr, std::weak_ptr<TensorImpl> t);
  void runPreHooks(std::vector<Tensor>& grads);

 protected:
  uint64_t seq_;
  std::vector<Edge> next_;
  std::vector<TensorMeta> inputMeta_;   // one per next edge
  std::vector<TensorMeta> outputMeta_;  // one per output
  struct PreHook {
    int handle;
    uint32_t outputNr;
    GradHook fn;
  };
  std::vector<PreHook> preHooks_;
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retainGrad_;
  const std::vector<bool>* edgeMask_ = nullptr;
};

// Where a backward may write the gradient of one of its inputs directly (Ctx::gradSink): the
// leaf's .grad (accumulate) or, while .grad is undefined, its gradient target (overwrite).
struct GradSink {
  Tensor target;            // undefined: no sink; compute and return the gradient as usual
  bool accumulate = false;  // true: add into target (it holds earlier gradients); false: overwrite it
};

// Accumulates the incoming gradient into a leaf's .grad, then runs its post-accumulate hooks.
// When .grad is undefined and the leaf has a gradient target (setGradTarget), the gradient is
// written into the target, which becomes .grad. A gradient that arrives as the sink this node
// handed out (the producer already accumulated into .grad) is not added again.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }
  // The engine hands `target` out as a sink; apply() recognises it when it comes back.
  void expectSink(const TensorImpl* target) { expectedSink_.store(target, std::memory_order_relaxed); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
  // Atomic: backward passes of several contexts may run this node on their threads at once.
  std::atomic<const TensorImpl*> expectedSink_{nullptr};
};

struct AutogradMeta {
  bool requiresGrad = false;
  std::shared_ptr<Node> gradFn;
  uint32_t outputNr = 0;
  Tensor grad;
  Tensor gradTarget;  // leaves: receives the first gradient while .grad is undefined (setGradTarget)
  std::weak_ptr<AccumulateGrad> accumulator;  // leaves: shared by every edge into this leaf
  std::mutex accumulatorMu;                   // guards `accumulator`: threads may record ops on one leaf at once
  struct Hook {
    int handle;
    GradHook fn;
  };
  std::vector<Hook> hooks;  // leaves: run in AccumulateGrad before accumulation
  struct PostHook {
    int handle;
    PostAccumulateGradHook fn;
  };
  std::vector<PostHook> postAccumulateHooks;
  int nextHandle = 1;
  // Non-empty: a wrapper owns this parameter's gradient and update (FSDP sends it to a flat
  // shard); says which and what to optimize instead. See setManagedBy.
  std::string managedBy;
};

// The edge a gradient for `t` flows along: its gradFn, its leaf accumulator, or invalid.
Edge gradientEdge(const Tensor& t);
AutogradMeta& autogradMeta(const Tensor& t);  // creates it on first use

// Marks `param` as owned by a wrapper that routes its gradient elsewhere (FSDP: into the unit's
// flat shard, so .grad stays undefined). An optimizer built over it, or clipGradNorm given it,
// raises ValueError with `note` instead of silently skipping it. An empty note clears the mark.
void setManagedBy(const Tensor& param, std::string note);
// The note, or null when `t` is not managed.
const std::string* managedBy(const Tensor& t);

}  // namespace cohort::autograd
