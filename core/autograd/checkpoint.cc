#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/checkpoint.h>

#include <memory>
#include <unordered_set>
#include <utility>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/autograd/split_backward.h>
#include <cohort/core/tensor/generator.h>

namespace cohort::autograd {
namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// The history of a recomputed input: takes the gradient that reaches it into its slot.
class RecomputedInput final : public Node {
 public:
  RecomputedInput(std::shared_ptr<std::vector<Tensor>> slots, size_t index, const Tensor& t)
      : slots_(std::move(slots)), index_(index) {
    outputMeta_.push_back({t.sizes(), t.dtype()});
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    (*slots_)[index_] = std::move(grads.at(0));
    return {};
  }
  std::string name() const override { return "checkpoint input"; }

 private:
  std::shared_ptr<std::vector<Tensor>> slots_;
  size_t index_;
};

// Puts a generator's state back when the recomputation ends (or throws).
class RestoreState {
 public:
  RestoreState(Generator& gen, GeneratorState s) : gen_(gen), state_(s) {}
  ~RestoreState() { gen_.setState(state_); }
  RestoreState(const RestoreState&) = delete;
  RestoreState& operator=(const RestoreState&) = delete;

 private:
  Generator& gen_;
  GeneratorState state_;
};

class CheckpointNode final : public Node {
 public:
  CheckpointNode(Fn fn, const std::vector<Tensor>& inputs, GeneratorState rng, amp::AutocastState autocast)
      : fn_(std::move(fn)), rng_(rng), autocast_(autocast) {
    saved_.reserve(inputs.size());
    for (const Tensor& t : inputs) saved_.emplace_back(t);
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> result(next_.size());
    if (inputHalfDone_) {  // the weight half of a split backward: finish the nested one
      inputHalfDone_ = false;
      WeightBackward rest = std::move(rest_);
      std::shared_ptr<std::vector<Tensor>> slots = std::move(slots_);
      rest.run();
      for (size_t i = 0; i < result.size(); ++i)
        if (computesEdge(i)) result[i] = (*slots)[i];
      return result;
    }

    // Detached aliases of the saved inputs; those with an edge get a history that catches their
    // gradient.
    auto slots = std::make_shared<std::vector<Tensor>>(next_.size());
    std::vector<Tensor> inputs(saved_.size());
    for (size_t i = 0; i < saved_.size(); ++i) {
      Tensor t = saved_[i].unpack(*this);
      if (!t.defined()) continue;
      inputs[i] = t.detach();
      if (next_[i].valid()) {
        AutogradMeta& m = autogradMeta(inputs[i]);
        m.gradFn = std::make_shared<RecomputedInput>(slots, i, t);
        m.outputNr = 0;
        m.requiresGrad = true;
      }
    }
    std::vector<Tensor> outs;
    {
      Generator& gen = defaultGenerator();
      RestoreState restore(gen, gen.state());
      gen.setState(rng_);
      EnableGradGuard gradOn(true);
      amp::AutocastStateGuard autocastAsInForward(autocast_);  // the same dtypes as the forward
      outs = fn_(inputs);
    }
    if (outs.size() != outputMeta_.size())
      throw Error(fmt::format("checkpoint: recomputing for backward returned {} outputs, the forward {}; the "
                              "checkpointed function must compute the same thing each time",
                              outs.size(), outputMeta_.size()));
    std::vector<Tensor> roots, rootGrads;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (!outs[k].defined()) continue;
      const TensorMeta& m = outputMeta_[k];
      if (outs[k].sizes() != m.sizes || outs[k].dtype() != m.dtype)
        throw Error(fmt::format("checkpoint: recomputing for backward gave output {} as {} {}, the forward as {} {}; "
                                "the checkpointed function must compute the same thing each time",
                                k, outs[k].dtype(), shapeStr(outs[k].sizes()), m.dtype, shapeStr(m.sizes)));
      if (!outs[k].requiresGrad() || k >= grads.size()) continue;
      roots.push_back(outs[k]);
      rootGrads.push_back(grads[k]);
    }
    checkSelfContained(roots);

