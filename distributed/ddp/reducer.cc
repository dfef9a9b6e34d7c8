#include <cohort/distributed/ddp/reducer.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include <fmt/format.h>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/detail/coalesce.h>

namespace cohort::dist {
namespace {

constexpr Millis kWaitGrace{5'000};  // beyond the group timeout: lets the backend report first

size_t mbToBytes(double mb, const char* what) {
  if (!(mb > 0)) throw ValueError(fmt::format("DistributedDataParallel: {} must be positive, got {}", what, mb));
  return static_cast<size_t>(mb * 1024.0 * 1024.0);
}

bool isViewOf(const Tensor& g, const Tensor& view) {
  return g.defined() && g.storage() == view.storage() && g.storageOffset() == view.storageOffset() &&
         g.sizes() == view.sizes() && g.strides() == view.strides() && g.dtype() == view.dtype();
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

Device controlDevice(const ProcessGroup& pg, Device params) {
  return pg.supports(OpType::Allreduce, DeviceType::CPU) ? Device::cpu() : params;
}

std::vector<std::vector<size_t>> assignBuckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                               size_t firstCapBytes, size_t capBytes) {
  // As PyTorch: a parameter joins the open bucket, which closes once it holds at least the cap
  // (so a bucket ends just past its cap, and the next layer's gradients start a new one).
  std::vector<std::vector<size_t>> out;
  std::vector<size_t> open;
  size_t bytes = 0;
  auto close = [&] {
    if (open.empty()) return;
    out.push_back(std::move(open));
    open.clear();
    bytes = 0;
  };
  for (size_t idx : order) {
    COHORT_CHECK(idx < params.size(), "assignBuckets: parameter index {} of {}", idx, params.size());
    const Tensor& p = params[idx];
    if (!open.empty() && params[open.front()].dtype() != p.dtype()) close();  // one dtype per bucket
    open.push_back(idx);
    bytes += p.nbytes();
    if (bytes >= (out.empty() ? firstCapBytes : capBytes)) close();
  }
  close();
  return out;
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names, ProcessGroupPtr pg, ReducerOptions opts)
    : params_(std::move(params)), names_(std::move(names)), pg_(std::move(pg)), opts_(opts), hook_(allreduceHook()) {
  COHORT_CHECK(pg_ != nullptr, "Reducer: null process group");
  control_ = controlDevice(*pg_, params_.empty() ? Device::cpu() : params_.front().device());
  COHORT_CHECK_EQ(params_.size(), names_.size(), "Reducer: one name per parameter");
  mbToBytes(opts_.bucketCapMb, "bucketCapMb");
  mbToBytes(opts_.firstBucketCapMb, "firstBucketCapMb");
  // Reverse registration order: roughly the order backward produces gradients.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  buildBuckets(order);
  ready_.assign(params_.size(), 0);
  locallyUsed_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    hookHandles_.push_back(params_[i].registerPostAccumulateGradHook([this, i](Tensor&) { onGradAccumulated(i); }));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].removePostAccumulateGradHook(hookHandles_[i]);
    // Later backwards (the module used without DDP) no longer write into this reducer's buckets.
    if (opts_.gradientAsBucketView && params_[i].impl()->autograd) {
      Tensor& target = params_[i].impl()->autograd->gradTarget;
      if (target.defined() && target.storage() == buckets_[where_[i].first].buffer.storage()) target = Tensor();
    }
  }
}

void Reducer::setCommHook(CommHookPtr hook) {
  if (hook == nullptr) throw ValueError("DistributedDataParallel::registerCommHook: null hook");
  if (iterations_ > 0) {
    throw ValueError(fmt::format("DistributedDataParallel::registerCommHook(\"{}\"): register the hook before the "
                                 "first backward ({} synchronised backward passes have run with \"{}\")",
                                 hook->name(), iterations_, hook_->name()));
  }
  hook_ = std::move(hook);
}

std::string Reducer::paramLabel(size_t index) const {
  const Tensor& p = params_[index];
  return fmt::format("'{}' (index {}, shape {}, {})", names_[index], index, shapeStr(p.sizes()), p.dtype());
}

std::vector<std::vector<std::string>> Reducer::bucketParameterNames() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(names_[i]);
  }
  return out;
}

