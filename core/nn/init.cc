#include <cohort/core/nn/init.h>

#include <cmath>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>

namespace cohort::nn::init {

std::pair<int64_t, int64_t> fanInAndFanOut(const Tensor& t) {
  if (t.dim() < 2)
    throw ValueError(
        fmt::format("init: fan in and fan out need a tensor with at least 2 dims, got shape {}", shapeStr(t.sizes())));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculateGain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" || nonlinearity == "conv3d" ||
      nonlinearity == "sigmoid")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw ValueError(fmt::format("init.calculateGain: unsupported nonlinearity '{}'", nonlinearity));
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  autograd::NoGradGuard ng;
  return cohort::uniform_(t, low, high, gen);
}

Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen) {
  autograd::NoGradGuard ng;
  return cohort::normal_(t, mean, stddev, gen);
}

Tensor& constant_(Tensor& t, double value) {
  autograd::NoGradGuard ng;
  return t.fill_(value);
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

namespace {
double kaimingStd(const Tensor& t, double a, FanMode mode, const std::string& nonlinearity) {
  auto [fanIn, fanOut] = fanInAndFanOut(t);
  int64_t fan = mode == FanMode::FanIn ? fanIn : fanOut;
  if (fan == 0) throw ValueError(fmt::format("init.kaiming: fan is 0 for a tensor of shape {}", shapeStr(t.sizes())));
  return calculateGain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

Tensor& kaimingUniform_(Tensor& t, double a, FanMode mode, const std::string& nonlinearity, Generator* gen) {
  double bound = std::sqrt(3.0) * kaimingStd(t, a, mode, nonlinearity);
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& kaimingNormal_(Tensor& t, double a, FanMode mode, const std::string& nonlinearity, Generator* gen) {
  return init::normal_(t, 0.0, kaimingStd(t, a, mode, nonlinearity), gen);
}

Tensor& xavierUniform_(Tensor& t, double gain, Generator* gen) {
  auto [fanIn, fanOut] = fanInAndFanOut(t);
  double stddev = gain * std::sqrt(2.0 / static_cast<double>(fanIn + fanOut));
  double bound = std::sqrt(3.0) * stddev;
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& xavierNormal_(Tensor& t, double gain, Generator* gen) {
  auto [fanIn, fanOut] = fanInAndFanOut(t);
  return init::normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fanIn + fanOut)), gen);
}

}  // namespace cohort::nn::init
