// The public face of distributed autograd (autograd.h): contexts, the thread's current context,
// and gradients. The protocol behind it is detail/dist_autograd.cc.
#include <cohort/rpc/autograd.h>

#include <cohort/core/util/logging.h>
#include <cohort/rpc/detail/dist_autograd.h>
#include <cohort/rpc/rpc.h>

namespace cohort::rpc {

namespace {
thread_local autograd::ContextId tCurrent;  // the thread's current context
}  // namespace

namespace detail {
autograd::ContextId currentContext() { return tCurrent; }
ContextScope::ContextScope(autograd::ContextId id) : outer_(tCurrent) { tCurrent = id; }
ContextScope::~ContextScope() { tCurrent = outer_; }
}  // namespace detail

namespace autograd {

std::string ContextId::str() const { return fmt::format("{}:{}", owner, local); }

Gradients::Gradients(std::vector<std::pair<Tensor, Tensor>> items) : items_(std::move(items)) {
  index_.reserve(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first.impl(), i);
}

Tensor Gradients::get(const Tensor& t) const {
  auto it = index_.find(t.impl());
  return it == index_.end() ? Tensor() : items_[it->second].second;
}

Context::Context() : id_(currentAgent()->distAutograd().create()), outer_(tCurrent) { tCurrent = id_; }

Context::~Context() {
  try {
    end();
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "rpc::autograd::Context {}: releasing it failed: {}", id_.str(), e.what());
  }
}

void Context::end() {
  if (ended_) return;
  ended_ = true;
  if (tCurrent == id_) tCurrent = outer_;
  if (!isInitialized()) return;  // the agent is gone, and every context with it
  currentAgent()->distAutograd().end(id_);
}

void Context::backward(const std::vector<Tensor>& roots, bool retainGraph) {
  backward(roots, std::vector<Tensor>(roots.size()), retainGraph);
}

void Context::backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph) {
  if (ended_) throw ValueError(fmt::format("Context::backward: distributed autograd context {} has ended", id_.str()));
  currentAgent()->distAutograd().backward(id_, roots, grads, retainGraph);
}

Gradients Context::gradients() const {
  if (ended_) throw ValueError(fmt::format("Context::gradients: distributed autograd context {} has ended", id_.str()));
  return gradientsOf(id_);
}

ContextId currentContextId() { return tCurrent; }

Gradients gradientsOf(ContextId id) { return Gradients(currentAgent()->distAutograd().gradients(id)); }

size_t liveContexts() { return isInitialized() ? currentAgent()->distAutograd().live() : 0; }

}  // namespace autograd

}  // namespace cohort::rpc
