#include <cohort/core/nn/transformer.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/nn/init.h>

namespace cohort::nn {

// ---- CausalSelfAttention ---------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(int64_t nEmbd, int64_t nHead, int64_t blockSize, double dropout, bool bias,
                                         Generator* gen, bool fused)
    : Module("CausalSelfAttention"), nEmbd_(nEmbd), nHead_(nHead), blockSize_(blockSize), gen_(gen), fused_(fused) {
  if (nHead < 1 || nEmbd < 1 || nEmbd % nHead != 0)
    throw ValueError(
        fmt::format("CausalSelfAttention: n_embd ({}) must be a positive multiple of n_head ({})", nEmbd, nHead));
  if (blockSize < 1)
    throw ValueError(fmt::format("CausalSelfAttention: block size must be positive, got {}", blockSize));
  registerModule("c_attn", Linear(nEmbd, 3 * nEmbd, bias, gen));
  registerModule("c_proj", Linear(nEmbd, nEmbd, bias, gen));
  registerModule("attn_dropout", Dropout(dropout, gen));
  registerModule("resid_dropout", Dropout(dropout, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.dim() != 3 || x.size(2) != nEmbd_ || x.size(1) > blockSize_ || x.size(1) < 1)
    throw ValueError(fmt::format("CausalSelfAttention(n_embd={}, n_head={}, block_size={}): expected input [B, T, {}] "
                                 "with 1 <= T <= {}, got {}",
                                 nEmbd_, nHead_, blockSize_, nEmbd_, blockSize_, shapeStr(x.sizes())));
  const int64_t B = x.size(0), T = x.size(1), C = nEmbd_, hs = C / nHead_;
  Tensor qkv = (*child("c_attn"))(x);  // [B, T, 3C]
  std::vector<Tensor> parts = qkv.split(C, 2);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, nHead_, hs}).transpose(1, 2); };  // [B, nh, T, hs]
  Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  // Fused attention (core/ops/attention.cc): reads the head views in place and never holds the
  // [T, T] weights. attn_dropout's probability applies to the weights inside it, in training mode
  // (the math formula draws the same keep mask).
  auto attnDropout = std::dynamic_pointer_cast<Dropout>(child("attn_dropout"));
  const double p = attnDropout && attnDropout->isTraining() ? attnDropout->p() : 0.0;
  const functional::SdpaOptions opts{.causal = true, .dropout = p, .generator = gen_};
  Tensor y = fused_ ? functional::scaledDotProductAttention(q, k, v, opts)
                    : functional::scaledDotProductAttentionMath(q, k, v, opts);
  y = y.transpose(1, 2).contiguous().view({B, T, C});  // heads side by side again
  return (*child("resid_dropout"))((*child("c_proj"))(y));
}

std::string CausalSelfAttention::extraRepr() const {
  return fmt::format("n_embd={}, n_head={}, block_size={}{}", nEmbd_, nHead_, blockSize_,
                     fused_ ? "" : ", fused=false");
}

// ---- MLP and block ---------------------------------------------------------------------------

MLP::MLP(int64_t nEmbd, double dropout, bool bias, Generator* gen) : Module("MLP") {
  registerModule("c_fc", Linear(nEmbd, 4 * nEmbd, bias, gen));
  registerModule("gelu", GELU());
  registerModule("c_proj", Linear(4 * nEmbd, nEmbd, bias, gen));
  registerModule("dropout", Dropout(dropout, gen));
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = (*child("c_fc"))(x);
  h = (*child("gelu"))(h);
  h = (*child("c_proj"))(h);
  return (*child("dropout"))(h);
}

TransformerBlock::TransformerBlock(int64_t nEmbd, int64_t nHead, int64_t blockSize, double dropout, bool bias,
                                   Generator* gen, bool fusedAttention)
    : Module("TransformerBlock") {
  registerModule("ln_1", LayerNorm(nEmbd, 1e-5, true, bias));
  registerModule("attn", CausalSelfAttention(nEmbd, nHead, blockSize, dropout, bias, gen, fusedAttention));
  registerModule("ln_2", LayerNorm(nEmbd, 1e-5, true, bias));
  registerModule("mlp", MLP(nEmbd, dropout, bias, gen));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = x + (*child("attn"))((*child("ln_1"))(x));
  return h + (*child("mlp"))((*child("ln_2"))(h));
}

// ---- GPT -------------------------------------------------------------------------------------

GPT::GPT(GPTConfig config, Generator* gen) : Module("GPT"), config_(config) {
  const GPTConfig& c = config_;
  if (c.vocabSize < 1 || c.blockSize < 1 || c.nLayer < 0)
    throw ValueError(fmt::format("GPT: vocab size ({}), block size ({}) must be positive and n_layer ({}) >= 0",
                                 c.vocabSize, c.blockSize, c.nLayer));
  auto lmHead = std::make_shared<Linear>(c.nEmbd, c.vocabSize, /*bias=*/false, gen);
  auto transformer = registerModule("transformer", ModuleDict());
  if (c.tieWeights) transformer->insert("wte", Embedding(lmHead->weight()));
  else transformer->insert("wte", Embedding(c.vocabSize, c.nEmbd, gen));
  transformer->insert("wpe", Embedding(c.blockSize, c.nEmbd, gen));
  transformer->insert("drop", Dropout(c.dropout, gen));
  auto h = transformer->insert("h", ModuleList());
  for (int64_t i = 0; i < c.nLayer; ++i)
    h->push_back(TransformerBlock(c.nEmbd, c.nHead, c.blockSize, c.dropout, c.bias, gen, c.fusedAttention));
  transformer->insert("ln_f", LayerNorm(c.nEmbd, 1e-5, true, c.bias));
  registerModule("lm_head", lmHead);

  // nanoGPT's _init_weights, applied children-first like torch's Module.apply.
  apply([gen](Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) {
      Tensor w = lin->weight();
      init::normal_(w, 0.0, 0.02, gen);
      if (Tensor b = lin->bias(); b.defined()) init::zeros_(b);
    } else if (auto* emb = dynamic_cast<Embedding*>(&m)) {
      Tensor w = emb->weight();
      init::normal_(w, 0.0, 0.02, gen);
    }
  });
  const double projStd = 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.nLayer, 1)));
  for (auto& [name, p] : namedParameters()) {
    const std::string suffix = "c_proj.weight";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      init::normal_(p, 0.0, projStd, gen);
  }
}

