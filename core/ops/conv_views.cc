// conv2d and 2-D pooling from device-neutral tensor operations (see detail/conv_views.h).
//
// The patch matrix of a convolution is a strided view of the (padded) input: for group g, row
// (c, i, j) and column (n, oh, ow) read input channel g*Cg + c at (oh*sh + i*dh, ow*sw + j*dw) of
// the padded plane. One copy makes it [G, K, N*Ho*Wo], and the whole batch is one batched GEMM
// per group set. The adjoint (col2im) adds the patch gradients back through the same view, one
// kernel offset (i, j) at a time: within one offset no two output positions read the same input
// element, so each add is a plain strided elementwise add. A large batch goes in chunks, so that
// the patch matrix stays bounded. Pooling takes its windows the same way and reduces over them.
#include <cohort/core/ops/detail/conv_views.h>

#include <algorithm>
#include <limits>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>

namespace cohort::nn::functional::detail {
namespace {

// x [..., H, W] padded by (ph, pw) on both sides with `fill`, contiguous.
Tensor padded(const Tensor& x, int64_t ph, int64_t pw, double fill) {
  if (ph == 0 && pw == 0) return x.contiguous();
  Shape s = x.sizes();
  const int64_t h = s[s.size() - 2], w = s[s.size() - 1];
  s[s.size() - 2] += 2 * ph;
  s[s.size() - 1] += 2 * pw;
  Tensor out = full(s, fill, {.dtype = x.dtype(), .device = x.device()});
  out.narrow(-2, ph, h).narrow(-1, pw, w).copy_(x);
  return out;
}

// The inverse of padded(): the [..., H, W] middle, contiguous.
Tensor cropped(const Tensor& xp, int64_t ph, int64_t pw, int64_t h, int64_t w) {
  if (ph == 0 && pw == 0) return xp;
  return xp.narrow(-2, ph, h).narrow(-1, pw, w).contiguous();
}

// The patch matrix [G, K, N*P] of x [N, Cin, H, W] (see the top of the file).
Tensor patches(const Tensor& x, const ConvGeom& g) {
  const Tensor xp = padded(x, g.ph, g.pw, 0.0);
  const int64_t wp = xp.size(3), plane = xp.size(2) * wp;
  const Tensor v =
      xp.asStrided({g.groups, g.cg(), g.kh, g.kw, g.n, g.ho, g.wo},
                   {g.cg() * plane, plane, g.dh * wp, g.dw, g.cin * plane, g.sh * wp, g.sw}, xp.storageOffset());
  return v.contiguous().view({g.groups, g.kdim(), g.n * g.ospatial()});
}

// The windows of xp [planes, Hp, Wp] (padded, contiguous) as [planes, Ho, Wo, kH*kW], contiguous.
Tensor windows(const Tensor& xp, const PoolGeom& g) {
  const int64_t wp = xp.size(2), plane = xp.size(1) * wp;
  return xp.asStrided({g.planes, g.ho, g.wo, g.kh, g.kw}, {plane, g.sh * wp, g.sw, wp, 1}, xp.storageOffset())
      .contiguous()
      .view({g.planes, g.ho, g.wo, g.kh * g.kw});
}

// gxp [planes, Hp, Wp] (padded, contiguous) += v [planes, Ho, Wo] at kernel offset (i, j).
void addAtOffset(Tensor& gxp, const Tensor& v, const PoolGeom& g, int64_t i, int64_t j) {
  const int64_t wp = gxp.size(2), plane = gxp.size(1) * wp;
  Tensor dst = gxp.asStrided({g.planes, g.ho, g.wo}, {plane, g.sh * wp, g.sw}, gxp.storageOffset() + i * wp + j);
  dst.add_(v);
}

// avgPoolDivisor of every output position, [Ho, Wo] on the given device.
Tensor avgDivisor(const PoolGeom& g, DType dt, Device device) {
  Tensor d = empty({g.ho, g.wo}, {.dtype = DType::Float64});
  double* p = d.data<double>();
  for (int64_t oh = 0; oh < g.ho; ++oh)
    for (int64_t ow = 0; ow < g.wo; ++ow) p[oh * g.wo + ow] = static_cast<double>(avgPoolDivisor(g, oh, ow));
  return d.to(dt).to(device);
}

// Samples per chunk of the batch: as many as keep the patch matrix within maxPatchElements (one at
// the least), or the whole batch.
int64_t samplesPerChunk(const ConvGeom& g, int64_t maxPatchElements) {
  const int64_t perSample = std::max<int64_t>(1, g.kdim() * g.ospatial());
  return std::clamp<int64_t>(maxPatchElements / perSample, 1, std::max<int64_t>(g.n, 1));
}

// g for samples [n0, n0 + len) of the batch.
ConvGeom chunkGeom(const ConvGeom& g, int64_t len) {
  ConvGeom c = g;
  c.n = len;
  return c;
}

}  // namespace

Tensor convForwardByViews(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g,
                          int64_t maxPatchElements) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;  // the compute type is the caller's
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  if (g.n * g.cout * g.ospatial() == 0) return empty({g.n, g.cout, g.ho, g.wo}, opts);
  if (const int64_t chunk = samplesPerChunk(g, maxPatchElements); chunk < g.n) {
    Tensor out = empty({g.n, g.cout, g.ho, g.wo}, opts);
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t len = std::min(chunk, g.n - n0);
      out.narrow(0, n0, len).copy_(convForwardByViews(x.narrow(0, n0, len), w, b, chunkGeom(g, len), maxPatchElements));
    }
    return out;
  }
  const int64_t np = g.n * g.ospatial();
  Tensor y;  // [G, Coutg, N*P]
  if (g.kdim() == 0) {
    y = zeros({g.groups, g.coutg(), np}, opts);
  } else {
    y = bmm(w.contiguous().view({g.groups, g.coutg(), g.kdim()}), patches(x, g));
  }
  Tensor out = y.view({g.cout, g.n, g.ho, g.wo}).permute({1, 0, 2, 3}).contiguous();
  if (b.defined()) out.add_(b.view({1, g.cout, 1, 1}));
  return out;
}

