// conv2d (im2col + GEMM through core/blas) and 2-D max/avg pooling, with their backward passes.
//
// conv2d runs per sample and per group: the input patch matrix col[Cg*kH*kW, Ho*Wo] is built
// once (im2col), then out_g[Coutg, Ho*Wo] = W_g[Coutg, Cg*kH*kW] @ col in one GEMM. Backward
// reuses the same layout: dW_g += dOut_g @ col^T and dCol = W_g^T @ dOut_g, scattered back with
// col2im. A 1x1 kernel with stride 1 and no padding needs no im2col: the input already is col.
// float16/bfloat16 compute in float32 and round once when the result is stored. Tensors on other
// devices take the same steps built from device-neutral tensor operations (conv_views.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/detail/conv_views.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/profiler/record.h>

namespace cohort::nn::functional {
namespace {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

template <typename T>
void gemm(blas::Trans ta, blas::Trans tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) blas::sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  else blas::dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

using detail::ConvGeom;
using detail::PoolGeom;

// The output positions o in [0, outLen) whose input coordinate o*stride - pad + off lies in [0, inLen).
inline std::pair<int64_t, int64_t> validRange(int64_t inLen, int64_t outLen, int64_t stride, int64_t pad, int64_t off) {
  // o*stride + (off - pad) >= 0  and  o*stride + (off - pad) <= inLen - 1
  int64_t shift = off - pad;
  int64_t lo = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
  int64_t hiNum = inLen - 1 - shift;
  int64_t hi = hiNum < 0 ? 0 : hiNum / stride + 1;
  lo = std::min(lo, outLen);
  hi = std::clamp(hi, lo, outLen);
  return {lo, hi};
}

// x: [C, H, W] contiguous -> col: [C*kH*kW, Ho*Wo].
template <typename T>
void im2col(const T* x, const ConvGeom& g, int64_t channels, T* col) {
  const int64_t hw = g.h * g.w, ohw = g.ospatial();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      auto [ohLo, ohHi] = validRange(g.h, g.ho, g.sh, g.ph, ki * g.dh);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        auto [owLo, owHi] = validRange(g.w, g.wo, g.sw, g.pw, kj * g.dw);
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * ohw;
        const T* plane = x + c * hw;
        std::fill(row, row + ohLo * g.wo, T(0));
        for (int64_t oh = ohLo; oh < ohHi; ++oh) {
          T* r = row + oh * g.wo;
          const T* src = plane + (oh * g.sh - g.ph + ki * g.dh) * g.w + (kj * g.dw - g.pw);
          std::fill(r, r + owLo, T(0));
          if (g.sw == 1) {
            std::memcpy(r + owLo, src + owLo, static_cast<size_t>(owHi - owLo) * sizeof(T));
          } else {
            for (int64_t ow = owLo; ow < owHi; ++ow) r[ow] = src[ow * g.sw];
          }
          std::fill(r + owHi, r + g.wo, T(0));
        }
        std::fill(row + ohHi * g.wo, row + ohw, T(0));
      }
    }
}

// The adjoint of im2col: x[C, H, W] += the col entries that read each input element.
template <typename T>
void col2im(const T* col, const ConvGeom& g, int64_t channels, T* x) {
  const int64_t hw = g.h * g.w, ohw = g.ospatial();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      auto [ohLo, ohHi] = validRange(g.h, g.ho, g.sh, g.ph, ki * g.dh);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        auto [owLo, owHi] = validRange(g.w, g.wo, g.sw, g.pw, kj * g.dw);
        const T* row = col + ((c * g.kh + ki) * g.kw + kj) * ohw;
        T* plane = x + c * hw;
        for (int64_t oh = ohLo; oh < ohHi; ++oh) {
          const T* r = row + oh * g.wo;
          T* dst = plane + (oh * g.sh - g.ph + ki * g.dh) * g.w + (kj * g.dw - g.pw);
          if (g.sw == 1) {
            for (int64_t ow = owLo; ow < owHi; ++ow) dst[ow] += r[ow];
          } else {
            for (int64_t ow = owLo; ow < owHi; ++ow) dst[ow * g.sw] += r[ow];
          }
        }
      }
    }
}

