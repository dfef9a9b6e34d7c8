#include <cohort/core/amp/autocast.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/util/check.h>

namespace cohort::amp {
namespace {

using P = CastPolicy;
constexpr P kPass = P::Passthrough, kLow = P::LowerPrecision, kF32 = P::Float32, kPromote = P::Promote;

// The policy. CPU: PyTorch 1.13's torch.autocast("cpu") lists (lower precision: matrix products,
// linear, convolutions, attention; float32: the losses; promote: cat, stack), plus layer_norm,
// which PyTorch rejects with a half input and float32 weights and cohort computes in the widest.
// cohort's half kernels for softmax, layer_norm and the reductions accumulate in float32 and round
// once, which is why leaving them in the input's dtype on CPU loses little. CUDA: PyTorch's CUDA
// lists, where those ops run in float32.
constexpr OpPolicy kTable[] = {
    // matrix products and convolutions
    {"mm", kLow, kLow},
    {"bmm", kLow, kLow},
    {"matmul", kLow, kLow},
    {"linear", kLow, kLow},
    {"addmm", kLow, kLow},
    {"conv2d", kLow, kLow},
    {"scaledDotProductAttention", kLow, kLow},
    // losses
    {"crossEntropy", kF32, kF32},
    {"nllLoss", kF32, kF32},
    {"mseLoss", kF32, kF32},
    // normalisation and softmax
    {"softmax", kPass, kF32},
    {"logSoftmax", kPass, kF32},
    {"layerNorm", kPromote, kF32},
    // unary math
    {"exp", kPass, kF32},
    {"log", kPass, kF32},
    {"pow", kPass, kF32},
    {"rsqrt", kPass, kF32},
    {"sqrt", kPass, kPass},
    {"abs", kPass, kPass},
    {"neg", kPass, kPass},
    {"tanh", kPass, kPass},
    {"sigmoid", kPass, kPass},
    {"relu", kPass, kPass},
    {"gelu", kPass, kPass},
    {"silu", kPass, kPass},
    {"clamp", kPass, kPass},
    {"dropout", kPass, kPass},
    // binary math (these promote mixed dtypes by themselves)
    {"add", kPass, kPass},
    {"sub", kPass, kPass},
    {"rsub", kPass, kPass},
    {"mul", kPass, kPass},
    {"div", kPass, kPass},
    {"maximum", kPass, kPass},
    {"minimum", kPass, kPass},
    {"where", kPass, kPass},
    {"eq", kPass, kPass},
    {"ne", kPass, kPass},
    {"lt", kPass, kPass},
    {"le", kPass, kPass},
    {"gt", kPass, kPass},
    {"ge", kPass, kPass},
    // reductions
    {"sum", kPass, kF32},
    {"mean", kPass, kPass},
    {"norm", kPass, kF32},
    {"var", kPass, kPass},
    {"std", kPass, kPass},
    {"amax", kPass, kPass},
    {"amin", kPass, kPass},
    {"max", kPass, kPass},
    {"min", kPass, kPass},
    {"argmax", kPass, kPass},
    {"argmin", kPass, kPass},
    // joining
    {"cat", kPromote, kPromote},
    {"stack", kPromote, kPromote},
    // indexing and structure
    {"embedding", kPass, kPass},
    {"indexSelect", kPass, kPass},
    {"gather", kPass, kPass},
    {"scatterAdd", kPass, kPromote},
    {"maskedFill", kPass, kPass},
    {"tril", kPass, kPass},
    {"triu", kPass, kPass},
    {"oneHot", kPass, kPass},
    // pooling
    {"maxPool2d", kPass, kPass},
    {"avgPool2d", kPass, kPass},
};

struct State {
  bool enabled = false;
  DType dtype = DType::BFloat16;
};
thread_local std::array<State, kNumDeviceTypes> tlsDevices;
thread_local bool tlsCacheEnabled = true;
thread_local int tlsDepth = 0;  // enabled scopes open on this thread

struct CacheEntry {
  uint32_t version;
  DType dtype;
  Tensor cast;
};
// Weight casts of the current outermost scope, keyed by the weight's TensorImpl.
thread_local std::unordered_map<const TensorImpl*, CacheEntry> tlsCache;

void refreshActive() {
  bool any = std::any_of(tlsDevices.begin(), tlsDevices.end(), [](const State& s) { return s.enabled; });
  detail::tlsState = (detail::tlsState & ~1u) | (any ? 1u : 0u);
}

}  // namespace

namespace detail {
thread_local unsigned tlsState = 0;
}

const char* castPolicyName(CastPolicy p) {
  switch (p) {
    case P::Passthrough: return "passthrough";
    case P::LowerPrecision: return "lower_precision";
    case P::Float32: return "float32";
    case P::Promote: return "promote";
  }
  return "?";
}

std::span<const OpPolicy> policyTable() { return kTable; }

const OpPolicy& policyFor(std::string_view op) {
  static const auto* index = [] {
    auto* m = new std::unordered_map<std::string_view, const OpPolicy*>();
    for (const OpPolicy& p : kTable) m->emplace(p.op, &p);
    return m;
  }();
  auto it = index->find(op);
  if (it == index->end())
    throw NotSupportedError(fmt::format("autocast: no policy for op '{}' (amp::policyTable() lists the ops)", op));
  return *it->second;
}

std::string policyTableString() {
  std::string out = fmt::format("{:<28}{:<18}{}\n", "op", "cpu", "cuda");
  for (const OpPolicy& p : kTable)
    out += fmt::format("{:<28}{:<18}{}\n", p.op, castPolicyName(p.cpu), castPolicyName(p.cuda));
  return out;
}

Autocast::Autocast(DeviceType device, DType dtype, AutocastOptions options) : device_(device) {
  COHORT_CHECK_T(ValueError, dtype == DType::BFloat16 || dtype == DType::Float16,
                 "Autocast: dtype must be bfloat16 or float16, got {}", dtypeName(dtype));
  auto i = static_cast<size_t>(device);
  COHORT_CHECK_T(ValueError, i < tlsDevices.size(), "Autocast: unknown device type {}", static_cast<int>(device));
  prevEnabled_ = tlsDevices[i].enabled;
  prevDType_ = tlsDevices[i].dtype;
  prevCache_ = tlsCacheEnabled;
  tlsDevices[i] = {options.enabled, dtype};
  tlsCacheEnabled = options.cacheEnabled;
  if (options.enabled) ++tlsDepth;
  refreshActive();
}

Autocast::~Autocast() {
  auto i = static_cast<size_t>(device_);
  if (tlsDevices[i].enabled) --tlsDepth;
  tlsDevices[i] = {prevEnabled_, prevDType_};
  tlsCacheEnabled = prevCache_;
  if (tlsDepth <= 0) {
    tlsDepth = 0;
    tlsCache.clear();  // the outermost enabled scope ended
  }
  refreshActive();
}

AutocastState currentState() {
  AutocastState s;
  for (size_t i = 0; i < tlsDevices.size(); ++i) {
    s.enabled[i] = tlsDevices[i].enabled;
    s.dtype[i] = tlsDevices[i].dtype;
  }
  s.cacheEnabled = tlsCacheEnabled;
  return s;
}

namespace {
void applyState(const AutocastState& s) {
  for (size_t i = 0; i < tlsDevices.size(); ++i) tlsDevices[i] = {s.enabled[i], s.dtype[i]};
  tlsCacheEnabled = s.cacheEnabled;
}
bool anyEnabled(const AutocastState& s) {
  return std::any_of(std::begin(s.enabled), std::end(s.enabled), [](bool e) { return e; });
}
}  // namespace

AutocastStateGuard::AutocastStateGuard(const AutocastState& state)
    : prev_(currentState()), prevFlags_(detail::tlsState), counted_(anyEnabled(state)) {
  applyState(state);
  if (counted_) ++tlsDepth;
  detail::tlsState = 0;
  refreshActive();
}

AutocastStateGuard::~AutocastStateGuard() {
  applyState(prev_);
  if (counted_ && --tlsDepth <= 0) {
    tlsDepth = 0;
    tlsCache.clear();
  }
  detail::tlsState = prevFlags_;
}

bool isEnabled(DeviceType device) { return tlsDevices[static_cast<size_t>(device)].enabled; }
DType autocastDType(DeviceType device) { return tlsDevices[static_cast<size_t>(device)].dtype; }
size_t cachedCasts() { return tlsCache.size(); }

namespace detail {

void collect(const Tensor& t, DType& widest, DeviceType& device, bool& any) {
  if (!t.defined()) return;
  DType dt = t.dtype();
  if (!isFloating(dt) || dt == DType::Float64) return;
  DeviceType d = t.device().type();
  if (!tlsDevices[static_cast<size_t>(d)].enabled) return;
  if (!any) {
    widest = dt;
    device = d;
    any = true;
  } else {
    widest = promoteTypes(widest, dt);
  }
}

CastPlan plan(const OpPolicy& policy, DType widest, DeviceType device) {
  CastPolicy p = device == DeviceType::CUDA ? policy.cuda : policy.cpu;
  switch (p) {
    case P::Passthrough: return {};
    case P::LowerPrecision: return {true, tlsDevices[static_cast<size_t>(device)].dtype, true};
    case P::Float32: return {true, DType::Float32, false};
    case P::Promote: return {true, widest, false};
  }
  return {};
}

Tensor castTensor(const Tensor& t, const CastPlan& p) {
  if (!t.defined() || t.dtype() == p.target || !isFloating(t.dtype()) || t.dtype() == DType::Float64 ||
      !tlsDevices[static_cast<size_t>(t.device().type())].enabled)
    return t;
  // Only casts recorded for autograd are kept: a cast made under NoGradGuard has no path back to
  // the weight and must not be handed to a later op that needs one.
  bool cacheable = p.lower && tlsCacheEnabled && t.dtype() == DType::Float32 && t.isLeaf() && t.requiresGrad() &&
                   autograd::isGradEnabled();
  if (!cacheable) return t.to(p.target);
  auto it = tlsCache.find(t.impl());
  if (it != tlsCache.end() && it->second.version == t.version() && it->second.dtype == p.target) return it->second.cast;
  Tensor cast = t.to(p.target);
  tlsCache[t.impl()] = {t.version(), p.target, cast};
  return cast;
}

}  // namespace detail
}  // namespace cohort::amp
