/*
 * A GPT-2 style decoder, laid out as Karpathy's nanoGPT (model.py) so state dicts carry the same
 * names and a PyTorch nanoGPT loads cohort's weights directly:
 *   transformer.wte.weight, transformer.wpe.weight,
 *   transformer.h.<i>.ln_1.{weight,bias}, transformer.h.<i>.attn.c_attn.{weight,bias},
 *   transformer.h.<i>.attn.c_proj.*, transformer.h.<i>.ln_2.*, transformer.h.<i>.mlp.c_fc.*,
 *   transformer.h.<i>.mlp.c_proj.*, transformer.ln_f.*, lm_head.weight
 * With weight tying, transformer.wte.weight and lm_head.weight are one tensor: it is listed once
 * (as transformer.wte.weight) by namedParameters and under both names by stateDict.
 * Attention runs on the fused functional::scaledDotProductAttention with causal=true (no mask
 * buffer: memory stays linear in the sequence length), or op by op when the config says so.
 * Every module calls its children through the registry (Module::child), so wrappers that replace
 * a block or hook its forward (FSDP units are usually one TransformerBlock) take effect.
 */
#pragma once

#include <cstdint>

#include <cohort/core/nn/container.h>
#include <cohort/core/nn/layers.h>

namespace cohort::nn {

// Multi-head self-attention where position t sees positions <= t.
// x [B, T, C] -> [B, T, C]; T <= blockSize; C = nEmbd divisible by nHead.
// fused = false computes the attention with functional::scaledDotProductAttentionMath (op by op,
// the [T, T] weights held) instead of the fused op: slower, and under autocast the scores and
// weights round to the lower precision, as in nanoGPT's non-flash path on PyTorch 1.13.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t nEmbd, int64_t nHead, int64_t blockSize, double dropout = 0.0, bool bias = true,
                      Generator* gen = nullptr, bool fused = true);
  Tensor forward(const Tensor& x) override;
  std::string extraRepr() const override;
  std::shared_ptr<Linear> qkv() const { return std::dynamic_pointer_cast<Linear>(child("c_attn")); }
  std::shared_ptr<Linear> proj() const { return std::dynamic_pointer_cast<Linear>(child("c_proj")); }

 private:
  int64_t nEmbd_, nHead_, blockSize_;
  Generator* gen_;  // attention dropout draws from it
  bool fused_;
};

// Linear(C, 4C) -> GELU -> Linear(4C, C) -> Dropout.
class MLP : public Module {
 public:
  MLP(int64_t nEmbd, double dropout = 0.0, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
};

// Pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t nEmbd, int64_t nHead, int64_t blockSize, double dropout = 0.0, bool bias = true,
                   Generator* gen = nullptr, bool fusedAttention = true);
  Tensor forward(const Tensor& x) override;
};

struct GPTConfig {
  int64_t vocabSize = 50304;
  int64_t blockSize = 1024;
  int64_t nLayer = 12;
  int64_t nHead = 12;
  int64_t nEmbd = 768;
  double dropout = 0.0;
  bool bias = true;        // biases in Linear and LayerNorm layers
  bool tieWeights = true;  // lm_head.weight is transformer.wte.weight
  // false: every block's attention runs op by op (see CausalSelfAttention), to reproduce the
  // rounding of a model written without fused attention under autocast. Same weights and names.
  bool fusedAttention = true;
};

class GPT : public Module {
 public:
  // Initialised as nanoGPT: Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorm 1/0,
  // and every c_proj.weight ~ N(0, 0.02 / sqrt(2 * nLayer)). Draws from `gen` (default generator
  // when null).
  explicit GPT(GPTConfig config, Generator* gen = nullptr);
  // idx: int64 token ids [B, T] with T <= blockSize -> logits [B, T, vocabSize].
  Tensor forward(const Tensor& idx) override;
  // Appends maxNewTokens sampled tokens to idx [B, T] (cropping the context to blockSize), without
  // recording autograd. temperature <= 0 takes the most likely token; topK > 0 keeps only the k
  // most likely tokens. Sampling draws from `gen` (default generator when null). Call eval()
  // first when the model has dropout.
  Tensor generate(const Tensor& idx, int64_t maxNewTokens, double temperature = 1.0, int64_t topK = 0,
                  Generator* gen = nullptr);
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
};

}  // namespace cohort::nn
