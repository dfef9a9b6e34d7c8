#include <cohort/core/nn/attention.h>

#include <cmath>
#include <limits>

#include <cohort/core/nn/init.h>

namespace cohort::nn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A module mask as an additive floating-point mask in `dtype`: bool (or uint8) true -> -inf.
Tensor additiveMask(const Tensor& m, DType dtype, const std::string& who, const char* what) {
  if (m.dtype() == DType::Bool || m.dtype() == DType::UInt8) {
    Tensor b = m.dtype() == DType::Bool ? m : m.ne(zeros({}, {.dtype = DType::UInt8, .device = m.device()}));
    return zeros(m.sizes(), {.dtype = dtype, .device = m.device()}).maskedFill(b, -kInf);
  }
  if (!isFloating(m.dtype()))
    throw ValueError(fmt::format("{}: {} must be bool or floating-point, got {} of shape {}", who, what, m.dtype(),
                                 shapeStr(m.sizes())));
  return m.to(dtype);
}

// Appends a zero (attend) column to the last dim of an additive mask.
Tensor padKeyColumn(const Tensor& m) {
  Shape s = m.sizes();
  s.back() = 1;
  return cat({m, zeros(s, {.dtype = m.dtype(), .device = m.device()})}, -1);
}

}  // namespace

// ---- MultiheadAttention -----------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t embedDim, int64_t numHeads, const MultiheadAttentionOptions& opts)
    : Module("MultiheadAttention"), embedDim_(embedDim), numHeads_(numHeads), kdim_(opts.kdim.value_or(embedDim)),
      vdim_(opts.vdim.value_or(embedDim)), sameEmbedDim_(kdim_ == embedDim && vdim_ == embedDim), opts_(opts) {
  if (embedDim < 1 || numHeads < 1 || embedDim % numHeads != 0)
    throw ValueError(fmt::format("MultiheadAttention: embed_dim ({}) must be a positive multiple of num_heads ({})",
                                 embedDim, numHeads));
  if (kdim_ < 1 || vdim_ < 1)
    throw ValueError(fmt::format("MultiheadAttention: kdim ({}) and vdim ({}) must be positive", kdim_, vdim_));
  if (!(opts.dropout >= 0.0 && opts.dropout < 1.0))
    throw ValueError(fmt::format("MultiheadAttention: dropout must be in [0, 1), got {}", opts.dropout));
  if (sameEmbedDim_) {
    registerParameter("in_proj_weight", empty({3 * embedDim, embedDim}));
  } else {
    registerParameter("q_proj_weight", empty({embedDim, embedDim}));
    registerParameter("k_proj_weight", empty({embedDim, kdim_}));
    registerParameter("v_proj_weight", empty({embedDim, vdim_}));
  }
  if (opts.bias) registerParameter("in_proj_bias", empty({3 * embedDim}));
  if (opts.addBiasKv) {
    registerParameter("bias_k", empty({1, 1, embedDim}));
    registerParameter("bias_v", empty({1, 1, embedDim}));
  }
  registerModule("out_proj", Linear(embedDim, embedDim, opts.bias, opts.generator));
  resetParameters(opts.generator);
}

