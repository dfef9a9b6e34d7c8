/*
 * Attention modules with PyTorch 1.13's semantics and parameter names, so state dicts move
 * between the two:
 *   MultiheadAttention        in_proj_weight [3E, E] (or q_proj_weight, k_proj_weight,
 *                             v_proj_weight when kdim/vdim differ from E), in_proj_bias [3E],
 *                             bias_k, bias_v [1, 1, E] (addBiasKv), out_proj.{weight,bias}
 *   TransformerEncoderLayer   self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*
 *   TransformerEncoder        layers.<i>.*, norm.* (when given a final norm)
 * Attention without weights runs on the fused functional::scaledDotProductAttention (memory linear
 * in the sequence length); asking for the weights computes them unfused, as PyTorch does.
 * Masks follow PyTorch's module conventions, which are the opposite of scaledDotProductAttention's
 * bool masks: here a bool true means "may not attend" (float masks are added in both).
 * Dropout (on the attention weights, and in the encoder layer's residual branches) draws from the
 * generator given in the options (the default generator when null); it differs from PyTorch's
 * random stream, not in distribution. Initialisation draws from the same generator.
 * Differences from PyTorch 1.13: no fast path, so in eval mode with a key padding mask the
 * encoder's outputs at padded positions are computed as in training (PyTorch's nested-tensor path
 * gives zeros there); a float key padding mask is added to a float attention mask (PyTorch 1.13
 * rejects that combination).
 */
#pragma once

#include <cstdint>
#include <optional>

#include <cohort/core/nn/container.h>
#include <cohort/core/nn/layers.h>

namespace cohort::nn {

struct MultiheadAttentionOptions {
  double dropout = 0.0;  // on the attention weights, in training mode
  bool bias = true;      // in_proj_bias and out_proj.bias
  bool addBiasKv = false;
  bool addZeroAttn = false;
  std::optional<int64_t> kdim{};  // key features (default embedDim)
  std::optional<int64_t> vdim{};  // value features (default embedDim)
  bool batchFirst = false;        // inputs [N, L, E] instead of [L, N, E]
  Generator* generator = nullptr;
};

struct MultiheadAttentionForwardOptions {
  // [N, S] (or [S] for unbatched inputs): bool true = ignore that key, or floating-point (added).
  Tensor keyPaddingMask{};
  bool needWeights = true;
  // [L, S] or [N * numHeads, L, S]: bool true = query may not attend to that key, or floating-point
  // (added); uint8 counts as bool.
  Tensor attnMask{};
  bool averageAttnWeights = true;  // weights [N, L, S] averaged over heads, else [N, numHeads, L, S]
};

struct MultiheadAttentionOutput {
  Tensor output;   // [L, N, E] ([N, L, E] batchFirst, [L, E] unbatched)
  Tensor weights;  // undefined unless needWeights (after dropout in training mode, as PyTorch 1.13)
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embedDim, int64_t numHeads, const MultiheadAttentionOptions& opts = {});
  // query [L, N, E], key [S, N, kdim], value [S, N, vdim] (batch first: [N, L, E] ...), or
  // unbatched [L, E], [S, kdim], [S, vdim].
  MultiheadAttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const MultiheadAttentionForwardOptions& opts = {});
  // Self-attention forward(x, x, x) without weights.
  Tensor forward(const Tensor& x) override;
  // {query, key, value[, keyPaddingMask[, attnMask]]} (undefined = none) -> {output, weights}
  // with PyTorch's defaults (weights averaged over heads).
  TensorList forwardMulti(const TensorList& inputs) override;
  // Re-draws the parameters as PyTorch's _reset_parameters (xavier_uniform_ projections, zero
  // biases, xavier_normal_ bias_k/bias_v; out_proj.weight keeps Linear's initialisation).
  void resetParameters(Generator* gen = nullptr);
  std::string extraRepr() const override;

  int64_t embedDim() const { return embedDim_; }
  int64_t numHeads() const { return numHeads_; }
  const MultiheadAttentionOptions& options() const { return opts_; }

 private:
  int64_t embedDim_, numHeads_, kdim_, vdim_;
  bool sameEmbedDim_;
  MultiheadAttentionOptions opts_;
};

enum class TransformerActivation { Relu, Gelu };

struct TransformerEncoderLayerOptions {
  int64_t dimFeedforward = 2048;
  double dropout = 0.1;
  TransformerActivation activation = TransformerActivation::Relu;
  double layerNormEps = 1e-5;
  bool batchFirst = false;
  bool normFirst = false;  // pre-LayerNorm (x + sa(norm1(x))) instead of post (norm1(x + sa(x)))
  Generator* generator = nullptr;
};

// Self-attention and a feed-forward block (linear1 -> activation -> dropout -> linear2), each
// with dropout on its output and a residual connection and LayerNorm around it.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t dModel, int64_t nhead, const TransformerEncoderLayerOptions& opts = {});
  // src [S, N, E] ([N, S, E] batchFirst, [S, E] unbatched); srcMask and srcKeyPaddingMask as
  // MultiheadAttention's attnMask and keyPaddingMask (undefined = none). Runs the hooks.
  Tensor forward(const Tensor& src, const Tensor& srcMask, const Tensor& srcKeyPaddingMask = Tensor());
  Tensor forward(const Tensor& src) override;
  TensorList forwardMulti(const TensorList& inputs) override;  // {src[, srcMask[, srcKeyPaddingMask]]}
  std::string extraRepr() const override;

  int64_t dModel() const { return dModel_; }
  int64_t nhead() const { return nhead_; }
  const TransformerEncoderLayerOptions& options() const { return opts_; }

 private:
  Tensor compute(const Tensor& src, const Tensor& srcMask, const Tensor& srcKeyPaddingMask);
  int64_t dModel_, nhead_;
  TransformerEncoderLayerOptions opts_;
};

// numLayers copies of `layer` ("layers.0" ...), each starting from `layer`'s weights as PyTorch's
// deep copies do, then `norm` ("norm") when given.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerEncoderLayer& layer, int64_t numLayers, ModulePtr norm = nullptr);
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& srcKeyPaddingMask = Tensor());
  Tensor forward(const Tensor& src) override;
  TensorList forwardMulti(const TensorList& inputs) override;  // {src[, mask[, srcKeyPaddingMask]]}
  std::shared_ptr<ModuleList> layers() const { return std::dynamic_pointer_cast<ModuleList>(child("layers")); }

 private:
  Tensor compute(const Tensor& src, const Tensor& mask, const Tensor& srcKeyPaddingMask);
};

}  // namespace cohort::nn
