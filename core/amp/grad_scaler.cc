#include <cohort/core/amp/grad_scaler.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/iter.h>
#include <cohort/core/util/parallel.h>

namespace cohort::amp {

namespace {

constexpr const char* kScale = "scale";
constexpr const char* kGrowthTracker = "growth_tracker";
constexpr const char* kGrowthFactor = "growth_factor";
constexpr const char* kBackoffFactor = "backoff_factor";
constexpr const char* kGrowthInterval = "growth_interval";

// `v` as a float32 scale: ValueError naming `what` unless it is > 0 and finite in float32.
float toScale(double v, const char* where, const char* what) {
  COHORT_CHECK_T(ValueError, std::isfinite(v) && v > 0.0, "{}: {} must be > 0 and finite, got {}", where, what, v);
  const auto f = static_cast<float>(v);
  COHORT_CHECK_T(ValueError, std::isfinite(f) && f > 0.0F, "{}: {} = {} is not > 0 and finite in float32", where, what,
                 v);
  return f;
}

// One fused pass over a contiguous gradient: multiply in Acc<T>, round once to T, and note
// whether any stored value is inf or NaN (which catches inf/NaN inputs too: the factor is finite
// and > 0). The flag is an integer OR so the loop vectorizes.
template <typename T>
bool unscaleContiguous(T* data, int64_t n, float invScale) {
  using A = Acc<T>;
  const auto factor = static_cast<A>(invScale);
  constexpr A kMax = std::numeric_limits<A>::max();
  std::atomic<bool> found{false};
  parallelFor(n, cohort::detail::kComputeBoundGrain, [&](int64_t begin, int64_t end) {
    int bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      const T stored = static_cast<T>(static_cast<A>(data[i]) * factor);
      data[i] = stored;
      bad |= static_cast<int>(!(std::abs(static_cast<A>(stored)) <= kMax));
    }
    if (bad != 0) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

// The same with existing ops, for any device: scale in float32 (float64 for float64), store,
// then test the stored values (x * 0 is NaN exactly for inf/NaN x, and NaN survives the sum).
bool unscaleWithOps(const Tensor& grad, float invScale) {
  const DType dt = grad.dtype();
  const bool wide = dt == DType::Float32 || dt == DType::Float64;
  Tensor work = wide ? grad : grad.to(DType::Float32);
  work.mul_(Scalar(static_cast<double>(invScale)));
  if (!wide) {
    Tensor g = grad;
    g.copy_(work);
  }
  Tensor stored = wide ? grad : grad.to(DType::Float32);
  return !std::isfinite(mul(stored, Scalar(0.0)).sum().itemDouble());
}

// The fused unscale of one gradient, for a device that has one: registered under
// "GradScaler.unscale"; returns whether a stored value is inf or NaN.
using UnscaleKernel = bool(const Tensor& grad, float invScale);

bool unscaleCpu(const Tensor& grad, float invScale) {
  Tensor work = grad.isContiguous() ? grad : grad.contiguous();
  bool found = COHORT_DISPATCH_FLOAT(grad.dtype(), "GradScaler.unscale", [&]<typename T>() {
    return unscaleContiguous<T>(work.data<T>(), work.numel(), invScale);
  });
  if (!work.isSameAs(grad)) {
    Tensor g = grad;
    g.copy_(work);
  }
  grad.bumpVersion();
  return found;
}

const dispatch::Register<UnscaleKernel> kUnscaleCpu{"GradScaler.unscale", DeviceType::CPU, &unscaleCpu};

}  // namespace

void checkOptions(const GradScalerOptions& o, const char* where) {
  toScale(o.initScale, where, "initScale");
  COHORT_CHECK_T(ValueError, std::isfinite(o.growthFactor) && o.growthFactor > 1.0,
                 "{}: growthFactor must be > 1 and finite, got {}", where, o.growthFactor);
  COHORT_CHECK_T(ValueError, o.backoffFactor > 0.0 && o.backoffFactor < 1.0,
                 "{}: backoffFactor must be in (0, 1), got {}", where, o.backoffFactor);
  COHORT_CHECK_T(ValueError, o.growthInterval >= 1 && o.growthInterval <= std::numeric_limits<int32_t>::max(),
                 "{}: growthInterval must be in [1, 2^31 - 1], got {}", where, o.growthInterval);
}

namespace detail {

bool unscaleGrad(const Tensor& grad, float invScale, bool fused) {
  COHORT_CHECK_T(ValueError, grad.defined() && grad.isFloatingPoint(),
                 "GradScaler.unscale: a gradient must be a defined floating-point tensor, got {}",
                 grad.defined() ? dtypeName(grad.dtype()) : "an undefined tensor");
  autograd::NoGradGuard noGrad;
  if (grad.numel() == 0) return false;
  UnscaleKernel* fusedKernel = fused ? dispatch::find<UnscaleKernel>("GradScaler.unscale", grad.device()) : nullptr;
  if (fusedKernel == nullptr) return unscaleWithOps(grad, invScale);
  return fusedKernel(grad, invScale);
}

}  // namespace detail

GradScaler::GradScaler(GradScalerOptions options, FoundInfReduction reduceFoundInf)
    : opts_(options), reduce_(std::move(reduceFoundInf)), scale_(1.0F) {
  checkOptions(opts_);
  scale_ = static_cast<float>(opts_.initScale);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  COHORT_CHECK_T(ValueError, loss.defined(), "GradScaler.scale: the loss is an undefined tensor");
  COHORT_CHECK_T(ValueError, loss.isFloatingPoint(),
                 "GradScaler.scale: the loss must be a floating-point tensor, got {} (shape {})", loss.dtype(),
                 shapeStr(loss.sizes()));
  if (!opts_.enabled) return loss;
  return mul(loss, Scalar(static_cast<double>(scale_)));
}

void GradScaler::unscale(optim::Optimizer& optimizer) {
  if (!opts_.enabled) return;
  PerOptimizer& st = perOptimizer_[&optimizer];
  COHORT_CHECK_T(ValueError, st.stage != Stage::Unscaled,
                 "GradScaler.unscale: already called for this {} optimizer since the last update(); call it once "
                 "per optimizer per iteration",
                 optimizer.type());
  COHORT_CHECK_T(ValueError, st.stage != Stage::Stepped,
                 "GradScaler.unscale: called after step() for this {} optimizer; call update() to start the next "
                 "iteration first",
                 optimizer.type());
  std::vector<Tensor> grads;
  int64_t numParams = 0;
  for (const optim::ParamGroup& g : optimizer.paramGroups()) {
    for (const Tensor& p : g.params) {
      if (const std::string* owner = autograd::managedBy(p))
        throw ValueError(fmt::format("GradScaler.unscale: parameter {} (shape {}) of the {} optimizer {}", numParams,
                                     shapeStr(p.sizes()), optimizer.type(), *owner));
      ++numParams;
      Tensor grad = p.grad();
      if (grad.defined()) grads.push_back(std::move(grad));
    }
  }
  COHORT_CHECK_T(ValueError, numParams > 0, "GradScaler.unscale: the {} optimizer has no parameters", optimizer.type());
  // The reciprocal in double, rounded to float32 once, as torch takes it.
  const auto invScale = static_cast<float>(1.0 / static_cast<double>(scale_));
  bool found = false;
  for (const Tensor& grad : grads) found = detail::unscaleGrad(grad, invScale) || found;
  // Every rank reaches the reduction, also one whose gradients are missing (its error follows),
  // so the others are not left waiting in the collective.
  if (reduce_) found = reduce_(found);
  COHORT_CHECK_T(ValueError, !grads.empty(),
                 "GradScaler.unscale: none of the {} parameters of the {} optimizer has a gradient; call backward() "
                 "on scale(loss) first",
                 numParams, optimizer.type());
  st.foundInf = found;
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!opts_.enabled) {
    optimizer.step();
    return true;
  }
  {
    auto it = perOptimizer_.find(&optimizer);
    COHORT_CHECK_T(ValueError, it == perOptimizer_.end() || it->second.stage != Stage::Stepped,
                   "GradScaler.step: already called for this {} optimizer since the last update(); call update() "
                   "once per iteration",
                   optimizer.type());
    if (it == perOptimizer_.end() || it->second.stage == Stage::Ready) unscale(optimizer);
  }
  PerOptimizer& st = perOptimizer_.at(&optimizer);
  const bool stepped = !st.foundInf;
  if (stepped) optimizer.step();
  st.stage = Stage::Stepped;
  return stepped;
}

void GradScaler::update() {
  if (!opts_.enabled) return;
  bool anyRecorded = false, found = false;
  for (const auto& [opt, st] : perOptimizer_) {
    if (st.stage == Stage::Ready) continue;
    anyRecorded = true;
    found = found || st.foundInf;
  }
  COHORT_CHECK_T(ValueError, anyRecorded,
                 "GradScaler.update: no optimizer was unscaled or stepped since the last update(); call "
                 "step(optimizer) first");
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * opts_.backoffFactor);
    growthTracker_ = 0;
  } else if (growthTracker_ + 1 == opts_.growthInterval) {
    const auto grown = static_cast<float>(static_cast<double>(scale_) * opts_.growthFactor);
    if (std::isfinite(grown)) scale_ = grown;
    growthTracker_ = 0;
  } else {
    ++growthTracker_;
  }
  perOptimizer_.clear();
}

