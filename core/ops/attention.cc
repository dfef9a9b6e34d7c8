// Scaled-dot-product attention: the public entry points (scaledDotProductAttention, its math
// formula and its dropout mask), argument checks, autocast and autograd.
//
// On the CPU the op runs the fused kernel of core/ops/attention_cpu.cc (tile by tile with an
// online softmax, memory linear in the sequence lengths; that file says how, and in which
// precision each dtype is multiplied). Other devices run their registered fused kernels (on CUDA:
// core/cuda/attention.cu, 16-bit inputs without mask or dropout) or else the unfused formula with
// the same mask and dropout (scaledDotProductAttentionMath).
//
// Dropout: one 64-bit key is drawn from the Generator per call (detail::SdpaDropout); whether
// weight (b, i, j) is kept is a hash of the key and (b, i, j), so forward and backward regenerate
// the same mask without storing it, and the same generator state gives the same result.
// scaledDotProductAttentionDropoutMask gives the mask itself.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/attention.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/generator.h>

namespace cohort::nn::functional {

using autograd::Ctx;
using GradList = std::vector<Tensor>;
using detail::SdpaDims;
using detail::SdpaDropout;
using detail::sdpaShape;

namespace {

constexpr const char* kOp = "scaledDotProductAttention";

// The whole op on a device that implements it with autograd of its own (registered under kOp);
// checkArgs has run.
using SdpaOpKernel = Tensor(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts,
                            const detail::SdpaDims& d);

// ---- argument checks ----------------------------------------------------------------------------

std::optional<Shape> broadcastOpt(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void requireInput(const Tensor& t, const char* what) {
  if (!t.defined()) throw ValueError(fmt::format("{}: {} is undefined", kOp, what));
  if (!isFloating(t.dtype()))
    throw ValueError(fmt::format("{}: {} must be a floating-point tensor, got {} of shape {}", kOp, what, t.dtype(),
                                 shapeStr(t.sizes())));
  if (t.dim() < 2)
    throw ValueError(fmt::format("{}: {} must have at least 2 dims [..., {}, {}], got shape {}", kOp, what,
                                 what[0] == 'q' ? "Tq" : "Tk", what[0] == 'v' ? "Ev" : "E", shapeStr(t.sizes())));
}

SdpaDims checkArgs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  requireInput(q, "query");
  requireInput(k, "key");
  requireInput(v, "value");
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw ValueError(fmt::format("{}: query, key and value must have one dtype, got {}, {} and {}", kOp, q.dtype(),
                                 k.dtype(), v.dtype()));
  if (q.device() != k.device() || q.device() != v.device())
    throw ValueError(fmt::format("{}: query, key and value must be on one device, got {}, {} and {}", kOp, q.device(),
                                 k.device(), v.device()));
  if (k.size(-1) != q.size(-1))
    throw ValueError(fmt::format("{}: key's last dim ({}) must equal query's ({}); query {}, key {}", kOp, k.size(-1),
                                 q.size(-1), shapeStr(q.sizes()), shapeStr(k.sizes())));
  if (v.size(-2) != k.size(-2))
    throw ValueError(fmt::format("{}: value's sequence length ({}) must equal key's ({}); key {}, value {}", kOp,
                                 v.size(-2), k.size(-2), shapeStr(k.sizes()), shapeStr(v.sizes())));
  auto batchOf = [](const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); };
  std::optional<Shape> batch = broadcastOpt(batchOf(q), batchOf(k));
  if (batch) batch = broadcastOpt(*batch, batchOf(v));
  if (!batch)
    throw ValueError(fmt::format("{}: the batch dims of query {}, key {} and value {} cannot be broadcast together",
                                 kOp, shapeStr(q.sizes()), shapeStr(k.sizes()), shapeStr(v.sizes())));
  if (!(opts.dropout >= 0.0 && opts.dropout < 1.0))
    throw ValueError(fmt::format("{}: dropout must be in [0, 1), got {}", kOp, opts.dropout));
  if (opts.scale && !std::isfinite(*opts.scale))
    throw ValueError(fmt::format("{}: scale must be finite, got {}", kOp, *opts.scale));
  SdpaDims d;
  d.batch = *batch;
  d.nb = shapeNumel(d.batch);
  d.tq = q.size(-2);
  d.tk = k.size(-2);
  d.e = q.size(-1);
  d.ev = v.size(-1);
  if (const Tensor& m = opts.mask; m.defined()) {
    if (opts.causal)
      throw ValueError(fmt::format("{}: mask and causal cannot both be given (causal is a mask of its own); mask {}",
                                   kOp, shapeStr(m.sizes())));
    if (m.dtype() != DType::Bool && !isFloating(m.dtype()))
      throw ValueError(
          fmt::format("{}: mask must be bool (true = attend) or floating-point (added), got {} of shape {}", kOp,
                      m.dtype(), shapeStr(m.sizes())));
    if (m.device() != q.device())
      throw ValueError(fmt::format("{}: mask is on {} but query is on {}", kOp, m.device(), q.device()));
    Shape target = d.batch;
    target.push_back(d.tq);
    target.push_back(d.tk);
    std::optional<Shape> b = broadcastOpt(m.sizes(), target);
    if (!b || *b != target)
      throw ValueError(fmt::format("{}: mask of shape {} cannot be broadcast to the attention shape {}", kOp,
                                   shapeStr(m.sizes()), shapeStr(target)));
  }
  return d;
}

// ---- dropout keep mask ----------------------------------------------------------------------------

uint64_t drawDropoutKey(Generator* gen) {
  Generator& g = gen ? *gen : defaultGenerator();
  const uint64_t c = g.reserve(1);
  const auto w = Generator::philox(g.seed(), c);
  return static_cast<uint64_t>(w[0]) << 32 | w[1];
}

// The fused op on the CPU.
Tensor fusedAttention(const Tensor& q, const Tensor& k, const Tensor& v, const detail::SdpaCpuArgs& args) {
  Tensor out, lse;
  detail::sdpaCpuForward(q, k, v, args, out, lse);
  detail::SdpaCpuArgs saved = args;
  saved.mask = Tensor();  // kept by the graph below, not by the closure
  const bool hasMask = args.mask.defined();
  autograd::record(kOp, {q, k, v, args.mask}, {out}, {q, k, v, args.mask, out, lse},
                   [saved, hasMask](Ctx& ctx, const GradList& g) -> GradList {
                     GradList r(4);
                     const bool want[3] = {ctx.needsInputGrad(0), ctx.needsInputGrad(1), ctx.needsInputGrad(2)};
                     if (!want[0] && !want[1] && !want[2]) return r;
                     detail::SdpaCpuArgs a = saved;
                     if (hasMask) a.mask = ctx.saved(3);
                     Tensor dq, dk, dv;
                     detail::sdpaCpuBackward(ctx.saved(0), ctx.saved(1), ctx.saved(2), a, ctx.saved(4), ctx.saved(5),
                                             g[0], dq, dk, dv);
                     if (want[0]) r[0] = dq;
                     if (want[1]) r[1] = dk;
                     if (want[2]) r[2] = dv;
                     return r;
                   });
  return out;
}

Tensor keepMask(const Shape& attnShape, const SdpaDropout& drop) {
  Tensor m = empty(attnShape, {.dtype = DType::Bool});
  const int64_t tq = attnShape[attnShape.size() - 2], tk = attnShape.back();
  const int64_t nb = tq * tk == 0 ? 0 : m.numel() / (tq * tk);
  bool* p = m.numel() > 0 ? m.data<bool>() : nullptr;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const uint64_t rk = drop.row(b, i);
      bool* r = p + (b * tq + i) * tk;
      for (int64_t j = 0; j < tk; ++j) r[j] = SdpaDropout::keep(rk, j, drop.threshold);
    }
  return m;
}