// x [N, Cin, H, W], w [Cout, Cg, kH, kW], b [Cout] or undefined; all contiguous of type T.
template <typename T>
Tensor convForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  Tensor out = empty({g.n, g.cout, g.ho, g.wo}, {.dtype = x.dtype()});
  if (out.numel() == 0) return out;
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  T* po = out.data<T>();
  const int64_t K = g.kdim(), P = g.ospatial(), cg = g.cg(), coutg = g.coutg();
  std::vector<T> colBuf(g.direct() ? 0 : static_cast<size_t>(K * P));
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* xin = px + (n * g.cin + grp * cg) * g.h * g.w;
      const T* col = xin;
      if (!g.direct()) {
        im2col(xin, g, cg, colBuf.data());
        col = colBuf.data();
      }
      T* o = po + (n * g.cout + grp * coutg) * P;
      T beta = 0;
      if (b.defined()) {
        const T* pb = b.data<T>() + grp * coutg;
        for (int64_t c = 0; c < coutg; ++c) std::fill(o + c * P, o + (c + 1) * P, pb[c]);
        beta = 1;
      }
      if (K == 0) {
        if (!b.defined()) std::fill(o, o + coutg * P, T(0));
        continue;
      }
      gemm<T>(blas::Trans::No, blas::Trans::No, coutg, P, K, pw + grp * coutg * K, K, col, P, beta, o, P);
    }
  return out;
}

// Gradients of convForward. gout [N, Cout, Ho, Wo] contiguous.
template <typename T>
GradList convBackward(const Tensor& x, const Tensor& w, const Tensor& gout, const ConvGeom& g, bool needX, bool needW,
                      bool needB) {
  GradList r(3);
  const int64_t K = g.kdim(), P = g.ospatial(), cg = g.cg(), coutg = g.coutg();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pg = gout.data<T>();
  Tensor gx, gw;
  if (needX) gx = zeros({g.n, g.cin, g.h, g.w}, {.dtype = x.dtype()});
  if (needW) gw = zeros({g.cout, cg, g.kh, g.kw}, {.dtype = x.dtype()});
  if (K > 0 && P > 0 && (needX || needW)) {
    std::vector<T> colBuf(static_cast<size_t>(K * P));
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* go = pg + (n * g.cout + grp * coutg) * P;
        const T* wg = pw + grp * coutg * K;
        if (needW) {
          const T* xin = px + (n * g.cin + grp * cg) * g.h * g.w;
          const T* col = xin;
          if (!g.direct()) {
            im2col(xin, g, cg, colBuf.data());
            col = colBuf.data();
          }
          // dW_g[Coutg, K] += gout_g[Coutg, P] @ col^T
          gemm<T>(blas::Trans::No, blas::Trans::Yes, coutg, K, P, go, P, col, P, T(1), gw.data<T>() + grp * coutg * K,
                  K);
        }
        if (needX) {
          T* gxin = gx.data<T>() + (n * g.cin + grp * cg) * g.h * g.w;
          if (g.direct()) {
            // dX_g[K, P] = W_g^T @ gout_g, written straight into the (zeroed) input gradient.
            gemm<T>(blas::Trans::Yes, blas::Trans::No, K, P, coutg, wg, K, go, P, T(0), gxin, P);
          } else {
            gemm<T>(blas::Trans::Yes, blas::Trans::No, K, P, coutg, wg, K, go, P, T(0), colBuf.data(), P);
            col2im(colBuf.data(), g, cg, gxin);
          }
        }
      }
  }
  r[0] = gx;
  r[1] = gw;
  if (needB) r[2] = gout.sum({0, 2, 3});
  return r;
}

// The dtype conv and pooling kernels compute in: float32 for the half types.
DType computeType(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

std::string pairStr(std::pair<int64_t, int64_t> p) { return fmt::format("({}, {})", p.first, p.second); }

// ---- pooling -------------------------------------------------------------------------------------

Shape poolOutShape(const Tensor& x, const PoolGeom& g) {
  Shape s = x.sizes();
  s[s.size() - 2] = g.ho;
  s[s.size() - 1] = g.wo;
  return s;
}

}  // namespace

