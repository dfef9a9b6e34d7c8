// Layer norm: the CPU kernels (rows summed in double on eight accumulators, half rows widened and
// narrowed a row at a time) and nn::functional::layerNorm with its backward.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/nn_checks.h>
#include <cohort/core/ops/detail/nn_dispatch.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/half.h>

namespace cohort::nn::functional {

using autograd::Ctx;
using op_checks::requireFloat;
using GradList = std::vector<Tensor>;

namespace {

// ---- layer norm -------------------------------------------------------------------------------

// Sum over j < n of f(j) in double, on eight independent accumulators: one chain of dependent
// adds runs at one add per 4 cycles, eight are what the compiler vectorizes. Float terms sum
// exactly in double unless their exponents span more than 29 bits, so the order rarely shows in
// a float32 result.
template <typename F>
inline double sumDouble8(int64_t n, F&& f) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(j + k);
  for (int k = 0; j < n; ++j, ++k) acc[k] += f(j);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Rows of a T buffer as the compute type C: float32 and float64 rows are read in place; half rows
// are widened into a buffer with the vectorized bulk conversions (a row at a time, so it stays in
// L1), and half results are narrowed back the same way.
template <typename T>
class LayerNormRows {
 public:
  using C = Acc<T>;
  static constexpr bool kHalf = !std::is_same_v<T, C>;
  explicit LayerNormRows(int64_t n) : buf_(kHalf ? static_cast<size_t>(n) : 0) {}
  const C* read(const T* src, int64_t n) {
    if constexpr (kHalf) {
      widen(src, buf_.data(), n);
      return buf_.data();
    } else {
      return src;
    }
  }
  static void widen(const T* src, C* dst, int64_t n) {
    if constexpr (kHalf) halfTypeToFloatN(src, dst, n);
    else std::copy(src, src + n, dst);
  }
  static void narrow(const C* src, T* dst, int64_t n) {
    if constexpr (kHalf) floatToHalfTypeN(src, dst, n);
    else std::copy(src, src + n, dst);
  }