    if (edgeMask_ != nullptr) {
      // The input half of a split backward: the inputs' gradients now, the weight gradients of
      // the recomputed graph (and any input edge left to the weight half) when applied again.
      std::vector<Tensor> want;
      std::vector<size_t> at;
      for (size_t i = 0; i < inputs.size(); ++i)
        if (computesEdge(i) && inputs[i].defined()) {
          want.push_back(inputs[i]);
          at.push_back(i);
        }
      std::vector<Tensor> got = backwardInput(roots, rootGrads, want, rest_);
      for (size_t j = 0; j < at.size(); ++j) result[at[j]] = got[j];
      slots_ = std::move(slots);
      inputHalfDone_ = true;
      return result;
    }

    if (!roots.empty()) {
      // Into the store of the backward this runs in; callbacks go to that backward.
      GraphTask task(/*retainGraph=*/false, currentGradStore());
      for (size_t r = 0; r < roots.size(); ++r) {
        auto [e, g] = checkedRoot(roots[r], rootGrads[r], r, "checkpoint");
        task.addRoot(e, std::move(g));
      }
      task.discover();
      {
        GraphTask::ExecScope scope(task);
        std::vector<Tensor> in;
        while (Node* n = task.popReady(in)) task.propagate(n, task.runNode(n, std::move(in)));
      }
      task.finishCallbacks();
    }
    for (size_t i = 0; i < result.size(); ++i)
      if (computesEdge(i)) result[i] = (*slots)[i];
    return result;
  }

  std::string name() const override { return "checkpoint"; }
  void releaseSaved() override {
    for (auto& s : saved_) s.release();
  }
  bool keepsWeightWork() const override { return inputHalfDone_; }
  void discardWeightWork() override {
    inputHalfDone_ = false;
    rest_ = WeightBackward();
    slots_.reset();
  }

 private:
  // The recomputed graph must end at the recomputed inputs and at leaves: a node recorded before
  // this checkpoint means fn reached the outer graph through its closure, and the nested backward
  // would run (and free) part of the outer one.
  void checkSelfContained(const std::vector<Tensor>& roots) const {
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack;
    for (const Tensor& r : roots)
      if (const auto& fn = gradientEdge(r).fn; fn && seen.insert(fn.get()).second) stack.push_back(fn.get());
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      if (dynamic_cast<const AccumulateGrad*>(n) != nullptr) continue;
      if (n->sequenceNr() < sequenceNr())
        throw ValueError(fmt::format(
            "checkpoint: the checkpointed function uses a tensor that requires grad and has history (made by {}) "
            "without getting it in `inputs`; pass every such tensor as an input",
            n->name()));
      for (const Edge& e : n->nextEdges())
        if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  Fn fn_;
  std::vector<SavedTensor> saved_;
  GeneratorState rng_;
  amp::AutocastState autocast_;
  // Between the halves of a split backward: the nested weight half and the inputs' gradients it
  // fills in.
  WeightBackward rest_;
  std::shared_ptr<std::vector<Tensor>> slots_;
  bool inputHalfDone_ = false;
};

}  // namespace

std::vector<Tensor> checkpoint(const Fn& fn, const std::vector<Tensor>& inputs) {
  if (!isGradEnabled()) return fn(inputs);
  const GeneratorState rng = defaultGenerator().state();
  std::vector<Tensor> outs;
  {
    NoGradGuard noGrad;
    outs = fn(inputs);
  }
  auto node = std::make_shared<CheckpointNode>(fn, inputs, rng, amp::currentState());
  for (const Tensor& in : inputs) {
    bool grad = in.defined() && in.requiresGrad();
    node->nextEdges().push_back(grad ? gradientEdge(in) : Edge{});
    node->inputMeta().push_back(in.defined() ? TensorMeta{in.sizes(), in.dtype(), in.device()} : TensorMeta{});
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor& out = outs[k];
    node->outputMeta().push_back(out.defined() ? TensorMeta{out.sizes(), out.dtype(), out.device()} : TensorMeta{});
    if (!out.defined() || !out.isFloatingPoint()) continue;
    // An alias, so that an output fn returned as it got it (an input, a parameter, a buffer) keeps
    // its own history.
    out = out.detach();
    AutogradMeta& m = autogradMeta(out);
    m.gradFn = node;
    m.outputNr = static_cast<uint32_t>(k);
    m.requiresGrad = true;
  }
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in.at(0))}; },
                    std::vector<Tensor>{input})
      .at(0);
}

}  // namespace cohort::autograd