void MultiheadAttention::resetParameters(Generator* gen) {
  for (const char* n : {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"})
    if (hasParameter(n)) {
      Tensor w = parameter(n);
      init::xavierUniform_(w, 1.0, gen);
    }
  if (hasParameter("in_proj_bias")) {
    Tensor b = parameter("in_proj_bias");
    init::zeros_(b);
    if (Tensor ob = std::dynamic_pointer_cast<Linear>(child("out_proj"))->bias(); ob.defined()) init::zeros_(ob);
  }
  for (const char* n : {"bias_k", "bias_v"})
    if (hasParameter(n)) {
      Tensor b = parameter(n);
      init::xavierNormal_(b, 1.0, gen);
    }
}

std::string MultiheadAttention::extraRepr() const {
  std::string s = fmt::format("embed_dim={}, num_heads={}, dropout={}, batch_first={}", embedDim_, numHeads_,
                              opts_.dropout, opts_.batchFirst);
  if (!sameEmbedDim_) s += fmt::format(", kdim={}, vdim={}", kdim_, vdim_);
  return s;
}

MultiheadAttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                     const MultiheadAttentionForwardOptions& fo) {
  const std::string who = fmt::format("MultiheadAttention(embed_dim={}, num_heads={})", embedDim_, numHeads_);
  if (!query.defined() || !key.defined() || !value.defined())
    throw ValueError(fmt::format("{}: query, key and value must be defined", who));
  const bool batched = query.dim() == 3;
  const bool bf = batched && opts_.batchFirst;
  const std::string layout = bf ? "[N, L, E]" : "[L, N, E]";
  if ((query.dim() != 2 && query.dim() != 3) || key.dim() != query.dim() || value.dim() != query.dim())
    throw ValueError(fmt::format("{}: expected query, key and value all {} or all unbatched [L, E], got {}, {} and {}",
                                 who, layout, shapeStr(query.sizes()), shapeStr(key.sizes()), shapeStr(value.sizes())));
  // From here on the inputs are batched: unbatched ones become [L, 1, E].
  Tensor q = batched ? query : query.unsqueeze(1);
  Tensor k = batched ? key : key.unsqueeze(1);
  Tensor v = batched ? value : value.unsqueeze(1);
  const int64_t seqDim = bf ? 1 : 0, batchDim = bf ? 0 : 1;
  const int64_t E = embedDim_, H = numHeads_, hd = E / H;
  const int64_t N = q.size(batchDim), L = q.size(seqDim), S = k.size(seqDim);
  if (q.size(2) != E || k.size(2) != kdim_ || v.size(2) != vdim_)
    throw ValueError(fmt::format("{}: expected feature sizes query {}, key {}, value {}, got {}, {} and {}", who, E,
                                 kdim_, vdim_, shapeStr(query.sizes()), shapeStr(key.sizes()),
                                 shapeStr(value.sizes())));
  if (k.size(batchDim) != N || v.size(batchDim) != N || v.size(seqDim) != S)
    throw ValueError(fmt::format("{}: query, key and value must share the batch size and key and value the sequence "
                                 "length ({}), got {}, {} and {}",
                                 who, layout, shapeStr(query.sizes()), shapeStr(key.sizes()), shapeStr(value.sizes())));

  // Input projections.
  const Tensor bias = hasParameter("in_proj_bias") ? parameter("in_proj_bias") : Tensor();
  auto biasPart = [&](int64_t i) { return bias.defined() ? bias.slice(0, i * E, (i + 1) * E) : Tensor(); };
  Tensor qp, kp, vp;
  if (sameEmbedDim_) {
    const Tensor& w = parameter("in_proj_weight");
    if (query.isSameAs(key) && key.isSameAs(value)) {
      std::vector<Tensor> parts = linear(q, w, bias).split(E, -1);
      qp = parts[0];
      kp = parts[1];
      vp = parts[2];
    } else {
      qp = linear(q, w.slice(0, 0, E), biasPart(0));
      kp = linear(k, w.slice(0, E, 2 * E), biasPart(1));
      vp = linear(v, w.slice(0, 2 * E, 3 * E), biasPart(2));
    }
  } else {
    qp = linear(q, parameter("q_proj_weight"), biasPart(0));
    kp = linear(k, parameter("k_proj_weight"), biasPart(1));
    vp = linear(v, parameter("v_proj_weight"), biasPart(2));
  }
  int64_t keys = S;
  if (hasParameter("bias_k")) {
    const Shape one = bf ? Shape{N, 1, E} : Shape{1, N, E};
    kp = cat({kp, parameter("bias_k").expand(one)}, seqDim);
    vp = cat({vp, parameter("bias_v").expand(one)}, seqDim);
    ++keys;
  }
  // [.., .., E] -> [N, H, T, hd] views (no copy: the fused op reads strided heads).
  auto heads = [&](const Tensor& t, int64_t len) {
    return bf ? t.reshape({N, len, H, hd}).transpose(1, 2) : t.reshape({len, N, H, hd}).permute({1, 2, 0, 3});
  };
  Tensor qh = heads(qp, L), kh = heads(kp, keys), vh = heads(vp, keys);
  if (opts_.addZeroAttn) {
    const Tensor z = zeros({N, H, 1, hd}, {.dtype = kh.dtype(), .device = kh.device()});
    kh = cat({kh, z}, 2);
    vh = cat({vh, z}, 2);
    ++keys;
  }

  // One additive mask broadcastable to [N, H, L, keys].
  Tensor mask;
  const int64_t padCols = keys - S;
  if (const Tensor& am = fo.attnMask; am.defined()) {
    Tensor m = additiveMask(am, qh.dtype(), who, "attnMask");
    if (am.dim() == 2 && am.size(0) == L && am.size(1) == S) {
      // [L, S] as it is
    } else if (am.dim() == 3 && am.size(0) == N * H && am.size(1) == L && am.size(2) == S) {
      m = m.view({N, H, L, S});
    } else {
      throw ValueError(fmt::format("{}: attnMask must be [L, S] = [{}, {}] or [N * num_heads, L, S] = [{}, {}, {}], "
                                   "got {}",
                                   who, L, S, N * H, L, S, shapeStr(am.sizes())));
    }
    for (int64_t i = 0; i < padCols; ++i) m = padKeyColumn(m);
    mask = m;
  }
  if (const Tensor& kpm = fo.keyPaddingMask; kpm.defined()) {
    const bool ok =
        batched ? (kpm.dim() == 2 && kpm.size(0) == N && kpm.size(1) == S) : (kpm.dim() == 1 && kpm.size(0) == S);
    if (!ok)
      throw ValueError(fmt::format("{}: keyPaddingMask must be {}, got {}", who,
                                   batched ? fmt::format("[N, S] = [{}, {}]", N, S) : fmt::format("[S] = [{}]", S),
                                   shapeStr(kpm.sizes())));
    Tensor m = additiveMask(kpm, qh.dtype(), who, "keyPaddingMask").reshape({N, 1, 1, S});
    for (int64_t i = 0; i < padCols; ++i) m = padKeyColumn(m);
    mask = mask.defined() ? mask + m : m;
  }

  const double p = isTraining() ? opts_.dropout : 0.0;
  Tensor out, weights;
  if (fo.needWeights) {
    // The weights are an output: compute them whole, as PyTorch does.
    Tensor att = matmul(qh, kh.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    if (mask.defined()) att = att + mask;
    att = functional::softmax(att, -1);
    if (p > 0.0) att = functional::dropout(att, p, true, opts_.generator);
    out = matmul(att, vh);
    weights = fo.averageAttnWeights ? mean(att, {1}) : att;
    if (!batched) weights = weights.squeeze(0);
  } else {
    out = functional::scaledDotProductAttention(qh, kh, vh, {.mask = mask, .dropout = p, .generator = opts_.generator});
  }
  // [N, H, L, hd] -> the input layout, heads side by side.
  out = bf ? out.transpose(1, 2).reshape({N, L, E}) : out.permute({2, 0, 1, 3}).reshape({L, N, E});
  out = (*child("out_proj"))(out);
  if (!batched) out = out.squeeze(1);
  return {out, weights};
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x, {.needWeights = false}).output; }

TensorList MultiheadAttention::forwardMulti(const TensorList& inputs) {
  if (inputs.size() < 3 || inputs.size() > 5)
    throw ValueError(
        fmt::format("MultiheadAttention: takes {{query, key, value[, keyPaddingMask[, attnMask]]}}, got {} tensors",
                    inputs.size()));
  MultiheadAttentionForwardOptions fo;
  if (inputs.size() > 3) fo.keyPaddingMask = inputs[3];
  if (inputs.size() > 4) fo.attnMask = inputs[4];
  MultiheadAttentionOutput r = forward(inputs[0], inputs[1], inputs[2], fo);
  return {r.output, r.weights};
}

// ---- TransformerEncoderLayer --------------------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(int64_t dModel, int64_t nhead,
                                                 const TransformerEncoderLayerOptions& opts)
    : Module("TransformerEncoderLayer"), dModel_(dModel), nhead_(nhead), opts_(opts) {
  if (opts.dimFeedforward < 1)
    throw ValueError(
        fmt::format("TransformerEncoderLayer: dimFeedforward must be positive, got {}", opts.dimFeedforward));
  Generator* gen = opts.generator;
  registerModule("self_attn",
                 MultiheadAttention(dModel, nhead,
                                    {.dropout = opts.dropout, .batchFirst = opts.batchFirst, .generator = gen}));
  registerModule("linear1", Linear(dModel, opts.dimFeedforward, true, gen));
  registerModule("dropout", Dropout(opts.dropout, gen));
  registerModule("linear2", Linear(opts.dimFeedforward, dModel, true, gen));
  registerModule("norm1", LayerNorm(dModel, opts.layerNormEps));
  registerModule("norm2", LayerNorm(dModel, opts.layerNormEps));
  registerModule("dropout1", Dropout(opts.dropout, gen));
  registerModule("dropout2", Dropout(opts.dropout, gen));
}

