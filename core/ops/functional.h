/*
 * Neural-network functions: the building blocks of nn modules and losses. Differentiable;
 * float16/bfloat16 inputs compute in float32 inside the kernels.
 *   core/ops/nn_ops.cc: softmax .. embedding, dropout;  core/ops/conv.cc: conv2d and pooling.
 */
#pragma once

#include <cohort/core/ops/ops.h>

namespace cohort::nn::functional {

enum class Reduction { None, Mean, Sum };

Tensor softmax(const Tensor& x, int64_t dim);
Tensor logSoftmax(const Tensor& x, int64_t dim);

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignoreIndex = -100;
  double labelSmoothing = 0.0;
};
// input [N, C] (or [N, C, d1...]) logits; target int64 class indices [N] (or [N, d1...]).
// A label outside [0, C) other than ignoreIndex is an IndexError naming the label and C.
Tensor crossEntropy(const Tensor& input, const Tensor& target, CrossEntropyOptions opts = {});
// input: log-probabilities [N, C]; target [N].
Tensor nllLoss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
               int64_t ignoreIndex = -100);
Tensor mseLoss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Normalises over the trailing dims given by normalizedShape; weight/bias optional.
Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight = Tensor(),
                 const Tensor& bias = Tensor(), double eps = 1e-5);
// weight [num, dim]; indices int64 of any shape -> [..., dim]. Out-of-range indices: IndexError.
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Zeroes with probability p and scales by 1/(1-p) when training; identity otherwise.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

struct Conv2dOptions {
  std::pair<int64_t, int64_t> stride{1, 1};
  std::pair<int64_t, int64_t> padding{0, 0};
  std::pair<int64_t, int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// Options are taken by const reference on purpose: GCC 12.2 with AVX-512 (-march=native) miscompiles
// a braced option struct built straight into a by-value argument (SLP vectorizer; a default
// `Conv2dOptions opts = {}` arrived with padding (1, 0)).
// input [N, Cin, H, W]; weight [Cout, Cin/groups, kH, kW]; bias [Cout] optional.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& opts = {});
struct Pool2dOptions {
  std::pair<int64_t, int64_t> kernel{2, 2};
  std::pair<int64_t, int64_t> stride{0, 0};  // 0 = kernel size
  std::pair<int64_t, int64_t> padding{0, 0};
};
Tensor maxPool2d(const Tensor& input, const Pool2dOptions& opts);
Tensor avgPool2d(const Tensor& input, const Pool2dOptions& opts);  // count_include_pad = true, as torch's default

}  // namespace cohort::nn::functional