namespace detail {

ConvGeom convGeometry(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dOptions& opts) {
  if (!input.defined() || !weight.defined()) throw ValueError("conv2d: input and weight must be defined");
  if (input.dim() != 4 || weight.dim() != 4)
    throw ValueError(fmt::format("conv2d: expects a 4-D input [N, Cin, H, W] and a 4-D weight [Cout, Cin/groups, kH, "
                                 "kW], got shapes {} and {}",
                                 shapeStr(input.sizes()), shapeStr(weight.sizes())));
  if (!isFloating(input.dtype()) || input.dtype() != weight.dtype() ||
      (bias.defined() && bias.dtype() != input.dtype()))
    throw ValueError(fmt::format("conv2d: input, weight and bias must share one floating dtype, got {}, {} and {}",
                                 input.dtype(), weight.dtype(), bias.defined() ? dtypeName(bias.dtype()) : "none"));
  ConvGeom g;
  g.n = input.size(0);
  g.cin = input.size(1);
  g.h = input.size(2);
  g.w = input.size(3);
  g.cout = weight.size(0);
  g.kh = weight.size(2);
  g.kw = weight.size(3);
  g.groups = opts.groups;
  std::tie(g.sh, g.sw) = opts.stride;
  std::tie(g.ph, g.pw) = opts.padding;
  std::tie(g.dh, g.dw) = opts.dilation;
  if (g.groups <= 0 || g.sh <= 0 || g.sw <= 0 || g.dh <= 0 || g.dw <= 0 || g.ph < 0 || g.pw < 0)
    throw ValueError(fmt::format("conv2d: groups {}, stride {} and dilation {} must be positive and padding {} "
                                 "non-negative (input shape {}, weight shape {})",
                                 g.groups, pairStr(opts.stride), pairStr(opts.dilation), pairStr(opts.padding),
                                 shapeStr(input.sizes()), shapeStr(weight.sizes())));
  if (g.cin % g.groups != 0 || g.cout % g.groups != 0)
    throw ValueError(fmt::format("conv2d: input channels {} and output channels {} must both be divisible by groups {} "
                                 "(input shape {}, weight shape {})",
                                 g.cin, g.cout, g.groups, shapeStr(input.sizes()), shapeStr(weight.sizes())));
  if (weight.size(1) * g.groups != g.cin)
    throw ValueError(fmt::format("conv2d: channel mismatch: input of shape {} has {} channels, but weight of shape {} "
                                 "with groups {} expects {}",
                                 shapeStr(input.sizes()), g.cin, shapeStr(weight.sizes()), g.groups,
                                 weight.size(1) * g.groups));
  if (weight.device() != input.device() || (bias.defined() && bias.device() != input.device()))
    throw ValueError(fmt::format("conv2d: input, weight and bias must be on one device, got {}, {} and {}",
                                 input.device(), weight.device(),
                                 bias.defined() ? fmt::format("{}", bias.device()) : std::string("none")));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != g.cout))
    throw ValueError(fmt::format("conv2d: bias must have shape [{}], got {} (weight shape {})", g.cout,
                                 shapeStr(bias.sizes()), shapeStr(weight.sizes())));
  const int64_t ekh = (g.kh - 1) * g.dh + 1, ekw = (g.kw - 1) * g.dw + 1;
  if (ekh > g.h + 2 * g.ph || ekw > g.w + 2 * g.pw)
    throw ValueError(fmt::format("conv2d: kernel of size ({}, {}) (dilated) is larger than the padded input ({}, {}) "
                                 "(input shape {}, weight shape {}, padding {}, dilation {})",
                                 ekh, ekw, g.h + 2 * g.ph, g.w + 2 * g.pw, shapeStr(input.sizes()),
                                 shapeStr(weight.sizes()), pairStr(opts.padding), pairStr(opts.dilation)));
  g.ho = (g.h + 2 * g.ph - ekh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - ekw) / g.sw + 1;

  return g;
}

