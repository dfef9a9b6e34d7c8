#include <cohort/core/nn/layers.h>

#include <cmath>

#include <cohort/core/nn/init.h>

namespace cohort::nn {

namespace {
std::string pairStr(std::pair<int64_t, int64_t> p) { return fmt::format("({}, {})", p.first, p.second); }
}  // namespace

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(int64_t inFeatures, int64_t outFeatures, bool bias, Generator* gen)
    : Module("Linear"), in_(inFeatures), out_(outFeatures) {
  if (inFeatures < 0 || outFeatures < 0)
    throw ValueError(fmt::format("Linear: feature counts must be >= 0, got in={} out={}", inFeatures, outFeatures));
  registerParameter("weight", empty({outFeatures, inFeatures}));
  if (bias) registerParameter("bias", empty({outFeatures}));
  resetParameters(gen);
}

void Linear::resetParameters(Generator* gen) {
  Tensor w = weight();
  if (w.numel() == 0) return;  // torch warns and leaves an empty tensor alone
  init::kaimingUniform_(w, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", gen);
  if (hasParameter("bias")) {
    Tensor b = parameter("bias");
    double bound = in_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_)) : 0.0;
    init::uniform_(b, -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& x) {
  if (x.dim() < 1 || x.size(-1) != in_)
    throw ValueError(fmt::format("Linear(in_features={}, out_features={}): expected input of shape [..., {}], got {}",
                                 in_, out_, in_, shapeStr(x.sizes())));
  return linear(x, weight(), bias());
}

std::string Linear::extraRepr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_, out_, hasParameter("bias"));
}

// ---- Embedding -------------------------------------------------------------------------------

Embedding::Embedding(int64_t numEmbeddings, int64_t embeddingDim, Generator* gen)
    : Module("Embedding"), num_(numEmbeddings), dim_(embeddingDim) {
  if (numEmbeddings < 0 || embeddingDim < 0)
    throw ValueError(fmt::format("Embedding: sizes must be >= 0, got {}x{}", numEmbeddings, embeddingDim));
  Tensor w = registerParameter("weight", empty({numEmbeddings, embeddingDim}));
  init::normal_(w, 0.0, 1.0, gen);
}

Embedding::Embedding(Tensor weight) : Module("Embedding") {
  if (!weight.defined() || weight.dim() != 2)
    throw ValueError(fmt::format("Embedding: the weight must be 2-D [num, dim], got {}",
                                 weight.defined() ? shapeStr(weight.sizes()) : "undefined"));
  num_ = weight.size(0);
  dim_ = weight.size(1);
  registerParameter("weight", std::move(weight));
}

Tensor Embedding::forward(const Tensor& indices) {
  if (!isIntegral(indices.dtype()))
    throw ValueError(fmt::format("Embedding({}, {}): indices must be an integer tensor, got {} of shape {}", num_, dim_,
                                 indices.dtype(), shapeStr(indices.sizes())));
  return functional::embedding(indices, weight());
}

std::string Embedding::extraRepr() const { return fmt::format("{}, {}", num_, dim_); }

// ---- LayerNorm -------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalizedShape, double eps, bool elementwiseAffine, bool bias)
    : Module("LayerNorm"), shape_(std::move(normalizedShape)), eps_(eps) {
  if (shape_.empty()) throw ValueError("LayerNorm: normalizedShape is empty");
  if (elementwiseAffine) {
    registerParameter("weight", ones(shape_));
    if (bias) registerParameter("bias", zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int64_t n = static_cast<int64_t>(shape_.size());
  bool ok = x.dim() >= n;
  for (int64_t i = 0; ok && i < n; ++i) ok = x.size(x.dim() - n + i) == shape_[static_cast<size_t>(i)];
  if (!ok)
    throw ValueError(fmt::format("LayerNorm({}): expected input of shape [..., {}], got {}", shapeStr(shape_),
                                 fmt::join(shape_, ", "), shapeStr(x.sizes())));
  return functional::layerNorm(x, shape_, weight(), bias(), eps_);
}

std::string LayerNorm::extraRepr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shapeStr(shape_), eps_, hasParameter("weight"));
}

// ---- Dropout ---------------------------------------------------------------------------------

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p_(p), gen_(gen) {
  if (!(p >= 0.0 && p <= 1.0)) throw ValueError(fmt::format("Dropout: p must be in [0, 1], got {}", p));
}

Tensor Dropout::forward(const Tensor& x) {
  if (!isTraining() || p_ == 0.0) return x;
  return functional::dropout(x, p_, true, gen_);
}

std::string Dropout::extraRepr() const { return fmt::format("p={}", p_); }

// ---- Conv2d ----------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t inChannels, int64_t outChannels, std::pair<int64_t, int64_t> kernelSize,
               functional::Conv2dOptions opts, bool bias, Generator* gen)
    : Module("Conv2d"), in_(inChannels), out_(outChannels), kernel_(kernelSize), opts_(opts) {
  if (opts.groups < 1 || inChannels % opts.groups != 0 || outChannels % opts.groups != 0)
    throw ValueError(fmt::format("Conv2d: in_channels ({}) and out_channels ({}) must be divisible by groups ({})",
                                 inChannels, outChannels, opts.groups));
  if (kernelSize.first < 1 || kernelSize.second < 1)
    throw ValueError(fmt::format("Conv2d: kernel size must be positive, got {}", pairStr(kernelSize)));
  registerParameter("weight", empty({outChannels, inChannels / opts.groups, kernelSize.first, kernelSize.second}));
  if (bias) registerParameter("bias", empty({outChannels}));
  resetParameters(gen);
}