 private:
  std::vector<C> buf_;
};

// A weight or bias vector in the compute type (null stays null).
template <typename T>
std::vector<Acc<T>> widenVector(const T* v, int64_t n) {
  std::vector<Acc<T>> out(v ? static_cast<size_t>(n) : 0);
  if (v) LayerNormRows<T>::widen(v, out.data(), n);
  return out;
}

// Mean and variance in double (two passes), the normalised row in C, every loop vectorized.
template <typename T>
void layerNormForward(const T* x, const T* w, const T* b, T* y, Acc<T>* meanOut, Acc<T>* rstdOut, int64_t M, int64_t N,
                      double eps) {
  using C = Acc<T>;
  const std::vector<C> wv = widenVector(w, N), bv = widenVector(b, N);
  const C* wc = w ? wv.data() : nullptr;
  const C* bc = b ? bv.data() : nullptr;
  LayerNormRows<T> rows(N);
  std::vector<C> out(LayerNormRows<T>::kHalf ? static_cast<size_t>(N) : 0);
  for (int64_t m = 0; m < M; ++m) {
    const C* xr = rows.read(x + m * N, N);
    const double mu = sumDouble8(N, [&](int64_t j) { return static_cast<double>(xr[j]); }) / static_cast<double>(N);
    const double ss = sumDouble8(N, [&](int64_t j) {
      const double dv = static_cast<double>(xr[j]) - mu;
      return dv * dv;
    });
    const C rstd = static_cast<C>(1.0 / std::sqrt(ss / static_cast<double>(N) + eps));
    const C mc = static_cast<C>(mu);
    meanOut[m] = mc;
    rstdOut[m] = rstd;
    C* yr = LayerNormRows<T>::kHalf ? out.data() : reinterpret_cast<C*>(y + m * N);
    if (wc && bc) {
      for (int64_t j = 0; j < N; ++j) yr[j] = (xr[j] - mc) * rstd * wc[j] + bc[j];
    } else if (wc) {
      for (int64_t j = 0; j < N; ++j) yr[j] = (xr[j] - mc) * rstd * wc[j];
    } else if (bc) {
      for (int64_t j = 0; j < N; ++j) yr[j] = (xr[j] - mc) * rstd + bc[j];
    } else {
      for (int64_t j = 0; j < N; ++j) yr[j] = (xr[j] - mc) * rstd;
    }
    if constexpr (LayerNormRows<T>::kHalf) LayerNormRows<T>::narrow(yr, y + m * N, N);
  }
}

template <typename T>
void layerNormBackward(const T* x, const T* w, const T* g, const Acc<T>* mean, const Acc<T>* rstd, int64_t M, int64_t N,
                       T* dx, T* dw, T* db) {
  using C = Acc<T>;
  const std::vector<C> wv = widenVector(w, N);
  const C* wc = w ? wv.data() : nullptr;
  std::vector<double> dwAcc(dw ? static_cast<size_t>(N) : 0), dbAcc(db ? static_cast<size_t>(N) : 0);
  LayerNormRows<T> xRows(N), gRows(N);
  std::vector<C> xhat(static_cast<size_t>(N)), dy(static_cast<size_t>(N));
  std::vector<C> out(LayerNormRows<T>::kHalf && dx ? static_cast<size_t>(N) : 0);
  for (int64_t m = 0; m < M; ++m) {
    const C* xr = xRows.read(x + m * N, N);
    const C* gr = gRows.read(g + m * N, N);
    const C mu = mean[m], rs = rstd[m];
    for (int64_t j = 0; j < N; ++j) xhat[j] = (xr[j] - mu) * rs;
    if (wc) {
      for (int64_t j = 0; j < N; ++j) dy[j] = gr[j] * wc[j];
    } else {
      std::copy(gr, gr + N, dy.begin());
    }
    if (dw)
      for (int64_t j = 0; j < N; ++j) dwAcc[j] += static_cast<double>(gr[j] * xhat[j]);
    if (db)
      for (int64_t j = 0; j < N; ++j) dbAcc[j] += static_cast<double>(gr[j]);
    if (dx) {
      const double a = sumDouble8(N, [&](int64_t j) { return static_cast<double>(dy[j]); });
      const double bsum = sumDouble8(N, [&](int64_t j) { return static_cast<double>(dy[j] * xhat[j]); });
      const C am = static_cast<C>(a / static_cast<double>(N)), bm = static_cast<C>(bsum / static_cast<double>(N));
      C* dr = LayerNormRows<T>::kHalf ? out.data() : reinterpret_cast<C*>(dx + m * N);
      for (int64_t j = 0; j < N; ++j) dr[j] = rs * (dy[j] - am - xhat[j] * bm);
      if constexpr (LayerNormRows<T>::kHalf) LayerNormRows<T>::narrow(dr, dx + m * N, N);
    }
  }
  for (int64_t j = 0; j < (dw ? N : 0); ++j) dw[j] = static_cast<T>(dwAcc[j]);
  for (int64_t j = 0; j < (db ? N : 0); ++j) db[j] = static_cast<T>(dbAcc[j]);
}

}  // namespace

Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight, const Tensor& bias, double eps) {
  COHORT_RECORD_OP("layerNorm", x, normalizedShape, weight, bias, eps);
  COHORT_AUTOCAST("layerNorm", layerNorm, x, normalizedShape, weight, bias, eps);
  const char* op = "layerNorm";
  requireFloat(x, op, "the input");
  const int64_t k = static_cast<int64_t>(normalizedShape.size());
  bool ok = k >= 1 && x.dim() >= k;
  for (int64_t j = 0; ok && j < k; ++j) ok = x.sizes()[x.dim() - k + j] == normalizedShape[j];
  if (!ok)
    throw ValueError(fmt::format("{}: normalizedShape {} must be non-empty and match the trailing dims of the input {}",
                                 op, shapeStr(normalizedShape), shapeStr(x.sizes())));
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    const char* what = t == &weight ? "weight" : "bias";
    if (t->sizes() != normalizedShape)
      throw ValueError(fmt::format("{}: {} has shape {} but normalizedShape is {}", op, what, shapeStr(t->sizes()),
                                   shapeStr(normalizedShape)));
    if (t->dtype() != x.dtype())
      throw ValueError(fmt::format("{}: {} is {} but the input is {}", op, what, t->dtype(), x.dtype()));
  }
  const int64_t N = shapeNumel(normalizedShape);
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  Tensor xc = x.contiguous();
  Tensor wc = weight.defined() ? weight.contiguous() : Tensor();
  Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  const DType statType = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  Tensor y = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  Tensor meanT = empty({M}, {.dtype = statType, .device = x.device()});
  Tensor rstdT = empty({M}, {.dtype = statType, .device = x.device()});
  dispatch::kernel<cohort::detail::LayerNormKernel>(op, x.device())(y, meanT, rstdT, xc, wc, bc, M, N, eps);
  autograd::record(op, {x, weight, bias}, {y}, {x, weight, meanT, rstdT},
                   [M, N, normShape = normalizedShape, hasW = weight.defined(),
                    hasB = bias.defined()](Ctx& ctx, const GradList& g) -> GradList {
                     Tensor xs = ctx.saved(0).contiguous(), ws = hasW ? ctx.saved(1).contiguous() : Tensor();
                     Tensor ms = ctx.saved(2), rs = ctx.saved(3);
                     Tensor gc = g[0].contiguous();
                     GradList r(3);
                     const TensorOptions like{.dtype = xs.dtype(), .device = xs.device()};
                     if (ctx.needsInputGrad(0)) r[0] = empty(xs.sizes(), like);
                     if (hasW && ctx.needsInputGrad(1)) r[1] = empty(ws.sizes(), like);
                     if (hasB && ctx.needsInputGrad(2)) r[2] = empty(normShape, like);
                     dispatch::kernel<cohort::detail::LayerNormBackwardKernel>("layerNorm backward",
                                                                               xs.device())(r[0], r[1], r[2], xs, ws,
                                                                                            gc, ms, rs, M, N);
                     return r;
                   });
  return y;
}

