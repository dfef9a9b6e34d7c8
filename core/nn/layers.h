/*
 * Basic layers: Linear, Embedding, LayerNorm, Dropout, Conv2d, pooling, Flatten and the
 * activations. Each matches its PyTorch namesake: parameter names ("weight", "bias"), shapes,
 * default initialisation and forward semantics, so state dicts move between the two.
 * Initialisation draws from the given Generator (the default CPU generator when null).
 * A wrong-dimension input is a ValueError naming the layer, what it expected and the shape it got.
 */
#pragma once

#include <cstdint>
#include <utility>

#include <cohort/core/nn/module.h>
#include <cohort/core/ops/functional.h>

namespace cohort::nn {

// y = x W^T + b. weight [out, in] ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in));
// bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t inFeatures, int64_t outFeatures, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;
  // Re-draws the parameters with the default initialisation.
  void resetParameters(Generator* gen = nullptr);

  const Tensor& weight() const { return parameter("weight"); }
  // Undefined when built without bias.
  Tensor bias() const { return hasParameter("bias") ? parameter("bias") : Tensor(); }
  int64_t inFeatures() const { return in_; }
  int64_t outFeatures() const { return out_; }

 private:
  int64_t in_, out_;
};

// Looks up rows of weight [num, dim] ~ N(0, 1) for int64 indices of any shape -> [..., dim].
class Embedding : public Module {
 public:
  Embedding(int64_t numEmbeddings, int64_t embeddingDim, Generator* gen = nullptr);
  // Uses `weight` [num, dim] itself as the parameter (shared, e.g. tied with an output layer).
  explicit Embedding(Tensor weight);
  Tensor forward(const Tensor& indices) override;
  std::string extraRepr() const override;
  const Tensor& weight() const { return parameter("weight"); }
  int64_t numEmbeddings() const { return num_; }
  int64_t embeddingDim() const { return dim_; }

 private:
  int64_t num_, dim_;
};

// Normalises over the trailing dims `normalizedShape`; weight = ones, bias = zeros.
class LayerNorm : public Module {
 public:
  LayerNorm(Shape normalizedShape, double eps = 1e-5, bool elementwiseAffine = true, bool bias = true);
  LayerNorm(int64_t dim, double eps = 1e-5, bool elementwiseAffine = true, bool bias = true)
      : LayerNorm(Shape{dim}, eps, elementwiseAffine, bias) {}
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;
  Tensor weight() const { return hasParameter("weight") ? parameter("weight") : Tensor(); }
  Tensor bias() const { return hasParameter("bias") ? parameter("bias") : Tensor(); }

 private:
  Shape shape_;
  double eps_;
};

// Zeroes elements with probability p and scales the rest by 1/(1-p) in training mode; identity in
// eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

// input [N, Cin, H, W] (or [Cin, H, W]); weight [Cout, Cin/groups, kH, kW] ~ kaiming_uniform(a = sqrt(5));
// bias [Cout] ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = Cin/groups * kH * kW.
class Conv2d : public Module {
 public:
  Conv2d(int64_t inChannels, int64_t outChannels, std::pair<int64_t, int64_t> kernelSize,
         functional::Conv2dOptions opts = {}, bool bias = true, Generator* gen = nullptr);
  Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernelSize, functional::Conv2dOptions opts = {},
         bool bias = true, Generator* gen = nullptr)
      : Conv2d(inChannels, outChannels, {kernelSize, kernelSize}, opts, bias, gen) {}
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;
  void resetParameters(Generator* gen = nullptr);
  const Tensor& weight() const { return parameter("weight"); }
  Tensor bias() const { return hasParameter("bias") ? parameter("bias") : Tensor(); }

 private:
  int64_t in_, out_;
  std::pair<int64_t, int64_t> kernel_;
  functional::Conv2dOptions opts_;
};

// Pooling over [N, C, H, W] (or [C, H, W]); stride defaults to the kernel size.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::pair<int64_t, int64_t> kernel, std::pair<int64_t, int64_t> stride = {0, 0},
                     std::pair<int64_t, int64_t> padding = {0, 0});
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : MaxPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;

 private:
  functional::Pool2dOptions opts_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(std::pair<int64_t, int64_t> kernel, std::pair<int64_t, int64_t> stride = {0, 0},
                     std::pair<int64_t, int64_t> padding = {0, 0});
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : AvgPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;

 private:
  functional::Pool2dOptions opts_;
};

// Flattens dims [startDim, endDim] (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t startDim = 1, int64_t endDim = -1);
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;

 private:
  int64_t start_, end_;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

// Exact (erf) GELU, or the tanh approximation (PyTorch's approximate="tanh").
class GELU : public Module {
 public:
  explicit GELU(bool tanhApproximation = false) : Module("GELU"), tanh_(tanhApproximation) {}
  Tensor forward(const Tensor& input) override;
  std::string extraRepr() const override;

 private:
  bool tanh_;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace cohort::nn