// The fused op on another device, through its registered kernels, when it has them for these
// inputs: no mask or dropout, one batch shape, e == ev, a dtype and head size the kernel takes.
// Returns an undefined tensor otherwise (the caller runs the unfused formula).
Tensor deviceFusedAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts,
                            const SdpaDims& d) {
  if (opts.mask.defined() || opts.dropout > 0.0 || d.e != d.ev || d.tq == 0 || d.tk == 0) return Tensor();
  const Shape batch(q.sizes().begin(), q.sizes().end() - 2);
  if (Shape(k.sizes().begin(), k.sizes().end() - 2) != batch || Shape(v.sizes().begin(), v.sizes().end() - 2) != batch)
    return Tensor();
  auto* supports = dispatch::find<detail::SdpaSupportsKernel>(kOp, q.device());
  auto* forward = dispatch::find<detail::SdpaForwardKernel>(kOp, q.device());
  auto* backward = dispatch::find<detail::SdpaBackwardKernel>(kOp, q.device());
  if (supports == nullptr || forward == nullptr || backward == nullptr || !supports(q.dtype(), d.e)) return Tensor();
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const bool causal = opts.causal;
  Tensor qc, kc, vc, out, lse;
  {
    autograd::NoGradGuard ng;
    qc = q.contiguous().reshape({d.nb, d.tq, d.e});
    kc = k.contiguous().reshape({d.nb, d.tk, d.e});
    vc = v.contiguous().reshape({d.nb, d.tk, d.e});
    out = empty({d.nb, d.tq, d.e}, {.dtype = q.dtype(), .device = q.device()});
    lse = empty({d.nb, d.tq}, {.dtype = DType::Float32, .device = q.device()});
    forward(out, lse, qc, kc, vc, scale, causal);
  }
  Tensor result = out.view(sdpaShape(d.batch, d.tq, d.e));
  autograd::record(kOp, {q, k, v}, {result}, {qc, kc, vc, out, lse},
                   [d, scale, causal, backward](Ctx& ctx, const GradList& g) -> GradList {
                     GradList r(3);
                     Tensor qs = ctx.saved(0), ks = ctx.saved(1), vs = ctx.saved(2);
                     Tensor dq = empty(qs.sizes(), {.dtype = qs.dtype(), .device = qs.device()});
                     Tensor dk = empty(ks.sizes(), {.dtype = ks.dtype(), .device = ks.device()});
                     Tensor dv = empty(vs.sizes(), {.dtype = vs.dtype(), .device = vs.device()});
                     Tensor go = g[0].to(qs.dtype()).contiguous().reshape(qs.sizes());
                     backward(dq, dk, dv, qs, ks, vs, ctx.saved(3), ctx.saved(4), go, scale, causal);
                     if (ctx.needsInputGrad(0)) r[0] = dq.view(sdpaShape(d.batch, d.tq, d.e));
                     if (ctx.needsInputGrad(1)) r[1] = dk.view(sdpaShape(d.batch, d.tk, d.e));
                     if (ctx.needsInputGrad(2)) r[2] = dv.view(sdpaShape(d.batch, d.tk, d.ev));
                     return r;
                   });
  return result;
}

}  // namespace