void GradScaler::update(double newScale) {
  if (!opts_.enabled) return;
  scale_ = toScale(newScale, "GradScaler.update", "newScale");
  perOptimizer_.clear();
}

double GradScaler::getScale() const { return opts_.enabled ? static_cast<double>(scale_) : 1.0; }

std::optional<bool> GradScaler::foundInf(const optim::Optimizer& optimizer) const {
  auto it = perOptimizer_.find(&optimizer);
  if (it == perOptimizer_.end() || it->second.stage == Stage::Ready) return std::nullopt;
  return it->second.foundInf;
}

GradScalerState GradScaler::stateDict() const {
  if (!opts_.enabled) return {};
  return {{kScale, static_cast<double>(scale_)},
          {kGrowthTracker, static_cast<double>(growthTracker_)},
          {kGrowthFactor, opts_.growthFactor},
          {kBackoffFactor, opts_.backoffFactor},
          {kGrowthInterval, static_cast<double>(opts_.growthInterval)}};
}

void GradScaler::checkStateDict(const GradScalerState& state) const {
  constexpr const char* kWhere = "GradScaler.loadStateDict";
  if (!opts_.enabled) return;
  COHORT_CHECK_T(ValueError, !state.empty(),
                 "{}: the state is empty (a disabled scaler saves an empty state); this scaler is enabled", kWhere);
  const std::vector<const char*> keys = {kScale, kGrowthTracker, kGrowthFactor, kBackoffFactor, kGrowthInterval};
  std::vector<std::string> present;
  for (const auto& [k, v] : state) present.push_back(k);
  for (const char* k : keys)
    COHORT_CHECK_T(ValueError, state.count(k) != 0, "{}: the state has no \"{}\" (it has: {})", kWhere, k,
                   fmt::join(present, ", "));
  for (const auto& [k, v] : state) {
    bool known = false;
    for (const char* key : keys) known = known || k == key;
    COHORT_CHECK_T(ValueError, known, "{}: unknown entry \"{}\" in the state (expected {})", kWhere, k,
                   fmt::join(keys, ", "));
  }
  auto isCount = [](double v) { return std::isfinite(v) && v == std::floor(v) && std::abs(v) < 9.0e15; };
  const double interval = state.at(kGrowthInterval), tracker = state.at(kGrowthTracker);
  COHORT_CHECK_T(ValueError, isCount(interval), "{}: \"{}\" must be an integer, got {}", kWhere, kGrowthInterval,
                 interval);
  GradScalerOptions o = opts_;
  o.initScale = state.at(kScale);
  o.growthFactor = state.at(kGrowthFactor);
  o.backoffFactor = state.at(kBackoffFactor);
  o.growthInterval = static_cast<int64_t>(interval);
  try {
    checkOptions(o, kWhere);
  } catch (const ValueError& e) {
    // Name the state's entries, not the options they become.
    throw ValueError(fmt::format("{} (in the state: \"{}\" = {}, \"{}\" = {}, \"{}\" = {}, \"{}\" = {})", e.what(),
                                 kScale, o.initScale, kGrowthFactor, o.growthFactor, kBackoffFactor, o.backoffFactor,
                                 kGrowthInterval, interval));
  }
  COHORT_CHECK_T(ValueError, isCount(tracker) && tracker >= 0.0 && tracker < interval,
                 "{}: \"{}\" must be an integer in [0, {} = {}), got {}", kWhere, kGrowthTracker, kGrowthInterval,
                 interval, tracker);
}

void GradScaler::loadStateDict(const GradScalerState& state) {
  checkStateDict(state);
  if (!opts_.enabled) return;
  scale_ = static_cast<float>(state.at(kScale));
  growthTracker_ = static_cast<int64_t>(state.at(kGrowthTracker));
  opts_.initScale = state.at(kScale);
  opts_.growthFactor = state.at(kGrowthFactor);
  opts_.backoffFactor = state.at(kBackoffFactor);
  opts_.growthInterval = static_cast<int64_t>(state.at(kGrowthInterval));
}

}  // namespace cohort::amp