namespace {

// The CPU's layer norm kernels (nn_dispatch.h's signatures).
void layerNormCpu(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b, int64_t M,
                  int64_t N, double eps) {
  COHORT_DISPATCH_FLOAT(x.dtype(), "layerNorm", [&]<typename T>() {
    layerNormForward<T>(x.data<T>(), w.defined() ? w.data<T>() : nullptr, b.defined() ? b.data<T>() : nullptr,
                        y.data<T>(), mean.data<Acc<T>>(), rstd.data<Acc<T>>(), M, N, eps);
  });
}

void layerNormBackwardCpu(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& x, const Tensor& w, const Tensor& g,
                          const Tensor& mean, const Tensor& rstd, int64_t M, int64_t N) {
  COHORT_DISPATCH_FLOAT(x.dtype(), "layerNorm backward", [&]<typename T>() {
    layerNormBackward<T>(x.data<T>(), w.defined() ? w.data<T>() : nullptr, g.data<T>(), mean.data<Acc<T>>(),
                         rstd.data<Acc<T>>(), M, N, dx.defined() ? dx.data<T>() : nullptr,
                         dw.defined() ? dw.data<T>() : nullptr, db.defined() ? db.data<T>() : nullptr);
  });
}

const dispatch::Register<cohort::detail::LayerNormKernel> kLayerNormCpu{"layerNorm", DeviceType::CPU, &layerNormCpu};
const dispatch::Register<cohort::detail::LayerNormBackwardKernel> kLayerNormBackwardCpu{"layerNorm backward",
                                                                                        DeviceType::CPU,
                                                                                        &layerNormBackwardCpu};

}  // namespace

}  // namespace cohort::nn::functional