Tensor TransformerEncoderLayer::compute(const Tensor& src, const Tensor& srcMask, const Tensor& srcKeyPaddingMask) {
  if (!src.defined() || (src.dim() != 2 && src.dim() != 3) || src.size(-1) != dModel_)
    throw ValueError(fmt::format("TransformerEncoderLayer(d_model={}, nhead={}): expected src {} or unbatched [S, {}], "
                                 "got {}",
                                 dModel_, nhead_, opts_.batchFirst ? "[N, S, E]" : "[S, N, E]", dModel_,
                                 src.defined() ? shapeStr(src.sizes()) : "undefined"));
  auto attn = std::dynamic_pointer_cast<MultiheadAttention>(child("self_attn"));
  if (!attn) throw ValueError("TransformerEncoderLayer: child 'self_attn' is not a MultiheadAttention");
  auto selfAttention = [&](const Tensor& x) {
    Tensor a =
        attn->forward(x, x, x, {.keyPaddingMask = srcKeyPaddingMask, .needWeights = false, .attnMask = srcMask}).output;
    return (*child("dropout1"))(a);
  };
  auto feedForward = [&](const Tensor& x) {
    Tensor h = (*child("linear1"))(x);
    h = opts_.activation == TransformerActivation::Gelu ? gelu(h) : relu(h);
    h = (*child("linear2"))((*child("dropout"))(h));
    return (*child("dropout2"))(h);
  };
  Tensor x = src;
  if (opts_.normFirst) {
    x = x + selfAttention((*child("norm1"))(x));
    x = x + feedForward((*child("norm2"))(x));
  } else {
    x = (*child("norm1"))(x + selfAttention(x));
    x = (*child("norm2"))(x + feedForward(x));
  }
  return x;
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& srcMask, const Tensor& srcKeyPaddingMask) {
  return call({src, srcMask, srcKeyPaddingMask})[0];
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return compute(src, Tensor(), Tensor()); }