PoolGeom poolGeometry(const Tensor& x, const Pool2dOptions& o, const char* op) {
  if (!x.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  if (x.dim() != 3 && x.dim() != 4)
    throw ValueError(
        fmt::format("{}: expects a 3-D [C, H, W] or 4-D [N, C, H, W] input, got shape {}", op, shapeStr(x.sizes())));
  if (!isFloating(x.dtype()))
    throw ValueError(
        fmt::format("{}: expects a floating-point input, got {} (shape {})", op, x.dtype(), shapeStr(x.sizes())));
  PoolGeom g;
  g.kh = o.kernel.first;
  g.kw = o.kernel.second;
  g.sh = o.stride.first == 0 ? g.kh : o.stride.first;
  g.sw = o.stride.second == 0 ? g.kw : o.stride.second;
  g.ph = o.padding.first;
  g.pw = o.padding.second;
  if (g.kh <= 0 || g.kw <= 0 || g.sh <= 0 || g.sw <= 0)
    throw ValueError(fmt::format("{}: kernel {} and stride {} must be positive (input shape {})", op, pairStr(o.kernel),
                                 pairStr({g.sh, g.sw}), shapeStr(x.sizes())));
  if (g.ph < 0 || g.pw < 0 || g.ph * 2 > g.kh || g.pw * 2 > g.kw)
    throw ValueError(fmt::format("{}: padding {} must be non-negative and at most half the kernel {} (input shape {})",
                                 op, pairStr(o.padding), pairStr(o.kernel), shapeStr(x.sizes())));
  g.h = x.size(-2);
  g.w = x.size(-1);
  if (x.dim() == 4) g.planes = x.size(0) * x.size(1);
  else g.planes = x.size(0);
  if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw)
    throw ValueError(fmt::format("{}: kernel {} is larger than the padded input ({}, {}) (input shape {}, padding {})",
                                 op, pairStr(o.kernel), g.h + 2 * g.ph, g.w + 2 * g.pw, shapeStr(x.sizes()),
                                 pairStr(o.padding)));
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

}  // namespace detail

