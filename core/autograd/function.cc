#include <cohort/core/autograd/function.h>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort::autograd {
namespace {

class LambdaNode final : public Node {
 public:
  LambdaNode(const char* name, std::vector<SavedTensor> saved, BackwardFn fn)
      : name_(name), saved_(std::move(saved)), fn_(std::move(fn)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Ctx ctx(*this, saved_);
    std::vector<Tensor> out = fn_(ctx, grads);
    COHORT_CHECK_LE(out.size(), next_.size(), "backward of {} returned {} gradients for {} inputs", name_, out.size(),
                    next_.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined() || !computesEdge(i)) {  // (a gradient for an edge left to another half)
        out[i] = Tensor();
        continue;
      }
      const TensorMeta& m = inputMeta_[i];
      if (out[i].sizes() != m.sizes) out[i] = sumToShape(out[i], m.sizes);  // undo broadcasting
      if (out[i].dtype() != m.dtype) out[i] = out[i].to(m.dtype);
    }
    return out;
  }
  std::string name() const override { return name_; }
  void releaseSaved() override {
    for (auto& s : saved_) s.release();
  }
  const std::vector<SavedTensor>& saved() const { return saved_; }

 private:
  std::string name_;
  std::vector<SavedTensor> saved_;
  BackwardFn fn_;
};

}  // namespace

Tensor Ctx::saved(size_t i) const {
  COHORT_CHECK_LT(i, saved_.size(), "Ctx::saved index out of range in {}", node_.name());
  return saved_[i].unpack(node_);
}

bool Ctx::emit(size_t i, Tensor grad) const {
  if (!node_.computesEdge(i) || !grad.defined()) return false;
  if (!node_.nextEdges()[i].fn->runsInline()) return false;  // nothing to gain: return it as usual
  Node& node = const_cast<Node&>(node_);                     // the engine's bookkeeping changes, not the node
  const TensorMeta& m = node.inputMeta()[i];
  if (grad.sizes() != m.sizes) grad = sumToShape(grad, m.sizes);  // as the node does with what it returns
  if (grad.dtype() != m.dtype) grad = grad.to(m.dtype);
  return detail::emitGradient(node, i, std::move(grad));
}

bool Ctx::needsInputGrad(size_t i) const { return node_.computesEdge(i); }

GradSink Ctx::gradSink(size_t i) const {
  // An edge into a leaf's AccumulateGrad means the input was the leaf itself (a view of it has a
  // gradFn of its own), so a sink always has the input's shape.
  return node_.computesEdge(i) ? detail::gradSinkFor(node_.nextEdges()[i]) : GradSink{};
}

bool needsGrad(std::initializer_list<const Tensor*> inputs) {
  if (!isGradEnabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requiresGrad()) return true;
  return false;
}

bool needsGrad(const std::vector<Tensor>& inputs) {
  if (!isGradEnabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requiresGrad()) return true;
  return false;
}

std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const std::vector<Tensor>& saved, BackwardFn backward) {
  if (!needsGrad(inputs)) return nullptr;
  std::vector<SavedTensor> s;
  s.reserve(saved.size());
  for (const Tensor& t : saved) s.emplace_back(t);
  auto node = std::make_shared<LambdaNode>(name, std::move(s), std::move(backward));
  for (const Tensor& in : inputs) {
    node->nextEdges().push_back(in.defined() ? gradientEdge(in) : Edge{});
    node->inputMeta().push_back(in.defined() ? TensorMeta{in.sizes(), in.dtype(), in.device()} : TensorMeta{});
  }
  uint32_t nr = 0;
  for (const Tensor& out : outputs) {
    node->outputMeta().push_back({out.sizes(), out.dtype(), out.device()});
    AutogradMeta& m = autogradMeta(out);
    m.gradFn = node;
    m.outputNr = nr++;
    m.requiresGrad = true;
  }
  if (profiler::detail::active()) [[unlikely]]
    profiler::detail::noteForwardSeq(node->sequenceNr());
  return node;
}

void checkInplace(const char* name, const Tensor& self) {
  if (!isGradEnabled() || !self.defined() || !self.requiresGrad()) return;
  if (self.isLeaf())
    throw ValueError(fmt::format("{}: a leaf tensor that requires grad (shape {}) is used in an in-place operation; "
                                 "wrap the update in NoGradGuard or operate on a copy",
                                 name, shapeStr(self.sizes())));
  if (self.impl()->isView)
    throw NotSupportedError(fmt::format("{}: in-place operation on a view of a tensor that requires grad is not "
                                        "supported; use the out-of-place form",
                                        name));
}

void recordInplace(const char* name, Tensor& self, const std::vector<Tensor>& others, const std::vector<Tensor>& saved,
                   BackwardFn backward) {
  self.bumpVersion();
  std::vector<Tensor> inputs;
  inputs.push_back(self);
  for (const Tensor& o : others) inputs.push_back(o);
  if (!needsGrad(inputs)) return;
  checkInplace(name, self);
  if (self.impl()->isView)
    throw NotSupportedError(fmt::format("{}: writing a tensor that requires grad into a view is not supported under "
                                        "autograd; write into a fresh tensor (or use cat/stack) instead",
                                        name));
  // The new node's first input is self's previous history: build edges before re-pointing self.
  Tensor before = self.detach();
  if (self.impl()->autograd) {
    auto& m = *self.impl()->autograd;
    if (m.gradFn) {
      autogradMeta(before).gradFn = m.gradFn;
      autogradMeta(before).outputNr = m.outputNr;
    }
  }
  inputs[0] = before;
  record(name, inputs, {self}, saved, std::move(backward));
}

}  // namespace cohort::autograd