TensorList TransformerEncoderLayer::forwardMulti(const TensorList& inputs) {
  if (inputs.empty() || inputs.size() > 3)
    throw ValueError(
        fmt::format("TransformerEncoderLayer: takes {{src[, srcMask[, srcKeyPaddingMask]]}}, got {} tensors",
                    inputs.size()));
  return {compute(inputs[0], inputs.size() > 1 ? inputs[1] : Tensor(), inputs.size() > 2 ? inputs[2] : Tensor())};
}

std::string TransformerEncoderLayer::extraRepr() const {
  return fmt::format("d_model={}, nhead={}, dim_feedforward={}, dropout={}, activation={}, norm_first={}, "
                     "batch_first={}",
                     dModel_, nhead_, opts_.dimFeedforward, opts_.dropout,
                     opts_.activation == TransformerActivation::Gelu ? "gelu" : "relu", opts_.normFirst,
                     opts_.batchFirst);
}

// ---- TransformerEncoder -------------------------------------------------------------------------

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t numLayers, ModulePtr norm)
    : Module("TransformerEncoder") {
  if (numLayers < 0) throw ValueError(fmt::format("TransformerEncoder: numLayers must be >= 0, got {}", numLayers));
  auto list = registerModule("layers", ModuleList());
  const StateDict weights = layer.stateDict();
  for (int64_t i = 0; i < numLayers; ++i) {
    auto copy = std::make_shared<TransformerEncoderLayer>(layer.dModel(), layer.nhead(), layer.options());
    copy->loadStateDict(weights);
    copy->train(layer.isTraining());
    list->push_back(copy);
  }
  if (norm) registerModule("norm", std::move(norm));
}

Tensor TransformerEncoder::compute(const Tensor& src, const Tensor& mask, const Tensor& srcKeyPaddingMask) {
  Tensor x = src;
  const bool masked = mask.defined() || srcKeyPaddingMask.defined();
  for (const auto& [n, l] : child("layers")->namedChildren())
    x = masked ? l->call({x, mask, srcKeyPaddingMask})[0] : (*l)(x);
  if (hasChild("norm")) x = (*child("norm"))(x);
  return x;
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask, const Tensor& srcKeyPaddingMask) {
  return call({src, mask, srcKeyPaddingMask})[0];
}

Tensor TransformerEncoder::forward(const Tensor& src) { return compute(src, Tensor(), Tensor()); }

TensorList TransformerEncoder::forwardMulti(const TensorList& inputs) {
  if (inputs.empty() || inputs.size() > 3)
    throw ValueError(
        fmt::format("TransformerEncoder: takes {{src[, mask[, srcKeyPaddingMask]]}}, got {} tensors", inputs.size()));
  return {compute(inputs[0], inputs.size() > 1 ? inputs[1] : Tensor(), inputs.size() > 2 ? inputs[2] : Tensor())};
}

}  // namespace cohort::nn
