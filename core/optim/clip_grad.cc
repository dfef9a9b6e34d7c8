#include <cohort/core/optim/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>

namespace cohort::optim {

namespace {

// The p-norm of one contiguous tensor, accumulated in double.
template <typename T>
double tensorNorm(const T* x, int64_t n, double p) {
  if (std::isinf(p)) {
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double a = std::fabs(static_cast<double>(static_cast<Acc<T>>(x[i])));
      if (std::isnan(a)) return a;
      m = a > m ? a : m;
    }
    return m;
  }
  if (p == 0.0) {
    double c = 0.0;
    for (int64_t i = 0; i < n; ++i) c += static_cast<Acc<T>>(x[i]) != 0 ? 1.0 : 0.0;
    return c;
  }
  double s = 0.0;
  if (p == 2.0) {
    for (int64_t i = 0; i < n; ++i) {
      double a = static_cast<double>(static_cast<Acc<T>>(x[i]));
      s += a * a;
    }
    return std::sqrt(s);
  }
  if (p == 1.0) {
    for (int64_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(static_cast<Acc<T>>(x[i])));
    return s;
  }
  for (int64_t i = 0; i < n; ++i) s += std::pow(std::fabs(static_cast<double>(static_cast<Acc<T>>(x[i]))), p);
  return std::pow(s, 1.0 / p);
}

double combine(const std::vector<double>& norms, double p) {
  if (std::isinf(p)) {
    double m = 0.0;
    for (double v : norms) {
      if (std::isnan(v)) return v;
      m = v > m ? v : m;
    }
    return m;
  }
  if (p == 0.0) {
    double s = 0.0;
    for (double v : norms) s += v;
    return s;
  }
  double s = 0.0;
  for (double v : norms) s += std::pow(v, p);
  return std::pow(s, 1.0 / p);
}

std::vector<Tensor> gradsOf(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined()) continue;
    // A wrapper's parameter (FSDP) has no .grad of its own: a norm without it would be wrong.
    if (const std::string* owner = autograd::managedBy(p))
      throw ValueError(fmt::format("{}: parameter {} (shape {}) {}", op, i, shapeStr(p.sizes()), *owner));
    Tensor g = p.grad();
    if (g.defined()) out.push_back(g);
  }
  return out;
}

// One gradient's p-norm in double, for a device that reads its gradients in place: registered
// under "gradNorm" (the CPU's accumulates in double).
using GradNormKernel = double(const Tensor& g, double p, const char* op);

double gradNormCpu(const Tensor& g, double p, const char* op) {
  const Tensor c = g.contiguous();
  return COHORT_DISPATCH_FLOAT(c.dtype(), op, [&]<typename T>() { return tensorNorm<T>(c.data<T>(), c.numel(), p); });
}

const dispatch::Register<GradNormKernel> kGradNormCpu{"gradNorm", DeviceType::CPU, &gradNormCpu};

// Gradients on a device with a "gradNorm" kernel are read in place. Any other device's get one norm
// each from the norm op (16-bit ones widened to float32 first, so that a norm keeps float32's
// precision rather than bfloat16's), and those come to the host in one copy per device: one
// synchronisation per device, not one per tensor.
double totalNorm(const std::vector<Tensor>& grads, double p, const char* op) {
  if (!(p >= 0.0)) throw ValueError(fmt::format("{}: norm type must be >= 0 or infinity, got {}", op, p));
  std::vector<double> norms;
  norms.reserve(grads.size());
  std::vector<std::pair<Device, std::vector<Tensor>>> onDevices;
  for (const Tensor& g : grads) {
    if (GradNormKernel* inPlace = dispatch::find<GradNormKernel>("gradNorm", g.device())) {
      norms.push_back(inPlace(g, p, op));
      continue;
    }
    const bool half = g.dtype() == DType::BFloat16 || g.dtype() == DType::Float16;
    const Tensor wide = half ? g.to(DType::Float32) : g;  // norm refuses non-float gradients by name
    auto it = std::find_if(onDevices.begin(), onDevices.end(), [&](const auto& e) { return e.first == g.device(); });
    if (it == onDevices.end()) it = onDevices.insert(onDevices.end(), {g.device(), {}});
    it->second.push_back(wide.norm(p).to(DType::Float64).reshape({1}));
  }
  for (const auto& [device, parts] : onDevices) {
    const Tensor host = cat(parts).to(Device::cpu());
    const double* v = host.data<double>();
    norms.insert(norms.end(), v, v + host.numel());
  }
  return combine(norms, p);
}

}  // namespace

double gradNorm(const std::vector<Tensor>& params, double normType) {
  return totalNorm(gradsOf(params, "gradNorm"), normType, "gradNorm");
}

double clipGradNorm(const std::vector<Tensor>& params, double maxNorm, double normType, bool errorIfNonfinite) {
  std::vector<Tensor> grads = gradsOf(params, "clipGradNorm");
  if (grads.empty()) return 0.0;
  const double total = totalNorm(grads, normType, "clipGradNorm");
  if (errorIfNonfinite && !std::isfinite(total))
    throw ValueError(fmt::format("clipGradNorm: the total norm of order {} of the gradients is {}; nothing was scaled",
                                 normType, total));
  const double coef = maxNorm / (total + 1e-6);
  if (!(coef < 1.0)) return total;  // torch multiplies by clamp(coef, max=1): a no-op here
  autograd::NoGradGuard ng;
  // In the gradient's dtype on its device: the product in float (double for float64), rounded once.
  for (Tensor& g : grads) g.mul_(coef);
  return total;
}

}  // namespace cohort::optim