namespace {

// A device's kernels for a forward and its backward, both registered, else the composites: one
// pair, so the backward always reads what its own forward saved.
template <typename F, typename B>
std::pair<F*, B*> kernelPair(const char* op, const char* backward, Device device, F* composite, B* compositeBackward) {
  F* f = dispatch::find<F>(op, device);
  B* b = dispatch::find<B>(backward, device);
  if (f != nullptr && b != nullptr) return {f, b};
  return {composite, compositeBackward};
}

Tensor convByViews(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  return detail::convForwardByViews(x, w, b, g);
}
GradList convBackwardByViews(const Tensor& x, const Tensor& w, const Tensor& go, const ConvGeom& g, bool nx, bool nw,
                             bool nb) {
  return detail::convBackwardByViews(x, w, go, g, nx, nw, nb);
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dOptions& opts) {
  COHORT_RECORD_OP("conv2d", input, weight, bias, opts);
  COHORT_AUTOCAST("conv2d", conv2d, input, weight, bias, opts);
  const ConvGeom g = detail::convGeometry(input, weight, bias, opts);
  const DType dt = input.dtype(), ct = computeType(dt);
  const auto kernels =
      kernelPair<detail::ConvForwardKernel, detail::ConvBackwardKernel>("conv2d", "conv2d backward", input.device(),
                                                                        &convByViews, &convBackwardByViews);
  auto* const forward = kernels.first;
  auto* const backward = kernels.second;
  Tensor out;
  {
    autograd::NoGradGuard ng;
    Tensor x = input.to(ct).contiguous(), w = weight.to(ct).contiguous();
    Tensor b = bias.defined() ? bias.to(ct).contiguous() : Tensor();
    out = forward(x, w, b, g).to(dt);
  }
  autograd::record("conv2d", {input, weight, bias}, {out}, {input, weight},
                   [g, ct, backward](Ctx& ctx, const GradList& grads) -> GradList {
                     Tensor x = ctx.saved(0).to(ct).contiguous(), w = ctx.saved(1).to(ct).contiguous();
                     Tensor go = grads[0].to(ct).contiguous();
                     return backward(x, w, go, g, ctx.needsInputGrad(0), ctx.needsInputGrad(1), ctx.needsInputGrad(2));
                   });
  return out;
}

Tensor maxPool2d(const Tensor& input, const Pool2dOptions& opts) {
  COHORT_RECORD_OP("maxPool2d", input, opts);
  PoolGeom g = detail::poolGeometry(input, opts, "maxPool2d");
  const DType dt = input.dtype();
  const Shape inShape = input.sizes();
  const auto kernels =
      kernelPair<detail::MaxPoolForwardKernel, detail::MaxPoolBackwardKernel>("maxPool2d", "maxPool2d backward",
                                                                              input.device(), &detail::maxPoolByViews,
                                                                              &detail::maxPoolBackwardByViews);
  auto* const forward = kernels.first;
  auto* const backward = kernels.second;
  // Maxima are exact in any float type; the gradient accumulates in the compute type.
  auto [out, argmax] = forward(input.detach().reshape({g.planes, g.h, g.w}), g);
  out = out.view(poolOutShape(input, g));
  autograd::record("maxPool2d", {input}, {out}, {argmax},
                   [g, inShape, dt, backward](Ctx& ctx, const GradList& grads) -> GradList {
                     Tensor go = grads[0].to(computeType(dt)).reshape({g.planes, g.ho, g.wo});
                     return {backward(go, ctx.saved(0), g).view(inShape).to(dt)};
                   });
  return out;
}

Tensor avgPool2d(const Tensor& input, const Pool2dOptions& opts) {
  COHORT_RECORD_OP("avgPool2d", input, opts);
  PoolGeom g = detail::poolGeometry(input, opts, "avgPool2d");
  const DType dt = input.dtype(), ct = computeType(dt);
  const Shape inShape = input.sizes();
  const auto kernels =
      kernelPair<detail::AvgPoolForwardKernel, detail::AvgPoolBackwardKernel>("avgPool2d", "avgPool2d backward",
                                                                              input.device(), &detail::avgPoolByViews,
                                                                              &detail::avgPoolBackwardByViews);
  auto* const forward = kernels.first;
  auto* const backward = kernels.second;
  Tensor out = forward(input.detach().to(ct).reshape({g.planes, g.h, g.w}), g).view(poolOutShape(input, g)).to(dt);
  autograd::record("avgPool2d", {input}, {out}, {},
                   [g, inShape, dt, ct, backward](Ctx&, const GradList& grads) -> GradList {
                     Tensor go = grads[0].to(ct).reshape({g.planes, g.ho, g.wo});
                     return {backward(go, g).view(inShape).to(dt)};
                   });
  return out;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

Tensor convForwardCpu(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  return x.dtype() == DType::Float64 ? convForward<double>(x, w, b, g) : convForward<float>(x, w, b, g);
}

GradList convBackwardCpu(const Tensor& x, const Tensor& w, const Tensor& go, const ConvGeom& g, bool nx, bool nw,
                         bool nb) {
  return x.dtype() == DType::Float64 ? convBackward<double>(x, w, go, g, nx, nw, nb)
                                     : convBackward<float>(x, w, go, g, nx, nw, nb);
}

// A pooling window: output (p, oh, ow) and the input rows [h0, h1) and columns [w0, w1) it covers,
// clipped to the input (padding reads nothing).
struct Window {
  int64_t p, oh, ow, h0, h1, w0, w1;
  int64_t out(const PoolGeom& g) const { return (p * g.ho + oh) * g.wo + ow; }
};

// Calls f(window) for every output position of every plane, in output order.
template <typename F>
void forEachWindow(const PoolGeom& g, F&& f) {
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      const int64_t h0 = std::max<int64_t>(oh * g.sh - g.ph, 0), h1 = std::min(oh * g.sh - g.ph + g.kh, g.h);
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(ow * g.sw - g.pw, 0), w1 = std::min(ow * g.sw - g.pw + g.kw, g.w);
        f(Window{p, oh, ow, h0, h1, w0, w1});
      }
    }
}

// Runs run.operator()<A>() with A float or double, by the compute type `dt`.
template <typename F>
void withComputeType(DType dt, F&& run) {
  if (dt == DType::Float64) run.template operator()<double>();
  else run.template operator()<float>();
}