// The formula with matmul and softmax ([..., Tq, Tk] materialised), also the path of devices
// without the fused kernel. No autocast entry of its own: under autocast the ops inside are
// dispatched one by one, each by its policy.
Tensor scaledDotProductAttentionMath(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  const SdpaDims d = checkArgs(q, k, v, opts);
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const SdpaDropout drop =
      opts.dropout > 0.0 ? SdpaDropout(opts.dropout, drawDropoutKey(opts.generator), d.tq) : SdpaDropout();
  const Device dev = q.device();
  Tensor att = matmul(q, k.transpose(-2, -1)) * scale;  // [..., Tq, Tk]
  if (opts.causal) {
    // Key j is visible to query i when j <= i: a [Tq, Tk] comparison on the device of two index
    // vectors (not a mask built on the host and copied each call).
    Tensor rows = arange(d.tq, {.dtype = DType::Int64, .device = dev}).unsqueeze(1);
    Tensor cols = arange(d.tk, {.dtype = DType::Int64, .device = dev}).unsqueeze(0);
    att = where(le(cols, rows), att,
                full({}, -std::numeric_limits<double>::infinity(), {.dtype = att.dtype(), .device = dev}));
  } else if (opts.mask.defined()) {
    if (opts.mask.dtype() == DType::Bool)
      att = where(opts.mask, att,
                  full({}, -std::numeric_limits<double>::infinity(), {.dtype = att.dtype(), .device = dev}));
    else att = att + opts.mask.to(att.dtype());
  }
  att = softmax(att, -1);
  if (drop.on) {
    Tensor keep = keepMask(sdpaShape(d.batch, d.tq, d.tk), drop);
    Tensor z = where(keep, full({}, drop.scale, {.dtype = DType::Float64}), zeros({}, {.dtype = DType::Float64}));
    att = att * z.to(att.dtype()).to(dev);
  }
  return matmul(att, v);
}

Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  COHORT_RECORD_OP("scaledDotProductAttention", q, k, v, opts);
  COHORT_AUTOCAST("scaledDotProductAttention", scaledDotProductAttention, q, k, v, opts);
  const SdpaDims d = checkArgs(q, k, v, opts);
  // A device's whole-op kernel (the CPU's takes every option), else its fused forward and backward
  // kernels for the cases they take, else the formula.
  if (auto* whole = dispatch::find<SdpaOpKernel>(kOp, q.device())) return whole(q, k, v, opts, d);
  if (Tensor out = deviceFusedAttention(q, k, v, opts, d); out.defined()) return out;
  return scaledDotProductAttentionMath(q, k, v, opts);
}

namespace {

// The CPU's fused attention (attention_cpu.cc), with masks, dropout and broadcast batch dims.
Tensor cpuAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts, const SdpaDims& d) {
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const SdpaDropout drop =
      opts.dropout > 0.0 ? SdpaDropout(opts.dropout, drawDropoutKey(opts.generator), d.tq) : SdpaDropout();
  return fusedAttention(q, k, v, {.d = d, .mask = opts.mask, .scale = scale, .causal = opts.causal, .drop = drop});
}

const dispatch::Register<SdpaOpKernel> kCpuAttention{kOp, DeviceType::CPU, &cpuAttention};

}  // namespace

Tensor scaledDotProductAttentionDropoutMask(const Shape& attnShape, double p, Generator* gen) {
  const char* op = "scaledDotProductAttentionDropoutMask";
  if (attnShape.size() < 2)
    throw ValueError(
        fmt::format("{}: attnShape must have at least 2 dims [..., Tq, Tk], got {}", op, shapeStr(attnShape)));
  for (int64_t s : attnShape)
    if (s < 0) throw ValueError(fmt::format("{}: attnShape {} has a negative size", op, shapeStr(attnShape)));
  if (!(p >= 0.0 && p < 1.0)) throw ValueError(fmt::format("{}: p must be in [0, 1), got {}", op, p));
  const int64_t tq = attnShape[attnShape.size() - 2];
  if (p == 0.0) return ones(attnShape, {.dtype = DType::Bool});
  return keepMask(attnShape, SdpaDropout(p, drawDropoutKey(gen), tq));
}

}  // namespace cohort::nn::functional