std::vector<Tensor> convBackwardByViews(const Tensor& x, const Tensor& w, const Tensor& gout, const ConvGeom& g,
                                        bool needX, bool needW, bool needB, int64_t maxPatchElements) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  std::vector<Tensor> r(3);
  if (const int64_t chunk = samplesPerChunk(g, maxPatchElements); chunk < g.n && (needX || needW)) {
    if (needX) r[0] = empty({g.n, g.cin, g.h, g.w}, opts);
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t len = std::min(chunk, g.n - n0);
      std::vector<Tensor> part = convBackwardByViews(x.narrow(0, n0, len), w, gout.narrow(0, n0, len),
                                                     chunkGeom(g, len), needX, needW, false, maxPatchElements);
      if (needX) r[0].narrow(0, n0, len).copy_(part[0]);
      if (needW) r[1] = r[1].defined() ? r[1].add_(part[1]) : part[1];
    }
    if (needB) r[2] = gout.sum({0, 2, 3});
    return r;
  }
  const int64_t np = g.n * g.ospatial(), k = g.kdim();
  const bool none = np == 0 || k == 0 || g.coutg() == 0;  // every product is empty
  // gout as [G, Coutg, N*P], the layout of the forward's product.
  Tensor go;
  if (!none && (needX || needW)) go = gout.permute({1, 0, 2, 3}).contiguous().view({g.groups, g.coutg(), np});
  if (needW) {
    r[1] = none ? zeros({g.cout, g.cg(), g.kh, g.kw}, opts)
                : bmm(go, patches(x, g).transpose(1, 2)).view({g.cout, g.cg(), g.kh, g.kw});
  }
  if (needX) {
    Tensor gxp = zeros({g.n, g.cin, g.h + 2 * g.ph, g.w + 2 * g.pw}, opts);
    if (!none) {
      const Tensor dcol = bmm(w.contiguous().view({g.groups, g.coutg(), k}).transpose(1, 2), go)
                              .view({g.groups, g.cg(), g.kh, g.kw, g.n, g.ho, g.wo});
      const int64_t wp = gxp.size(3), plane = gxp.size(2) * wp;
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          Tensor dst = gxp.asStrided({g.groups, g.cg(), g.n, g.ho, g.wo},
                                     {g.cg() * plane, plane, g.cin * plane, g.sh * wp, g.sw},
                                     gxp.storageOffset() + i * g.dh * wp + j * g.dw);
          dst.add_(dcol.select(2, i).select(2, j));
        }
    }
    r[0] = cropped(gxp, g.ph, g.pw, g.h, g.w);
  }
  if (needB) r[2] = gout.sum({0, 2, 3});
  return r;
}

std::pair<Tensor, Tensor> maxPoolByViews(const Tensor& x, const PoolGeom& g) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;
  const Tensor xp = padded(x, g.ph, g.pw, -std::numeric_limits<double>::infinity());
  return windows(xp, g).max(-1);
}

Tensor maxPoolBackwardByViews(const Tensor& gout, const Tensor& windowArgmax, const PoolGeom& g) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;
  Tensor gxp = zeros({g.planes, g.h + 2 * g.ph, g.w + 2 * g.pw}, {.dtype = gout.dtype(), .device = gout.device()});
  const Tensor zero = zeros({}, {.dtype = gout.dtype(), .device = gout.device()});
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      const Tensor here = eq(windowArgmax, scalarTensor(i * g.kw + j).to(windowArgmax.device()));
      addAtOffset(gxp, where(here, gout, zero), g, i, j);
    }
  return cropped(gxp, g.ph, g.pw, g.h, g.w);
}

Tensor avgPoolByViews(const Tensor& x, const PoolGeom& g) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;
  const Tensor xp = padded(x, g.ph, g.pw, 0.0);
  return windows(xp, g).sum({-1}) / avgDivisor(g, x.dtype(), x.device());
}

Tensor avgPoolBackwardByViews(const Tensor& gout, const PoolGeom& g) {
  autograd::NoGradGuard ng;
  amp::detail::ExcludeGuard noAutocast;
  Tensor gxp = zeros({g.planes, g.h + 2 * g.ph, g.w + 2 * g.pw}, {.dtype = gout.dtype(), .device = gout.device()});
  const Tensor v = gout / avgDivisor(g, gout.dtype(), gout.device());
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) addAtOffset(gxp, v, g, i, j);
  return cropped(gxp, g.ph, g.pw, g.h, g.w);
}

}  // namespace cohort::nn::functional::detail
