#include <cohort/core/optim/sgd.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/detail/fused_step.h>

namespace cohort::optim {

GroupOptions SGDOptions::toMap() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weightDecay},
          {"nesterov", nesterov ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults) : Optimizer("SGD", defaults.toMap()) {
  if (groups.empty()) throw ValueError("SGD: got an empty list of parameter groups");
  for (ParamGroup& g : groups) addParamGroup(std::move(g));
  if (parameters().empty()) throw ValueError("SGD: got an empty parameter list");
}

void SGD::checkOptions(const GroupOptions& o) const {
  const double lr = o.at("lr"), momentum = o.at("momentum"), dampening = o.at("dampening"), wd = o.at("weight_decay");
  if (!(lr >= 0.0)) throw ValueError(fmt::format("SGD: invalid learning rate {}", lr));
  if (!(momentum >= 0.0)) throw ValueError(fmt::format("SGD: invalid momentum {}", momentum));
  if (!(wd >= 0.0)) throw ValueError(fmt::format("SGD: invalid weight_decay {}", wd));
  if (o.at("nesterov") != 0.0 && (momentum <= 0.0 || dampening != 0.0))
    throw ValueError(fmt::format("SGD: Nesterov momentum requires a momentum > 0 and zero dampening (momentum {}, "
                                 "dampening {})",
                                 momentum, dampening));
}

namespace {

using detail::HostMath;

// One fused pass over a contiguous parameter; T is the storage type, A the compute type, G the
// gradient's type (T, or a half type read into a float32 master weight). The arithmetic is
// detail/update_math.h's, as in the CUDA kernel (bit-identical results).
template <typename T, typename G>
void sgdKernel(T* p, const G* g, T* buf, int64_t n, const detail::SgdScalars& s) {
  using A = Acc<T>;
  const A negLr = static_cast<A>(-s.lr), wd = static_cast<A>(s.weightDecay), mom = static_cast<A>(s.momentum);
  const A damp = static_cast<A>(1.0 - s.dampening);
  const A sign = s.maximize ? A(-1) : A(1);
  if (buf == nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      A pv = static_cast<A>(p[i]);
      A d = detail::sgdDirection<HostMath>(static_cast<A>(g[i]), pv, sign, wd);
      p[i] = static_cast<T>(detail::sgdApply<HostMath>(pv, negLr, d));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    A pv = static_cast<A>(p[i]);
    A d = detail::sgdDirection<HostMath>(static_cast<A>(g[i]), pv, sign, wd);
    A b = s.firstStep ? d : detail::sgdBuffer<HostMath>(static_cast<A>(buf[i]), d, mom, damp);
    buf[i] = static_cast<T>(b);
    b = static_cast<A>(static_cast<T>(b));  // torch keeps buf in T and reads it back
    A upd = s.nesterov ? detail::sgdNesterov<HostMath>(d, b, mom) : b;
    p[i] = static_cast<T>(detail::sgdApply<HostMath>(pv, negLr, upd));
  }
}

}  // namespace

void SGD::stepGroup(ParamGroup& group) {
  const double lr = group.option("lr"), momentum = group.option("momentum"), dampening = group.option("dampening");
  const double wd = group.option("weight_decay");
  const bool nesterov = group.option("nesterov") != 0.0, maximize = group.option("maximize") != 0.0;
  for (Tensor& param : group.params) {
    Tensor grad = gradFor(param);
    if (!grad.defined()) continue;
    Tensor g = updateGrad(param, std::move(grad), "SGD.step", /*readsHalf=*/true);
    Tensor p = param.isContiguous() ? param : param.contiguous();
    ParamState& st = stateFor(param);
    Tensor buf;
    bool first = false;
    if (momentum != 0.0) {
      auto it = st.tensors.find("momentum_buffer");
      if (it == st.tensors.end()) {
        buf = empty(param.sizes(), {.dtype = param.dtype(), .device = param.device()});
        st.tensors["momentum_buffer"] = buf;
        first = true;
      } else {
        Tensor& b = it->second;
        if (b.sizes() != param.sizes())
          throw ValueError(fmt::format("SGD.step: momentum buffer of shape {} for a parameter of shape {}",
                                       shapeStr(b.sizes()), shapeStr(param.sizes())));
        if (b.device() != param.device()) b = b.to(param.device());  // e.g. state loaded on the CPU
        if (b.dtype() != param.dtype() || !b.isContiguous()) b = b.to(param.dtype()).contiguous();
        buf = b;
      }
    }
    ++st.step;
    const detail::SgdScalars s{.lr = lr,
                               .momentum = momentum,
                               .dampening = dampening,
                               .weightDecay = wd,
                               .nesterov = nesterov,
                               .maximize = maximize,
                               .firstStep = first};
    dispatch::kernel<detail::SgdStepKernel>("SGD.step", param.device())(p, g, buf, s);
    if (!p.isSameAs(param)) param.copy_(p);
    param.bumpVersion();
  }
}

namespace {

void sgdStepCpu(Tensor& p, const Tensor& g, Tensor& buf, const detail::SgdScalars& s) {
  dispatchUpdate(p, g, "SGD.step", [&]<typename T, typename G>() {
    sgdKernel<T, G>(p.data<T>(), g.data<G>(), buf.defined() ? buf.data<T>() : nullptr, p.numel(), s);
  });
}

const dispatch::Register<detail::SgdStepKernel> kSgdCpu{"SGD.step", DeviceType::CPU, &sgdStepCpu};

}  // namespace

}  // namespace cohort::optim
