#include <cohort/core/autograd/node.h>

#include <atomic>
#include <utility>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>

namespace cohort::autograd {
namespace {
// From 1: 0 is AccumulateGrad's (it runs last) and, for the profiler, "no node".
std::atomic<uint64_t> gNextSeq{1};
std::atomic<int> gNextHookHandle{1};
}  // namespace

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::unpack(const Node& owner) const {
  if (released_)
    throw Error(fmt::format("backward through {} a second time: its saved tensors were freed after the first "
                            "backward; pass retainGraph=true to the first backward to keep them",
                            owner.name()));
  if (!data_.defined()) return Tensor();
  uint32_t now = data_.version();
  if (now != version_)
    throw Error(fmt::format("one of the tensors needed to compute the gradient of {} was modified by an in-place "
                            "operation: a {} tensor of shape {} is at version {}, but was saved at version {}",
                            owner.name(), data_.dtype(), shapeStr(data_.sizes()), now, version_));
  return data_;
}

Node::Node() : seq_(gNextSeq.fetch_add(1, std::memory_order_relaxed)) {}

int Node::addPreHook(uint32_t outputNr, GradHook hook) {
  int h = gNextHookHandle.fetch_add(1);
  preHooks_.push_back({h, outputNr, std::move(hook)});
  return h;
}
void Node::removePreHook(int handle) {
  std::erase_if(preHooks_, [&](const PreHook& h) { return h.handle == handle; });
}
void Node::addRetainGrad(uint32_t outputNr, std::weak_ptr<TensorImpl> t) {
  retainGrad_.emplace_back(outputNr, std::move(t));
}

void Node::runPreHooks(std::vector<Tensor>& grads) {
  for (auto& h : preHooks_) {
    if (h.outputNr >= grads.size()) continue;
    if (auto r = h.fn(grads[h.outputNr]); r && r->defined()) grads[h.outputNr] = *r;
  }
  for (auto& [nr, weak] : retainGrad_) {
    if (auto impl = weak.lock(); impl && nr < grads.size()) {
      Tensor t(impl);
      Tensor g = grads[nr];
      Tensor old = t.grad();
      t.setGrad(old.defined() ? add(old, g) : g.clone());
    }
  }
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  inputMeta_.clear();
  outputMeta_.push_back({leaf_->sizes, leaf_->dtype});
  // Leaves accumulate last: give them the lowest priority among equally ready nodes.
  seq_ = 0;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor leaf(leaf_);
  AutogradMeta& meta = autogradMeta(leaf);
  Tensor g = std::move(grads.at(0));
  const TensorImpl* sink = expectedSink_.exchange(nullptr, std::memory_order_relaxed);
  if (sink != nullptr && g.impl() == sink) {
    // The producer wrote into .grad (accumulate) or into the gradient target (overwrite).
    if (!meta.grad.defined()) meta.grad = meta.gradTarget;
    for (auto& h : meta.postAccumulateHooks) h.fn(leaf);
    return {};
  }
  for (auto& h : meta.hooks)
    if (auto r = h.fn(g); r && r->defined()) g = *r;
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  if (GradStore* store = currentGradStore()) {
    // A distributed autograd context's gradients: never .grad, never a gradient target.
    Tensor old = store->get(*leaf_);
    if (!old.defined()) {
      bool exclusive =
          g.implPtr().use_count() == 1 && g.storage().use_count() == 1 && g.isContiguous() && g.sizes() == leaf.sizes();
      Tensor grad = exclusive ? g : g.expand(leaf.sizes()).clone();
      setMemoryCategory(grad, MemoryCategory::Gradients);
      store->set(leaf_, grad);
    } else {
      store->set(leaf_, add(old, g));  // out of place: a gradient handed out earlier stays as it was
    }
    for (auto& h : meta.postAccumulateHooks) h.fn(leaf);
    return {};
  }
  if (!meta.grad.defined() && meta.gradTarget.defined() && meta.gradTarget.sizes() == leaf.sizes() &&
      meta.gradTarget.dtype() == leaf.dtype()) {
    meta.gradTarget.copy_(g);  // broadcasts a gradient of a broadcast shape
    meta.grad = meta.gradTarget;
  } else if (!meta.grad.defined()) {
    // Take the incoming gradient when nobody else can see it; otherwise copy it, so that later
    // in-place accumulation into .grad cannot change another tensor.
    bool exclusive =
        g.implPtr().use_count() == 1 && g.storage().use_count() == 1 && g.isContiguous() && g.sizes() == leaf.sizes();
    meta.grad = exclusive ? g : g.expand(leaf.sizes()).clone();
    setMemoryCategory(meta.grad, MemoryCategory::Gradients);
  } else {
    // In place, so a .grad that is a view into a bucket (DDP) stays that view.
    meta.grad.add_(g);
  }
  for (auto& h : meta.postAccumulateHooks) h.fn(leaf);
  return {};
}

AutogradMeta& autogradMeta(const Tensor& t) {
  TensorImpl* impl = t.impl();
  COHORT_CHECK(impl != nullptr, "autograd metadata of an undefined tensor");
  if (!impl->autograd) impl->autograd = std::make_unique<AutogradMeta>();
  return *impl->autograd;
}

void setManagedBy(const Tensor& param, std::string note) {
  if (note.empty() && !param.impl()->autograd) return;
  autogradMeta(param).managedBy = std::move(note);
}

const std::string* managedBy(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd || t.impl()->autograd->managedBy.empty()) return nullptr;
  return &t.impl()->autograd->managedBy;
}

Edge gradientEdge(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd) return {};
  AutogradMeta& meta = *t.impl()->autograd;
  if (meta.gradFn) return {meta.gradFn, meta.outputNr};
  if (!meta.requiresGrad) return {};
  // Several threads may record ops on one leaf at once (trainers' requests on a parameter
  // server's shared weights): the accumulator is made once and shared under a lock.
  std::lock_guard<std::mutex> lock(meta.accumulatorMu);
  auto acc = meta.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.implPtr());
    meta.accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace cohort::autograd
