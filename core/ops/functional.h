/*
 * Neural-network functions: the building blocks of nn modules and losses. Differentiable;
 * float16/bfloat16 inputs compute in float32 inside the kernels.
 *   core/ops/nn_ops.cc: softmax .. embedding, dropout;  core/ops/conv.cc: conv2d and pooling;
 *   core/ops/attention.cc: scaled-dot-product attention (its CPU kernel: core/ops/attention_cpu.cc).
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

// ---- attention (core/ops/attention.cc) ----------------------------------------------------------
struct SdpaOptions {
  // Bool (true = the query may attend to that key, as PyTorch 2's attn_mask) or floating-point
  // (added to the scaled scores); broadcastable to [..., Tq, Tk]. Undefined: no mask. No gradient
  // flows to it.
  Tensor mask{};
  // Query i attends to keys j <= i (the lower triangle aligned at the top left, as PyTorch's
  // is_causal, also when Tq != Tk). A ValueError together with a mask.
  bool causal = false;
  // Probability, in [0, 1), of dropping each attention weight (the kept ones are scaled by 1/(1-p)).
  double dropout = 0.0;
  // Multiplies q k^T; default 1/sqrt(E).
  std::optional<double> scale{};
  // Dropout draws one value from it per call (the default CPU generator when null).
  Generator* generator = nullptr;
};
// softmax(q k^T * scale + mask) v, with dropout on the attention weights: PyTorch 2's
// F.scaled_dot_product_attention. q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] (batch dims
// broadcast, e.g. [B, H]) -> [..., Tq, Ev] in q's dtype. Float16 computes in float32; bfloat16
// multiplies in bfloat16 with float32 accumulation where the CPU has bf16 GEMM (scores and softmax
// in float32, the weights rounded to bfloat16 for their product with v), else in float32.
// On the CPU the op is fused: it never holds a [Tq, Tk] matrix, keeps only the output and one
// log-sum-exp per query row for backward, and recomputes the weights there tile by tile. With
// two batch dims [B, H] the output is laid out [B, Tq, H, Ev] and returned permuted to
// [B, H, Tq, Ev], so out.transpose(1, 2) is contiguous (the heads side by side again, free). The
// gradients of q, k and v are laid out like q, k and v: side by side for the transposed head views
// of a [B, T, H * E] projection, contiguous for contiguous inputs.
// A query row whose every key is masked out gives NaN (as PyTorch), and so do the gradients it
// reaches. With Tk == 0 the output is zeros. Other devices compute the same formula with
// matmul and softmax (and the same dropout mask).
// Options are taken by const reference (see Conv2dOptions above).
Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts = {});
// The same formula written out op by op, as PyTorch's "math" attention and models written before
// fused attention (nanoGPT's non-flash path) compute it: matmul(q, k^T) * scale, the mask (where
// or +), softmax, the dropout keep mask (the very one scaledDotProductAttention draws from
// opts.generator), matmul with v. It holds the [..., Tq, Tk] weights, so memory is quadratic in
// the sequence length and it is slower; use it to reproduce such a model's rounding. Under
// autocast each of those ops takes its own policy: with bfloat16, the scores and the weights are
// rounded to bfloat16 (as in PyTorch 1.13 under torch.autocast), where the fused op keeps the
// scores and softmax in float32. Same arguments, checks and errors as scaledDotProductAttention.
Tensor scaledDotProductAttentionMath(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts = {});
// The keep mask (bool, attnShape = [..., Tq, Tk]) that scaledDotProductAttention applies when its
// attention weights have that shape and it is called with dropout p and `gen` in its present
// state. Advances `gen` as that call would: with two generators in one state, one gives this
// mask and the other gives the op's result with exactly these weights kept. p in [0, 1).
Tensor scaledDotProductAttentionDropoutMask(const Shape& attnShape, double p, Generator* gen = nullptr);

}  // namespace cohort::nn::functional