void Reducer::buildBuckets(const std::vector<size_t>& order) {
  auto groups = assignBuckets(params_, order, mbToBytes(opts_.firstBucketCapMb, "firstBucketCapMb"),
                              mbToBytes(opts_.bucketCapMb, "bucketCapMb"));
  std::vector<Bucket> buckets(groups.size());
  where_.assign(params_.size(), {0, 0});
  autograd::NoGradGuard noGrad;
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.params = std::move(groups[b]);
    std::vector<Tensor> members;
    members.reserve(bucket.params.size());
    for (size_t idx : bucket.params) members.push_back(params_[idx]);
    const detail::FlatLayout layout = detail::FlatLayout::of(members, "DDP bucket");
    bucket.offsets = layout.offsets;
    // From the backend (collective: every rank builds the same buckets at the same point): on shm
    // it is memory every rank maps, and the bucket's all-reduce copies nothing in or out.
    bucket.buffer = pg_->allocateCommBuffer({layout.total}, layout.dtype, layout.device);
    // For the memory profiler: the gradients themselves when .grad views the bucket, else a copy
    // made for communication.
    setMemoryCategory(bucket.buffer,
                      opts_.gradientAsBucketView ? MemoryCategory::Gradients : MemoryCategory::Communication);
    std::vector<Tensor> views = detail::views(bucket.buffer, layout);
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      size_t idx = bucket.params[s];
      Tensor& p = params_[idx];
      Tensor view = std::move(views[s]);
      Tensor g = p.grad();
      if (!opts_.gradientAsBucketView) {
        bucket.views.push_back(std::move(view));
        where_[idx] = {b, s};
        continue;
      }
      // Gradient as bucket view: .grad lives in the bucket from now on (keeping its value), and
      // a backward that finds .grad undefined (set to none by the optimizer) writes the gradient
      // straight into the bucket instead of into a tensor markReady would copy.
      if (g.defined()) {
        view.copy_(g);
        p.setGrad(view);
      }
      autograd::setGradTarget(p, view);
      bucket.views.push_back(std::move(view));
      where_[idx] = {b, s};
    }
  }
  buckets_ = std::move(buckets);
}

void Reducer::rebuildBuckets() {
  // Rank 0's order decides (ranks may see hooks fire in different orders); -1: keep the buckets
  // (rank 0 recorded no complete order, e.g. it joined before its first batch).
  const int64_t n = static_cast<int64_t>(params_.size());
  Tensor order = full({n}, -1, {.dtype = DType::Int64});
  if (pg_->rank() == 0 && readyOrder_.size() == params_.size()) {
    int64_t* o = order.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int64_t>(readyOrder_[i]);
  }
  order = order.to(control_);
  pg_->broadcast(order, {.root = 0})->wait();
  order = order.to(Device::cpu());
  rebuilt_ = true;
  rebuildPending_ = false;
  readyOrder_.clear();
  const int64_t* o = order.data<int64_t>();
  if (n == 0 || o[0] < 0) return;
  std::vector<size_t> ord(n);
  std::vector<char> seen(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    COHORT_CHECK(o[i] >= 0 && o[i] < n && !seen[o[i]], "DDP bucket rebuild: rank 0 sent an invalid order");
    seen[o[i]] = 1;
    ord[i] = static_cast<size_t>(o[i]);
  }
  buildBuckets(ord);
  COHORT_LOG(Debug, "DistributedDataParallel: buckets rebuilt in gradient-ready order ({} buckets)", buckets_.size());
}

void Reducer::prepareForForward(bool sync) {
  bool inFlight = std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.launched; });
  if (inFlight) {
    size_t launched = std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.launched; });
    resetIteration();
    throw DistError(fmt::format(
        "DistributedDataParallel: the previous backward stopped after {} of {} buckets had started reducing (an "
        "exception during backward, or backward on part of the graph), so this rank's collectives in group '{}' are "
        "out of step with its peers; destroy the process group and restart from a checkpoint",
        launched, buckets_.size(), pg_->name()));
  }
  resetIteration();
  if (sync && rebuildPending_) rebuildBuckets();
}

void Reducer::resetIteration() {
  expectHooks_ = false;
  finalized_ = false;
  finalizeQueued_ = false;
  unusedMarked_ = false;
  nextLaunch_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(locallyUsed_.begin(), locallyUsed_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.result = Future<Tensor>();
  }
}

void Reducer::prepareForBackward(const std::vector<Tensor>& outputs, bool sync) {
  resetIteration();
  expectHooks_ = sync;
  if (!sync) return;
  const bool search = opts_.findUnusedParameters || (opts_.staticGraph && !unusedKnown_);
  if (!search) return;
  // Every leaf this forward's outputs can reach through the graph.
  std::unordered_set<const TensorImpl*> reached;
  std::unordered_set<const autograd::Node*> seen;
  std::vector<std::shared_ptr<autograd::Node>> stack;
  for (const Tensor& t : outputs) {
    if (!t.defined()) continue;
    autograd::Edge e = autograd::gradientEdge(t);
    if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn);
  }
  while (!stack.empty()) {
    auto node = std::move(stack.back());
    stack.pop_back();
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(node.get())) reached.insert(acc->leaf().get());
    for (const auto& e : node->nextEdges())
      if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn);
  }
  unused_.clear();
  for (size_t i = 0; i < params_.size(); ++i)
    if (!reached.contains(params_[i].impl())) unused_.push_back(i);
  if (opts_.staticGraph) unusedKnown_ = true;
}