void Conv2d::resetParameters(Generator* gen) {
  Tensor w = weight();
  init::kaimingUniform_(w, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", gen);
  if (hasParameter("bias")) {
    auto [fanIn, fanOut] = init::fanInAndFanOut(w);
    double bound = fanIn > 0 ? 1.0 / std::sqrt(static_cast<double>(fanIn)) : 0.0;
    Tensor b = parameter("bias");
    init::uniform_(b, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  const bool unbatched = x.dim() == 3;
  if ((x.dim() != 4 && !unbatched) || x.size(unbatched ? 0 : 1) != in_)
    throw ValueError(fmt::format("Conv2d({}, {}, kernel_size={}): expected input [N, {}, H, W] or [{}, H, W], got {}",
                                 in_, out_, pairStr(kernel_), in_, in_, shapeStr(x.sizes())));
  Tensor in = unbatched ? x.unsqueeze(0) : x;
  Tensor y = functional::conv2d(in, weight(), bias(), opts_);
  return unbatched ? y.squeeze(0) : y;
}

std::string Conv2d::extraRepr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_, out_, pairStr(kernel_), pairStr(opts_.stride));
  if (opts_.padding != std::pair<int64_t, int64_t>{0, 0}) s += fmt::format(", padding={}", pairStr(opts_.padding));
  if (opts_.dilation != std::pair<int64_t, int64_t>{1, 1}) s += fmt::format(", dilation={}", pairStr(opts_.dilation));
  if (opts_.groups != 1) s += fmt::format(", groups={}", opts_.groups);
  if (!hasParameter("bias")) s += ", bias=false";
  return s;
}

// ---- pooling ---------------------------------------------------------------------------------

namespace {
functional::Pool2dOptions poolOptions(const char* name, std::pair<int64_t, int64_t> kernel,
                                      std::pair<int64_t, int64_t> stride, std::pair<int64_t, int64_t> padding) {
  if (kernel.first < 1 || kernel.second < 1)
    throw ValueError(fmt::format("{}: kernel size must be positive, got {}", name, pairStr(kernel)));
  if (stride.first < 0 || stride.second < 0)
    throw ValueError(fmt::format("{}: stride must be >= 0 (0 = kernel size), got {}", name, pairStr(stride)));
  functional::Pool2dOptions o;
  o.kernel = kernel;
  o.stride = {stride.first == 0 ? kernel.first : stride.first, stride.second == 0 ? kernel.second : stride.second};
  o.padding = padding;
  return o;
}

Tensor pool(const char* name, const Tensor& x, const functional::Pool2dOptions& o,
            Tensor (*fn)(const Tensor&, const functional::Pool2dOptions&)) {
  if (x.dim() != 3 && x.dim() != 4)
    throw ValueError(fmt::format("{}(kernel_size={}): expected input [N, C, H, W] or [C, H, W], got {}", name,
                                 pairStr(o.kernel), shapeStr(x.sizes())));
  if (x.dim() == 3) return fn(x.unsqueeze(0), o).squeeze(0);
  return fn(x, o);
}
}  // namespace

MaxPool2d::MaxPool2d(std::pair<int64_t, int64_t> kernel, std::pair<int64_t, int64_t> stride,
                     std::pair<int64_t, int64_t> padding)
    : Module("MaxPool2d"), opts_(poolOptions("MaxPool2d", kernel, stride, padding)) {}

Tensor MaxPool2d::forward(const Tensor& x) { return pool("MaxPool2d", x, opts_, &functional::maxPool2d); }

std::string MaxPool2d::extraRepr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", pairStr(opts_.kernel), pairStr(opts_.stride),
                     pairStr(opts_.padding));
}

AvgPool2d::AvgPool2d(std::pair<int64_t, int64_t> kernel, std::pair<int64_t, int64_t> stride,
                     std::pair<int64_t, int64_t> padding)
    : Module("AvgPool2d"), opts_(poolOptions("AvgPool2d", kernel, stride, padding)) {}

Tensor AvgPool2d::forward(const Tensor& x) { return pool("AvgPool2d", x, opts_, &functional::avgPool2d); }

std::string AvgPool2d::extraRepr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", pairStr(opts_.kernel), pairStr(opts_.stride),
                     pairStr(opts_.padding));
}

// ---- Flatten and activations -----------------------------------------------------------------

Flatten::Flatten(int64_t startDim, int64_t endDim) : Module("Flatten"), start_(startDim), end_(endDim) {}

Tensor Flatten::forward(const Tensor& x) {
  if (x.dim() == 0) return x.reshape({1});
  return x.flatten(start_, end_);
}

std::string Flatten::extraRepr() const { return fmt::format("start_dim={}, end_dim={}", start_, end_); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, tanh_); }
std::string GELU::extraRepr() const { return tanh_ ? "approximate='tanh'" : ""; }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

}  // namespace cohort::nn
