#include <cohort/core/optim/adam.h>

#include <cmath>

#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/detail/fused_step.h>

namespace cohort::optim {

namespace {
GroupOptions adamMap(double lr, double b1, double b2, double eps, double wd, bool amsgrad, bool maximize) {
  return {{"lr", lr},
          {"beta1", b1},
          {"beta2", b2},
          {"eps", eps},
          {"weight_decay", wd},
          {"amsgrad", amsgrad ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}
}  // namespace

GroupOptions AdamOptions::toMap() const { return adamMap(lr, beta1, beta2, eps, weightDecay, amsgrad, maximize); }
GroupOptions AdamWOptions::toMap() const { return adamMap(lr, beta1, beta2, eps, weightDecay, amsgrad, maximize); }

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults) : Optimizer("Adam", defaults.toMap()) {
  if (groups.empty()) throw ValueError("Adam: got an empty list of parameter groups");
  for (ParamGroup& g : groups) addParamGroup(std::move(g));
  if (parameters().empty()) throw ValueError("Adam: got an empty parameter list");
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults) : Adam("AdamW", defaults.toMap(), true) {
  if (groups.empty()) throw ValueError("AdamW: got an empty list of parameter groups");
  for (ParamGroup& g : groups) addParamGroup(std::move(g));
  if (parameters().empty()) throw ValueError("AdamW: got an empty parameter list");
}

void Adam::checkOptions(const GroupOptions& o) const {
  const char* name = decoupled_ ? "AdamW" : "Adam";
  const double lr = o.at("lr"), b1 = o.at("beta1"), b2 = o.at("beta2"), eps = o.at("eps"), wd = o.at("weight_decay");
  if (!(lr >= 0.0)) throw ValueError(fmt::format("{}: invalid learning rate {}", name, lr));
  if (!(eps >= 0.0)) throw ValueError(fmt::format("{}: invalid epsilon {}", name, eps));
  if (!(b1 >= 0.0 && b1 < 1.0)) throw ValueError(fmt::format("{}: invalid beta1 {} (must be in [0, 1))", name, b1));
  if (!(b2 >= 0.0 && b2 < 1.0)) throw ValueError(fmt::format("{}: invalid beta2 {} (must be in [0, 1))", name, b2));
  if (!(wd >= 0.0)) throw ValueError(fmt::format("{}: invalid weight_decay {}", name, wd));
}

namespace {

using detail::AdamScalars;
using detail::HostMath;

// One fused pass over contiguous tensors, in torch's operation order (see adam.h), with the
// arithmetic of detail/update_math.h (the CUDA kernel's: bit-identical results). G is the
// gradient's element type: T, or bfloat16/float16 for a float32 master weight, widened as it is
// read (exactly, so the result equals widening the gradient first).
template <typename T, typename G, bool kDecoupled, bool kAmsgrad>
void adamKernel(T* __restrict p, const G* __restrict g, T* __restrict m, T* __restrict v, T* __restrict vmax, int64_t n,
                const AdamScalars& s) {
  using A = Acc<T>;
  const A decay = static_cast<A>(s.decay), wd = static_cast<A>(s.wd);
  const A b1 = static_cast<A>(s.beta1), omb1 = static_cast<A>(s.oneMinusBeta1);
  const A b2 = static_cast<A>(s.beta2), omb2 = static_cast<A>(s.oneMinusBeta2);
  const A bc2 = static_cast<A>(s.bc2Sqrt), eps = static_cast<A>(s.eps), negStep = static_cast<A>(s.negStepSize);
  const A sign = s.maximize ? A(-1) : A(1);
  for (int64_t i = 0; i < n; ++i) {
    const A pv = static_cast<A>(p[i]);
    const A gv = detail::adamGrad<HostMath>(static_cast<A>(g[i]), pv, sign, wd, kDecoupled);
    const A mv = detail::adamExpAvg<HostMath>(static_cast<A>(m[i]), gv, b1, omb1);
    const A vv = detail::adamExpAvgSq<HostMath>(static_cast<A>(v[i]), gv, b2, omb2);
    m[i] = static_cast<T>(mv);
    v[i] = static_cast<T>(vv);
    A denomSrc = vv;
    if constexpr (kAmsgrad) {
      const A mx = detail::adamMax(static_cast<A>(vmax[i]), vv);
      vmax[i] = static_cast<T>(mx);
      denomSrc = mx;
    }
    const A denom = detail::adamDenom<HostMath>(denomSrc, bc2, eps);
    p[i] = static_cast<T>(detail::adamApply<HostMath>(pv, mv, denom, negStep, decay, kDecoupled));
  }
}

template <typename T, typename G>
void adamDispatch(T* p, const G* g, T* m, T* v, T* vmax, int64_t n, const AdamScalars& s) {
  if (s.decoupled) {
    if (s.amsgrad) adamKernel<T, G, true, true>(p, g, m, v, vmax, n, s);
    else adamKernel<T, G, true, false>(p, g, m, v, vmax, n, s);
  } else {
    if (s.amsgrad) adamKernel<T, G, false, true>(p, g, m, v, vmax, n, s);
    else adamKernel<T, G, false, false>(p, g, m, v, vmax, n, s);
  }
}

Tensor& stateTensor(ParamState& st, const char* key, const Tensor& param, const char* op) {
  auto it = st.tensors.find(key);
  if (it != st.tensors.end()) {
    Tensor& t = it->second;
    if (t.sizes() != param.sizes())
      throw ValueError(fmt::format("{}: state '{}' has shape {}, the parameter {}", op, key, shapeStr(t.sizes()),
                                   shapeStr(param.sizes())));
    if (t.device() != param.device()) t = t.to(param.device());  // e.g. state loaded on the CPU
    if (t.dtype() != param.dtype() || !t.isContiguous()) t = t.to(param.dtype()).contiguous();  // e.g. after Module::to
    return t;
  }
  return st.tensors[key] = zeros(param.sizes(), {.dtype = param.dtype(), .device = param.device()});
}

}  // namespace

void Adam::stepGroup(ParamGroup& group) {
  const char* op = decoupled_ ? "AdamW.step" : "Adam.step";
  const double lr = group.option("lr"), beta1 = group.option("beta1"), beta2 = group.option("beta2");
  const double eps = group.option("eps"), wd = group.option("weight_decay");
  const bool amsgrad = group.option("amsgrad") != 0.0, maximize = group.option("maximize") != 0.0;
  for (Tensor& param : group.params) {
    Tensor grad = gradFor(param);
    if (!grad.defined()) continue;
    Tensor g = updateGrad(param, std::move(grad), op, /*readsHalf=*/true);
    Tensor p = param.isContiguous() ? param : param.contiguous();
    ParamState& st = stateFor(param);
    Tensor& m = stateTensor(st, "exp_avg", param, op);
    Tensor& v = stateTensor(st, "exp_avg_sq", param, op);
    Tensor vmax = amsgrad ? stateTensor(st, "max_exp_avg_sq", param, op) : Tensor();
    const int64_t step = ++st.step;
    AdamScalars s;
    s.decay = 1.0 - lr * wd;
    s.wd = wd;
    s.beta1 = beta1;
    s.oneMinusBeta1 = 1.0 - beta1;
    s.beta2 = beta2;
    s.oneMinusBeta2 = 1.0 - beta2;
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    s.bc2Sqrt = std::sqrt(bc2);
    s.eps = eps;
    s.negStepSize = -(lr / bc1);
    s.decoupled = decoupled_;
    s.amsgrad = amsgrad;
    s.maximize = maximize;
    dispatch::kernel<detail::AdamStepKernel>(op, param.device())(p, g, m, v, vmax, s);
    if (!p.isSameAs(param)) param.copy_(p);
    param.bumpVersion();
  }
}

namespace {

void adamStepCpu(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& vmax, const AdamScalars& s) {
  dispatchUpdate(p, g, s.decoupled ? "AdamW.step" : "Adam.step", [&]<typename T, typename G>() {
    adamDispatch<T, G>(p.data<T>(), g.data<G>(), m.data<T>(), v.data<T>(), vmax.defined() ? vmax.data<T>() : nullptr,
                       p.numel(), s);
  });
}

const dispatch::Register<detail::AdamStepKernel> kAdamCpu{"Adam.step", DeviceType::CPU, &adamStepCpu};
const dispatch::Register<detail::AdamStepKernel> kAdamWCpu{"AdamW.step", DeviceType::CPU, &adamStepCpu};

}  // namespace

}  // namespace cohort::optim