// x [planes, H, W] in any float type -> the maxima in x's type and, for each, the flat h*w
// position (within its plane) of the first maximum (NaN counts as the maximum, as in torch).
std::pair<Tensor, Tensor> maxPoolCpu(const Tensor& input, const PoolGeom& g) {
  const Tensor x = input.contiguous();
  const DType dt = x.dtype();
  Tensor out = empty({g.planes, g.ho, g.wo}, {.dtype = dt});
  Tensor argmax = empty({g.planes, g.ho, g.wo}, {.dtype = DType::Int64});
  COHORT_DISPATCH_FLOAT(dt, "maxPool2d", [&]<typename T>() {
    using A = Acc<T>;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int64_t* pa = argmax.data<int64_t>();
    forEachWindow(g, [&](const Window& w) {
      const T* plane = px + w.p * g.h * g.w;
      A best = -std::numeric_limits<A>::infinity();
      int64_t bestAt = w.h0 * g.w + w.w0;
      bool sawNan = false;
      for (int64_t ih = w.h0; ih < w.h1 && !sawNan; ++ih)
        for (int64_t iw = w.w0; iw < w.w1; ++iw) {
          A v = static_cast<A>(plane[ih * g.w + iw]);
          if (v > best || std::isnan(v)) {
            best = v;
            bestAt = ih * g.w + iw;
            if (std::isnan(v)) {
              sawNan = true;
              break;
            }
          }
        }
      po[w.out(g)] = static_cast<T>(best);
      pa[w.out(g)] = bestAt;
    });
  });
  return {out, argmax};
}

// Overlapping windows may route several gradients to one input: accumulated in the compute type
// (gout's, float32 or float64).
Tensor maxPoolBackwardCpu(const Tensor& gout, const Tensor& argmax, const PoolGeom& g) {
  Tensor gi = zeros({g.planes, g.h, g.w}, {.dtype = gout.dtype()});
  const Tensor go = gout.contiguous(), am = argmax.contiguous();
  withComputeType(gout.dtype(), [&]<typename A>() {
    const A* pg = go.data<A>();
    const int64_t* pa = am.data<int64_t>();
    A* px = gi.data<A>();
    const int64_t per = g.ho * g.wo;
    for (int64_t p = 0; p < g.planes; ++p) {
      A* plane = px + p * g.h * g.w;
      for (int64_t i = 0; i < per; ++i) plane[pa[p * per + i]] += pg[p * per + i];
    }
  });
  return gi;
}

// x [planes, H, W] in the compute type (float32 or float64).
Tensor avgPoolCpu(const Tensor& input, const PoolGeom& g) {
  const Tensor x = input.contiguous();
  Tensor out = empty({g.planes, g.ho, g.wo}, {.dtype = x.dtype()});
  withComputeType(x.dtype(), [&]<typename A>() {
    const A* px = x.data<A>();
    A* po = out.data<A>();
    forEachWindow(g, [&](const Window& w) {
      const A* plane = px + w.p * g.h * g.w;
      A s = 0;
      for (int64_t ih = w.h0; ih < w.h1; ++ih)
        for (int64_t iw = w.w0; iw < w.w1; ++iw) s += plane[ih * g.w + iw];
      po[w.out(g)] = s / static_cast<A>(detail::avgPoolDivisor(g, w.oh, w.ow));
    });
  });
  return out;
}

Tensor avgPoolBackwardCpu(const Tensor& gout, const PoolGeom& g) {
  Tensor gi = zeros({g.planes, g.h, g.w}, {.dtype = gout.dtype()});
  const Tensor go = gout.contiguous();
  withComputeType(gout.dtype(), [&]<typename A>() {
    const A* pg = go.data<A>();
    A* px = gi.data<A>();
    forEachWindow(g, [&](const Window& w) {
      A* plane = px + w.p * g.h * g.w;
      const A v = pg[w.out(g)] / static_cast<A>(detail::avgPoolDivisor(g, w.oh, w.ow));
      for (int64_t ih = w.h0; ih < w.h1; ++ih)
        for (int64_t iw = w.w0; iw < w.w1; ++iw) plane[ih * g.w + iw] += v;
    });
  });
  return gi;
}

const bool kCpuKernels = [] {
  using dispatch::Register;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<detail::ConvForwardKernel>("conv2d", kCpu, &convForwardCpu);
  Register<detail::ConvBackwardKernel>("conv2d backward", kCpu, &convBackwardCpu);
  Register<detail::MaxPoolForwardKernel>("maxPool2d", kCpu, &maxPoolCpu);
  Register<detail::MaxPoolBackwardKernel>("maxPool2d backward", kCpu, &maxPoolBackwardCpu);
  Register<detail::AvgPoolForwardKernel>("avgPool2d", kCpu, &avgPoolCpu);
  Register<detail::AvgPoolBackwardKernel>("avgPool2d backward", kCpu, &avgPoolBackwardCpu);
  return true;
}();

}  // namespace

}  // namespace cohort::nn::functional