void Reducer::onGradAccumulated(size_t index) {
  if (finalized_) {
    throw ValueError(fmt::format(
        "DistributedDataParallel: a second backward after one forward (parameter {} got a gradient again); DDP "
        "reduces gradients once per forward, so run forward again before each backward (for gradient accumulation "
        "use noSync())",
        paramLabel(index)));
  }
  if (!expectHooks_) return;  // noSync, or a backward that no DDP forward prepared
  if (!finalizeQueued_) {
    finalizeQueued_ = true;
    autograd::queueCallback([this] { finalize(); });
  }
  if (!unusedMarked_) {
    unusedMarked_ = true;
    for (size_t i : unused_) {
      if (i == index) continue;
      markReady(i);
    }
  }
  if (ready_[index]) {
    throw ValueError(fmt::format(
        "DistributedDataParallel: parameter {} received its gradient twice in one backward (backward called twice "
        "after one forward, or the same parameter reached through a reentrant backward); run forward again between "
        "backward passes, or use staticGraph for models that need it",
        paramLabel(index)));
  }
  markReady(index);
}

void Reducer::markReady(size_t index) {
  auto [b, s] = where_[index];
  Bucket& bucket = buckets_[b];
  Tensor& p = params_[index];
  // In a distributed autograd context the gradient is the context's (engine.h's GradStore), never
  // .grad: it is copied into the bucket, and the average copied back into the context.
  const bool inContext = autograd::currentGradStore() != nullptr;
  Tensor g = autograd::gradOf(p);
  Tensor view = bucket.views[s];
  if (!g.defined()) {
    view.zero_();
  } else if (!opts_.gradientAsBucketView || inContext) {
    autograd::NoGradGuard noGrad;
    view.copy_(g);
  } else if (!isViewOf(g, view)) {
    // The optimizer set .grad to none (or the user replaced it): bring it back into the bucket.
    autograd::NoGradGuard noGrad;
    view.copy_(g);
    p.setGrad(view);
  }
  locallyUsed_[index] = g.defined() ? 1 : 0;
  ready_[index] = 1;
  if (!rebuilt_) readyOrder_.push_back(index);
  COHORT_CHECK(bucket.pending > 0, "DDP: bucket {} marked ready more often than it has parameters", b);
  if (--bucket.pending == 0) launchReadyBuckets();
}

void Reducer::launchReadyBuckets() {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) launch(nextLaunch_++);
}

void Reducer::launch(size_t b) {
  Bucket& bucket = buckets_[b];
  GradBucket gb;
  gb.index = b;
  gb.isLast = b + 1 == buckets_.size();
  gb.buffer = bucket.buffer;
  gb.offsets = bucket.offsets;
  for (size_t idx : bucket.params) gb.parameters.push_back(params_[idx]);
  gb.iteration = iterations_;
  bucket.launched = true;
  const int64_t startNs = profiler::detail::active() ? profiler::detail::nowNs() : 0;
  bucket.result = hook_->run(*pg_, gb);
  if (startNs != 0) [[unlikely]] {
    // The bucket from ready (all its gradients in) to reduced, on the group's DDP track.
    std::vector<profiler::Arg> args = {profiler::Arg::num("bucket", static_cast<int64_t>(b)),
                                       profiler::Arg::num("params", static_cast<int64_t>(bucket.params.size())),
                                       profiler::Arg::num("bytes", static_cast<int64_t>(bucket.buffer.nbytes())),
                                       profiler::Arg::str("hook", hook_->name()),
                                       profiler::Arg::num("iteration", static_cast<int64_t>(iterations_))};
    bucket.result.addCallback([startNs, b, track = "ddp " + pg_->name(), args = std::move(args)](Future<Tensor>) {
      profiler::detail::recordSpan(profiler::EventKind::Ddp, fmt::format("DDP bucket {}", b), track, startNs,
                                   profiler::detail::nowNs(), args);
    });
  }
}

void Reducer::waitBuckets() {
  const Millis timeout = pg_->timeout() + kWaitGrace;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.result.waitFor(timeout)) {
      throw TimeoutError(fmt::format(
          "DistributedDataParallel: bucket {} of {} ({} parameters, {} bytes, comm hook \"{}\") was not reduced within "
          "{} ms in group '{}'",
          b, buckets_.size(), bucket.params.size(), bucket.buffer.nbytes(), hook_->name(), timeout.count(),
          pg_->name()));
    }
    Tensor out = bucket.result.value();  // rethrows the collective's error
    if (!out.defined() || out.sizes() != bucket.buffer.sizes()) {
      throw ValueError(fmt::format("DistributedDataParallel: comm hook \"{}\" returned {} for bucket {}; expected a "
                                   "tensor of shape {}",
                                   hook_->name(), out.defined() ? shapeStr(out.sizes()) : "an undefined tensor", b,
                                   shapeStr(bucket.buffer.sizes())));
    }
    if (!isViewOf(out, bucket.buffer)) bucket.buffer.copy_(out);
  }
}