Tensor GPT::forward(const Tensor& idx) {
  if (idx.dim() != 2 || !isIntegral(idx.dtype()) || idx.size(1) < 1 || idx.size(1) > config_.blockSize)
    throw ValueError(fmt::format("GPT(block_size={}): expected integer token ids [B, T] with 1 <= T <= {}, got {} {}",
                                 config_.blockSize, config_.blockSize, idx.dtype(), shapeStr(idx.sizes())));
  const int64_t T = idx.size(1);
  auto transformer = std::dynamic_pointer_cast<ModuleDict>(child("transformer"));
  if (!transformer) throw ValueError("GPT: child 'transformer' is not a ModuleDict");
  Tensor pos = arange(0, T, 1, {.dtype = DType::Int64, .device = idx.device()});
  Tensor tok = (*(*transformer)["wte"])(idx);  // [B, T, C]
  Tensor pe = (*(*transformer)["wpe"])(pos);   // [T, C]
  Tensor x = (*(*transformer)["drop"])(tok + pe);
  for (const auto& [n, block] : (*transformer)["h"]->namedChildren()) x = (*block)(x);
  x = (*(*transformer)["ln_f"])(x);
  return (*child("lm_head"))(x);
}

Tensor GPT::generate(const Tensor& idx, int64_t maxNewTokens, double temperature, int64_t topK, Generator* gen) {
  if (idx.dim() != 2 || !isIntegral(idx.dtype()) || idx.size(1) < 1)
    throw ValueError(fmt::format("GPT.generate: expected integer token ids [B, T] with T >= 1, got {} {}", idx.dtype(),
                                 shapeStr(idx.sizes())));
  if (maxNewTokens < 0) throw ValueError(fmt::format("GPT.generate: maxNewTokens must be >= 0, got {}", maxNewTokens));
  autograd::NoGradGuard ng;
  const int64_t B = idx.size(0), V = config_.vocabSize;
  Tensor out = idx.to(DType::Int64).contiguous();
  std::vector<double> probs(static_cast<size_t>(V));
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t step = 0; step < maxNewTokens; ++step) {
    const int64_t T = out.size(1);
    Tensor ctx = T > config_.blockSize ? out.slice(1, T - config_.blockSize, T) : out;
    Tensor logits = forward(ctx);
    // [B, V] on the host, where the sampling runs (one small copy per token from a device).
    Tensor last = logits.select(1, logits.size(1) - 1).to(DType::Float32).to(Device::cpu()).contiguous();
    const float* l = last.data<float>();
    Tensor u = rand({B}, {.dtype = DType::Float64}, gen);
    const double* ud = u.data<double>();
    std::vector<int64_t> next(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const float* row = l + b * V;
      if (temperature <= 0.0) {
        next[static_cast<size_t>(b)] = std::max_element(row, row + V) - row;
        continue;
      }
      // Keep the top k logits (ties at the k-th value are kept, as torch's `< v[-1]` test does).
      double cutoff = -std::numeric_limits<double>::infinity();
      if (topK > 0 && topK < V) {
        std::iota(order.begin(), order.end(), int64_t{0});
        std::nth_element(order.begin(), order.begin() + (topK - 1), order.end(),
                         [&](int64_t a, int64_t c) { return row[a] > row[c]; });
        cutoff = row[order[static_cast<size_t>(topK - 1)]];
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t v = 0; v < V; ++v)
        if (row[v] >= cutoff) mx = std::max(mx, static_cast<double>(row[v]) / temperature);
      double total = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        double p = row[v] >= cutoff ? std::exp(static_cast<double>(row[v]) / temperature - mx) : 0.0;
        probs[static_cast<size_t>(v)] = p;
        total += p;
      }
      // Inverse-CDF sampling; falls back to the last kept token against rounding at the top end.
      double target = ud[b] * total, acc = 0.0;
      int64_t pick = -1, lastKept = 0;
      for (int64_t v = 0; v < V; ++v) {
        if (probs[static_cast<size_t>(v)] <= 0.0) continue;
        lastKept = v;
        acc += probs[static_cast<size_t>(v)];
        if (acc > target) {
          pick = v;
          break;
        }
      }
      next[static_cast<size_t>(b)] = pick >= 0 ? pick : lastKept;
    }
    out = cat({out, fromVector<int64_t>(next, {B, 1}).to(out.device())}, 1);
  }
  return out;
}

}  // namespace cohort::nn