// After the buckets are reduced: every parameter some rank used shows the average in .grad; one
// no rank used keeps .grad undefined, as a single process would (globallyUsed null: every
// parameter counts as used). With gradient-as-bucket-view, used parameters' .grad already is the
// bucket view and only the locally unused ones (this rank's zeros went into the average) need it.
void Reducer::copyReducedIntoGrads(const int32_t* globallyUsed) {
  autograd::NoGradGuard noGrad;
  const bool inContext = autograd::currentGradStore() != nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool usedHere = locallyUsed_[i] != 0;
    if (inContext) {
      if (usedHere || globallyUsed == nullptr || globallyUsed[i] != 0) {
        auto [b, s] = where_[i];
        autograd::setGradOf(params_[i], buckets_[b].views[s].clone());
      }
      continue;
    }
    if (usedHere && opts_.gradientAsBucketView) continue;
    if (!usedHere && globallyUsed != nullptr && globallyUsed[i] == 0) continue;
    auto [b, s] = where_[i];
    const Tensor& view = buckets_[b].views[s];
    if (opts_.gradientAsBucketView) {
      params_[i].setGrad(view);
    } else if (Tensor g = params_[i].grad(); g.defined()) {
      g.copy_(view);
    } else {
      params_[i].setGrad(view.clone());
    }
  }
}

void Reducer::finalize() {
  expectHooks_ = false;
  finalized_ = true;
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(i);
  // Reduce zeros for the missing ones, so peers that got every gradient are not left waiting.
  for (size_t i : missing) markReady(i);

  Tensor usedMap;
  WorkPtr usedWork;
  if (opts_.findUnusedParameters || opts_.staticGraph) {
    usedMap = empty({static_cast<int64_t>(params_.size())}, {.dtype = DType::Int32});
    int32_t* u = usedMap.data<int32_t>();
    for (size_t i = 0; i < params_.size(); ++i) u[i] = locallyUsed_[i];
    usedMap = usedMap.to(control_);
    usedWork = pg_->allreduce(usedMap, {.op = ReduceOp::Max});
  }
  double t0 = now();
  waitRound(usedWork);
  exposedWaitS_ = now() - t0;
  if (usedWork) usedMap = usedMap.to(Device::cpu());
  copyReducedIntoGrads(usedWork ? usedMap.data<int32_t>() : nullptr);
  endRound();
  if (!missing.empty()) {
    std::string names;
    for (size_t k = 0; k < missing.size() && k < 8; ++k) names += (k ? ", " : "") + paramLabel(missing[k]);
    if (missing.size() > 8) names += fmt::format(", and {} more", missing.size() - 8);
    throw ValueError(fmt::format(
        "DistributedDataParallel (rank {}): {} parameter(s) received no gradient in this backward: {}. DDP waits for "
        "every parameter's gradient; if some parameters are unused in some iterations, construct "
        "DistributedDataParallel with findUnusedParameters = true (or staticGraph = true when the set never "
        "changes); if they are used, check that every output of forward contributes to the loss",
        pg_->rank(), missing.size(), names));
  }
}

void Reducer::shadowBackward() {
  resetIteration();
  {
    autograd::NoGradGuard noGrad;
    for (auto& b : buckets_) b.buffer.zero_();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = 0;
    launch(b);
  }
  Tensor usedMap;
  WorkPtr usedWork;
  if (opts_.findUnusedParameters || opts_.staticGraph) {
    usedMap = zeros({static_cast<int64_t>(params_.size())}, {.dtype = DType::Int32, .device = control_});
    usedWork = pg_->allreduce(usedMap, {.op = ReduceOp::Max});
  }
  waitRound(usedWork);
  endRound();
}

// Waits for every bucket's reduction and the used-parameter map's; on an error the iteration is
// reset (so the next forward starts clean) and the error rethrown.
void Reducer::waitRound(const WorkPtr& usedWork) {
  try {
    waitBuckets();
    if (usedWork) usedWork->wait();
  } catch (...) {
    resetIteration();
    throw;
  }
}

void Reducer::endRound() {
  for (auto& b : buckets_) b.launched = false;
  ++iterations_;
  if (!rebuilt_ && (!opts_.findUnusedParameters || opts_.staticGraph)) rebuildPending_ = true;
}

}  // namespace cohort::dist
