// Neural-network functions: softmax, log_softmax, nll / cross-entropy / mse losses, embedding and
// dropout (layer norm is in layer_norm.cc). Kernels work on contiguous [outer, n, inner] slabs (the layout
// detail::planReduce gives for one dim) and compute in Acc<T> (float for half types); row
// statistics (max, sums, means) accumulate in double where cancellation matters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/index_dispatch.h>
#include <cohort/core/ops/detail/nn_checks.h>
#include <cohort/core/ops/detail/nn_dispatch.h>
#include <cohort/core/ops/detail/reduce_dispatch.h>
#include <cohort/core/ops/detail/reduce_impl.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/generator.h>
#include <cohort/core/util/parallel.h>

namespace cohort {

Tensor Tensor::softmax(int64_t d) const { return nn::functional::softmax(*this, d); }
Tensor Tensor::logSoftmax(int64_t d) const { return nn::functional::logSoftmax(*this, d); }

namespace nn::functional {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

using op_checks::requireDefined;
using op_checks::requireFloat;

namespace {

// ---- softmax / log_softmax ------------------------------------------------------------------

// y[o, :, i] = softmax or log_softmax of x[o, :, i]; x and y contiguous [O, R, I].
// Float32 rows along the last dim (I == 1, attention and classifier logits) take a fused row pass:
// the max with 64 select lanes (GCC vectorizes that width, not 16), then one loop that computes
// e = exp(x - max) with the vectorizable vecmath::exp, stores it (log_softmax stores x - max) and
// sums it in 32 lanes, then a scale (or shift) of the row while it is still in L1. Lane sums are
// combined in double. While a row is computed the next one is prefetched, so its read from memory
// overlaps the exp work instead of stalling the next max pass.
constexpr int64_t kSoftmaxMaxLanes = 64;
constexpr int64_t kSoftmaxSumLanes = 32;

// Max of n floats; a NaN anywhere gives NaN.
inline float rowMaxF32(const float* x, int64_t n) {
  constexpr int64_t L = kSoftmaxMaxLanes;
  float m[L];
  for (int64_t j = 0; j < L; ++j) m[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t j = 0; j < L; ++j) {
      const float v = x[i + j];
      m[j] = ((v > m[j]) | (v != v)) ? v : m[j];
    }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) mx = ((m[j] > mx) | (m[j] != m[j])) ? m[j] : mx;
  for (; i < n; ++i) mx = ((x[i] > mx) | (x[i] != x[i])) ? x[i] : mx;
  return mx;
}

template <bool Log>
void softmaxRowsF32(const float* x, float* y, int64_t O, int64_t R) {
  constexpr int64_t L = kSoftmaxSumLanes;
  for (int64_t o = 0; o < O; ++o) {
    const float* xr = x + o * R;
    float* yr = y + o * R;
    float mx = rowMaxF32(xr, R);
    // A row of -inf keeps max -inf; shift by 0 then so that exp gives 0 and the result NaN, as torch.
    if (std::isinf(mx) && mx < 0) mx = 0.0f;
    const float* next = o + 1 < O ? xr + R : xr;  // prefetch target (the next row, or this one again)
    float acc[L] = {};
    int64_t i = 0;
    for (; i + L <= R; i += L) {
      __builtin_prefetch(next + i);
      __builtin_prefetch(next + i + 16);
      for (int64_t j = 0; j < L; ++j) {
        const float d = xr[i + j] - mx;
        const float e = vecmath::exp(d);
        yr[i + j] = Log ? d : e;
        acc[j] += e;
      }
    }
    double total = 0;
    for (int64_t j = 0; j < L; ++j) total += static_cast<double>(acc[j]);
    for (; i < R; ++i) {
      const float d = xr[i] - mx;
      const float e = vecmath::exp(d);
      yr[i] = Log ? d : e;
      total += static_cast<double>(e);
    }
    if constexpr (Log) {
      // (x - max) - log(sum): subtracting max first keeps the float rounding of a huge lse out.
      const float ls = static_cast<float>(std::log(total));
      for (int64_t k = 0; k < R; ++k) yr[k] -= ls;
    } else {
      const float inv = static_cast<float>(1.0 / total);
      for (int64_t k = 0; k < R; ++k) yr[k] *= inv;
    }
  }
}

// Backward of softmaxRowsF32: softmax dx = y * (g - sum(g * y)); log_softmax dx = g - exp(y) * sum(g).
template <bool Log>
void softmaxRowsBackwardF32(const float* y, const float* g, float* dx, int64_t O, int64_t R) {
  constexpr int64_t L = 16;
  for (int64_t o = 0; o < O; ++o) {
    const float* yr = y + o * R;
    const float* gr = g + o * R;
    float* dr = dx + o * R;
    float acc[L] = {};
    int64_t i = 0;
    for (; i + L <= R; i += L)
      for (int64_t j = 0; j < L; ++j) acc[j] += Log ? gr[i + j] : gr[i + j] * yr[i + j];
    double total = 0;
    for (int64_t j = 0; j < L; ++j) total += static_cast<double>(acc[j]);
    for (; i < R; ++i) total += static_cast<double>(Log ? gr[i] : gr[i] * yr[i]);
    const float t = static_cast<float>(total);
    if constexpr (Log) {
      for (int64_t k = 0; k < R; ++k) dr[k] = gr[k] - vecmath::exp(yr[k]) * t;
    } else {
      for (int64_t k = 0; k < R; ++k) dr[k] = yr[k] * (gr[k] - t);
    }
  }
}

template <typename T, bool Log>
void softmaxKernel(const T* x, T* y, int64_t O, int64_t R, int64_t I) {
  using C = Acc<T>;
  std::vector<C> mx(static_cast<size_t>(I)), s(static_cast<size_t>(I));
  std::vector<C> e(Log ? 0 : static_cast<size_t>(R * I));
  for (int64_t o = 0; o < O; ++o) {
    const T* xb = x + o * R * I;
    T* yb = y + o * R * I;
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<C>::infinity());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        C v = static_cast<C>(xb[r * I + i]);
        mx[i] = (v > mx[i] || v != v) ? v : mx[i];
      }
    // A row of -inf keeps max -inf; shift by 0 then so that exp gives 0 and the result NaN, as torch.
    for (int64_t i = 0; i < I; ++i)
      if (std::isinf(mx[i])) mx[i] = mx[i] > 0 ? mx[i] : C(0);
    std::fill(s.begin(), s.end(), C(0));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        C ev = std::exp(static_cast<C>(xb[r * I + i]) - mx[i]);
        if constexpr (!Log) e[r * I + i] = ev;
        s[i] += ev;
      }
    if constexpr (Log) {
      // (x - max) - log(sum): subtracting max first keeps the float rounding of a huge lse out.
      for (int64_t i = 0; i < I; ++i) s[i] = std::log(s[i]);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < I; ++i) yb[r * I + i] = static_cast<T>((static_cast<C>(xb[r * I + i]) - mx[i]) - s[i]);
    } else {
      for (int64_t i = 0; i < I; ++i) s[i] = C(1) / s[i];
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < I; ++i) yb[r * I + i] = static_cast<T>(e[r * I + i] * s[i]);
    }
  }
}

// softmax: dx = y * (g - sum(g * y));  log_softmax: dx = g - exp(y) * sum(g).
template <typename T, bool Log>
void softmaxBackwardKernel(const T* y, const T* g, T* dx, int64_t O, int64_t R, int64_t I) {
  using C = Acc<T>;
  std::vector<double> s(static_cast<size_t>(I));
  for (int64_t o = 0; o < O; ++o) {
    const int64_t base = o * R * I;
    std::fill(s.begin(), s.end(), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = base + r * I + i;
        C gv = static_cast<C>(g[k]);
        s[i] += Log ? static_cast<double>(gv) : static_cast<double>(gv * static_cast<C>(y[k]));
      }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t k = base + r * I + i;
        C yv = static_cast<C>(y[k]), gv = static_cast<C>(g[k]), sv = static_cast<C>(s[i]);
        dx[k] = static_cast<T>(Log ? gv - std::exp(yv) * sv : yv * (gv - sv));
      }
  }
}

// The CPU's softmax kernels (nn_dispatch.h's signatures).
template <bool Log>
void softmaxCpu(Tensor& y, const Tensor& src, int64_t O, int64_t R, int64_t I) {
  COHORT_DISPATCH_FLOAT(y.dtype(), Log ? "logSoftmax" : "softmax", [&]<typename T>() {
    if (y.numel() == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (I == 1) return softmaxRowsF32<Log>(src.data<float>(), y.data<float>(), O, R);
    }
    softmaxKernel<T, Log>(src.data<T>(), y.data<T>(), O, R, I);
  });
}

template <bool Log>
void softmaxBackwardCpu(Tensor& dx, const Tensor& y, const Tensor& g, int64_t O, int64_t R, int64_t I) {
  COHORT_DISPATCH_FLOAT(y.dtype(), Log ? "logSoftmax backward" : "softmax backward", [&]<typename T>() {
    if (dx.numel() == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (I == 1) return softmaxRowsBackwardF32<Log>(y.data<float>(), g.data<float>(), dx.data<float>(), O, R);
    }
    softmaxBackwardKernel<T, Log>(y.data<T>(), g.data<T>(), dx.data<T>(), O, R, I);
  });
}

template <bool Log>
Tensor softmaxImpl(const Tensor& x, int64_t dim, const char* op) {
  requireFloat(x, op, "the input");
  detail::ReducePlan p = detail::planReduce(x, {dim}, true, op);
  const int64_t O = p.outer, R = p.reduced, I = p.inner;
  Tensor y = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  dispatch::kernel<cohort::detail::SoftmaxKernel>(op, x.device())(y, p.src, O, R, I);
  autograd::record(op, {x}, {y}, {y}, [O, R, I](Ctx& ctx, const GradList& g) -> GradList {
    Tensor yv = ctx.saved(0);
    Tensor gc = g[0].contiguous();
    Tensor dx = empty(yv.sizes(), {.dtype = yv.dtype(), .device = yv.device()});
    dispatch::kernel<cohort::detail::SoftmaxBackwardKernel>(Log ? "logSoftmax backward" : "softmax backward",
                                                            yv.device())(dx, yv, gc, O, R, I);
    return {dx};
  });
  return y;
}

// ---- nll ----------------------------------------------------------------------------------------

struct NllLayout {
  int64_t n = 1, c = 1, d = 1;  // input viewed as [n, c, d]
  int64_t classDim = 1;
};

// Checks the input/target shapes and dtypes of a class-index loss.
NllLayout nllLayout(const Tensor& input, const Tensor& target, const char* op) {
  requireFloat(input, op, "the input");
  requireDefined(target, op, "the target");
  if (target.dtype() != DType::Int64 && target.dtype() != DType::Int32)
    throw ValueError(fmt::format("{}: the target must hold int64 class indices, got {} of shape {} (input shape {})",
                                 op, target.dtype(), shapeStr(target.sizes()), shapeStr(input.sizes())));
  NllLayout l;
  const Shape& is = input.sizes();
  const Shape& ts = target.sizes();
  bool ok;
  if (input.dim() == 1) {  // unbatched: input [C], target []
    l.classDim = 0;
    l.c = is[0];
    ok = target.dim() == 0;
  } else if (input.dim() >= 2) {
    l.n = is[0];
    l.c = is[1];
    ok = target.dim() == input.dim() - 1 && ts[0] == is[0];
    for (int64_t k = 2; ok && k < input.dim(); ++k) {
      ok = ts[k - 1] == is[k];
      l.d *= is[k];
    }
  } else {
    ok = false;
  }
  if (!ok)
    throw ValueError(fmt::format("{}: expected input [N, C] or [N, C, d1, ...] (or [C]) and target [N] or "
                                 "[N, d1, ...] (or []), got input {} and target {}",
                                 op, shapeStr(is), shapeStr(ts)));
  return l;
}

// Per-position -input[n, t, d] (0 where ignored); `valid` gets 1/0 per position.
template <typename T, typename I>
void nllForward(const T* x, const I* t, const NllLayout& l, int64_t ignoreIndex, T* loss, std::vector<uint8_t>& valid,
                const Tensor& input, const Tensor& target, const char* op) {
  for (int64_t n = 0; n < l.n; ++n)
    for (int64_t d = 0; d < l.d; ++d) {
      const int64_t k = n * l.d + d;
      const int64_t label = static_cast<int64_t>(t[k]);
      if (label == ignoreIndex) {
        loss[k] = T(0.0f);
        valid[k] = 0;
        continue;
      }
      if (label < 0 || label >= l.c)
        throw IndexError(fmt::format("{}: target label {} is out of range for {} classes (input shape {}, target shape "
                                     "{})",
                                     op, label, l.c, shapeStr(input.sizes()), shapeStr(target.sizes())));
      loss[k] = static_cast<T>(-static_cast<Acc<T>>(x[(n * l.c + label) * l.d + d]));
      valid[k] = 1;
    }
}

// The CPU's nll kernels (nn_dispatch.h's signatures).
int64_t nllForwardCpu(Tensor& perPos, Tensor& validMask, const Tensor& x, const Tensor& t, int64_t n, int64_t c,
                      int64_t d, int64_t ignoreIndex, const char* op) {
  NllLayout l;
  l.n = n;
  l.c = c;
  l.d = d;
  std::vector<uint8_t> valid(static_cast<size_t>(n * d));
  COHORT_DISPATCH_FLOAT(x.dtype(), op, [&]<typename T>() {
    COHORT_DISPATCH_INDEX(t.dtype(), op, [&]<typename Ix>() {
      nllForward<T, Ix>(x.data<T>(), t.data<Ix>(), l, ignoreIndex, perPos.data<T>(), valid, x, t, op);
    });
    if (validMask.defined()) {
      T* m = validMask.data<T>();
      for (size_t k = 0; k < valid.size(); ++k) m[k] = T(valid[k] ? 1.0f : 0.0f);
    }
  });
  int64_t count = 0;
  for (uint8_t v : valid) count += v;
  return count;
}

void nllBackwardCpu(Tensor& dx, const Tensor& target, const Tensor& grad, int64_t n, int64_t c, int64_t d,
                    int64_t ignoreIndex, double scale, bool perPosition) {
  if (dx.numel() > 0) std::memset(dx.dataPtr(), 0, dx.nbytes());
  COHORT_DISPATCH_FLOAT(grad.dtype(), "nllLoss backward", [&]<typename T>() {
    COHORT_DISPATCH_INDEX(target.dtype(), "nllLoss backward", [&]<typename Ix>() {
      const T* gp = grad.data<T>();
      const Ix* tp = target.data<Ix>();
      T* out = dx.data<T>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t k = i * d + j;
          const int64_t label = static_cast<int64_t>(tp[k]);
          if (label == ignoreIndex) continue;
          const double gv = static_cast<double>(static_cast<Acc<T>>(gp[perPosition ? k : 0]));
          out[(i * c + label) * d + j] = static_cast<T>(-gv * scale);
        }
    });
  });
}

// The class-index loss: per-position losses and their count from the device's kernel, reduced by
// the "mean" reduction (sum, or Mean's 1 / the number of non-ignored targets: 0 * inf = NaN when
// every target is ignored, as torch). `validMask` gets 1/0 per position in the input's dtype.
Tensor nllImpl(const Tensor& input, const Tensor& target, Reduction reduction, int64_t ignoreIndex, const char* op,
               Tensor* validMask = nullptr, int64_t* validCount = nullptr) {
  const NllLayout l = nllLayout(input, target, op);
  const Tensor x = input.contiguous();
  const Tensor t = target.contiguous();
  const Device dev = input.device();
  Tensor perPos = empty(t.sizes(), {.dtype = input.dtype(), .device = dev});
  Tensor valid = validMask ? empty(t.sizes(), {.dtype = input.dtype(), .device = dev}) : Tensor();
  const int64_t count = dispatch::kernel<cohort::detail::NllForwardKernel>("nllLoss", dev)(perPos, valid, x, t, l.n,
                                                                                           l.c, l.d, ignoreIndex, op);
  if (validMask) *validMask = valid;
  if (validCount) *validCount = count;
  Tensor out = perPos;
  if (reduction != Reduction::None) {
    const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(count) : 1.0;
    out = empty({}, {.dtype = input.dtype(), .device = dev});
    dispatch::kernel<cohort::detail::PlannedReduceKernel>("mean", dev)(out, perPos.reshape({perPos.numel()}), 1,
                                                                       perPos.numel(), 1, scale);
  }
  Shape inShape = input.sizes();
  autograd::record(op, {input}, {out}, {t},
                   [l, reduction, count, ignoreIndex, inShape](Ctx& ctx, const GradList& g) -> GradList {
                     Tensor tt = ctx.saved(0);
                     Tensor gc = g[0].contiguous();
                     Tensor dx = empty(inShape, {.dtype = gc.dtype(), .device = gc.device()});
                     const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(count) : 1.0;
                     dispatch::kernel<cohort::detail::NllBackwardKernel>("nllLoss backward",
                                                                         gc.device())(dx, tt, gc, l.n, l.c, l.d,
                                                                                      ignoreIndex, scale,
                                                                                      reduction == Reduction::None);
                     return {dx};
                   });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  COHORT_RECORD_OP("softmax", x, dim);
  COHORT_AUTOCAST("softmax", softmax, x, dim);
  return softmaxImpl<false>(x, dim, "softmax");
}
Tensor logSoftmax(const Tensor& x, int64_t dim) {
  COHORT_RECORD_OP("logSoftmax", x, dim);
  COHORT_AUTOCAST("logSoftmax", logSoftmax, x, dim);
  return softmaxImpl<true>(x, dim, "logSoftmax");
}

Tensor nllLoss(const Tensor& input, const Tensor& target, Reduction reduction, int64_t ignoreIndex) {
  COHORT_RECORD_OP("nllLoss", input, target, reduction, ignoreIndex);
  COHORT_AUTOCAST("nllLoss", nllLoss, input, target, reduction, ignoreIndex);
  return nllImpl(input, target, reduction, ignoreIndex, "nllLoss");
}

Tensor crossEntropy(const Tensor& input, const Tensor& target, CrossEntropyOptions opts) {
  COHORT_RECORD_OP("crossEntropy", input, target, opts);
  COHORT_AUTOCAST("crossEntropy", crossEntropy, input, target, opts);
  const char* op = "crossEntropy";
  requireFloat(input, op, "the input");
  requireDefined(target, op, "the target");
  if (!(opts.labelSmoothing >= 0.0 && opts.labelSmoothing <= 1.0))
    throw ValueError(fmt::format("{}: labelSmoothing must be in [0, 1], got {} (input shape {})", op,
                                 opts.labelSmoothing, shapeStr(input.sizes())));
  nllLayout(input, target, op);  // shape and dtype errors name crossEntropy before any work
  const int64_t classDim = input.dim() == 1 ? 0 : 1;
  Tensor logp = logSoftmax(input, classDim);
  if (opts.labelSmoothing == 0.0) return nllImpl(logp, target, opts.reduction, opts.ignoreIndex, op);
  // torch's label smoothing: (1 - e) * nll + e / C * smooth, where smooth = -sum_c logp over
  // non-ignored positions, reduced like nll (Mean divides by the non-ignored count).
  Tensor valid;
  int64_t validCount = 0;
  Tensor nll = nllImpl(logp, target, opts.reduction, opts.ignoreIndex, op, &valid, &validCount);
  const double e = opts.labelSmoothing;
  const double nClasses = static_cast<double>(input.sizes()[classDim]);
  Tensor smooth = -(sum(logp, {classDim}) * valid);
  if (opts.reduction == Reduction::Sum) {
    smooth = sum(smooth);
  } else if (opts.reduction == Reduction::Mean) {
    // The count the nll kernel brought back (no second wait for a device).
    smooth = sum(smooth) / static_cast<double>(validCount);
  }
  return nll * (1.0 - e) + smooth * (e / nClasses);
}

namespace {

// One pass over x and t: d = scale * (x - t) (the gradient of the loss for a unit output
// gradient) and sum((x - t)^2), in fixed blocks (the same result for any thread count), each
// block summed in double with several accumulators so the loop is not one long add chain.
template <typename T>
double squaredDiffAndGrad(const T* x, const T* t, T* d, int64_t n, double scale) {
  constexpr int64_t kBlock = 16384;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const T k = static_cast<T>(scale);
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallelFor(blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = lo;
      for (; i + 8 <= hi; i += 8)
        for (int j = 0; j < 8; ++j) {
          T diff = x[i + j] - t[i + j];
          d[i + j] = k * diff;
          acc[j] += static_cast<double>(diff) * static_cast<double>(diff);
        }
      for (; i < hi; ++i) {
        T diff = x[i] - t[i];
        d[i] = k * diff;
        acc[0] += static_cast<double>(diff) * static_cast<double>(diff);
      }
      partial[static_cast<size_t>(b)] =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  });
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

// A fused mseLoss for same-shaped float32/float64 operands with a mean or sum, registered under
// "mseLoss" by a device that has one (the CPU); elsewhere the op is a composite of other ops.
using MseLossKernel = Tensor(const Tensor& input, const Tensor& target, Reduction reduction);

// mseLoss with a mean or sum over same-shaped float32/float64 tensors. The forward is one pass
// that also writes the loss's gradient for a unit output gradient, which backward keeps instead
// of the input and target: backward is then free for the usual unit gradient, one scaling pass
// otherwise (the composite takes three passes forward and five back).
Tensor fusedMseLoss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const Tensor x = input.contiguous(), t = target.contiguous();
  const int64_t n = x.numel();
  const bool mean = reduction == Reduction::Mean;
  const double scale = 2.0 / (mean ? static_cast<double>(n) : 1.0);
  const bool needsGrad = autograd::needsGrad({&input, &target});
  Tensor d = needsGrad ? empty(x.sizes(), {.dtype = x.dtype()}) : Tensor();
  double total;
  if (needsGrad) {
    total = x.dtype() == DType::Float32
                ? squaredDiffAndGrad(x.data<float>(), t.data<float>(), d.data<float>(), n, scale)
                : squaredDiffAndGrad(x.data<double>(), t.data<double>(), d.data<double>(), n, scale);
  } else {
    Tensor diff = x - t;
    total = diff.mul(diff).sum().itemDouble();
  }
  Tensor out = full({}, mean ? total / static_cast<double>(n) : total, {.dtype = x.dtype()});
  autograd::record("mseLoss", {input, target}, {out}, {d}, [](Ctx& ctx, const GradList& g) -> GradList {
    Tensor unit = ctx.saved(0);
    const double go = g[0].itemDouble();
    Tensor grad = go == 1.0 ? unit : unit.mul(full({}, go, {.dtype = unit.dtype()}));
    GradList r(2);
    if (ctx.needsInputGrad(1)) r[1] = grad.neg();
    if (ctx.needsInputGrad(0)) r[0] = grad;
    return r;
  });
  return out;
}

}  // namespace

Tensor mseLoss(const Tensor& input, const Tensor& target, Reduction reduction) {
  COHORT_RECORD_OP("mseLoss", input, target, reduction);
  COHORT_AUTOCAST("mseLoss", mseLoss, input, target, reduction);
  requireFloat(input, "mseLoss", "the input");
  requireFloat(target, "mseLoss", "the target");
  broadcastShapes(input.sizes(), target.sizes(), "mseLoss");
  // A device with a fused kernel for the common case runs it; the composite below otherwise.
  if (input.device() == target.device() && reduction != Reduction::None && input.sizes() == target.sizes() &&
      input.dtype() == target.dtype() && (input.dtype() == DType::Float32 || input.dtype() == DType::Float64) &&
      input.numel() > 0)
    if (auto* fused = dispatch::find<MseLossKernel>("mseLoss", input.device())) return fused(input, target, reduction);
  Tensor d = input - target;
  Tensor sq = d * d;
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    case Reduction::Mean: return mean(sq);
  }
  return sq;
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  COHORT_RECORD_OP("embedding", indices, weight);
  const char* op = "embedding";
  requireDefined(indices, op, "the indices");
  requireDefined(weight, op, "the weight");
  if (weight.dim() != 2)
    throw ValueError(fmt::format("{}: the weight must be 2-D [num, dim], got shape {}", op, shapeStr(weight.sizes())));
  if (indices.dtype() != DType::Int64 && indices.dtype() != DType::Int32)
    throw ValueError(fmt::format("{}: indices must be int64 or int32, got {} of shape {}", op, indices.dtype(),
                                 shapeStr(indices.sizes())));
  Tensor idx = indices.contiguous();
  Tensor out = dispatch::kernel<dispatch::EmbeddingKernel>(op, weight.device())(idx, weight);
  Shape wShape = weight.sizes();
  autograd::record(op, {indices, weight}, {out}, {idx}, [wShape](Ctx& ctx, const GradList& g) -> GradList {
    // Rows scatter-add into the weight gradient (repeated indices accumulate).
    Tensor ix = ctx.saved(0);
    Tensor gc = g[0].contiguous();
    return {Tensor(),
            dispatch::kernel<dispatch::EmbeddingBackwardKernel>("embedding backward", gc.device())(ix, gc, wShape)};
  });
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  COHORT_RECORD_OP("dropout", x, p, training, gen);
  const char* op = "dropout";
  requireFloat(x, op, "the input");
  if (!(p >= 0.0 && p <= 1.0))
    throw ValueError(
        fmt::format("{}: probability p must be in [0, 1], got {} (input shape {})", op, p, shapeStr(x.sizes())));
  if (!training || p == 0.0) return x;
  if (p == 1.0) return x * 0.0;
  Generator& g = gen ? *gen : defaultGenerator();
  const int64_t n = x.numel();
  // The mask holds 0 or 1/(1-p) in x's dtype; x * mask is then differentiable through mul.
  Tensor mask = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  const uint64_t c = g.reserve(static_cast<uint64_t>((n + 3) / 4));
  const uint64_t seed = g.seed();
  // Every device draws the same Philox blocks from the same generator: the same mask.
  dispatch::kernel<dispatch::DropoutMaskKernel>(op, x.device())(mask, seed, c, p);
  return x * mask;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

Tensor embeddingCpu(const Tensor& idx, const Tensor& weight) {
  const char* op = "embedding";
  const int64_t num = weight.sizes()[0], dim = weight.sizes()[1];
  const Tensor w = weight.contiguous();
  Shape outShape = idx.sizes();
  outShape.push_back(dim);
  Tensor out = empty(outShape, {.dtype = weight.dtype()});
  const int64_t n = idx.numel();
  COHORT_DISPATCH_INDEX(idx.dtype(), op, [&]<typename Ix>() {
    const Ix* ip = idx.data<Ix>();
    const char* src = static_cast<const char*>(w.dataPtr());
    char* dst = static_cast<char*>(out.dataPtr());
    const size_t rowBytes = static_cast<size_t>(dim) * w.elementSize();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = static_cast<int64_t>(ip[k]);
      if (i < 0 || i >= num)
        throw IndexError(fmt::format("{}: index {} is out of range for a weight of shape {} (indices shape {})", op, i,
                                     shapeStr(weight.sizes()), shapeStr(idx.sizes())));
      if (rowBytes) std::memcpy(dst + k * rowBytes, src + i * rowBytes, rowBytes);
    }
  });
  return out;
}

// Rows scatter-add into the weight gradient (repeated indices accumulate).
Tensor embeddingBackwardCpu(const Tensor& ix, const Tensor& gc, const Shape& wShape) {
  const int64_t n = ix.numel(), dim = wShape[1];
  Tensor gw = empty(wShape, {.dtype = gc.dtype()});
  COHORT_DISPATCH_FLOAT(gc.dtype(), "embedding backward", [&]<typename T>() {
    using C = Acc<T>;
    std::vector<C> acc(static_cast<size_t>(wShape[0] * dim), C(0));
    const T* gp = gc.data<T>();
    COHORT_DISPATCH_INDEX(ix.dtype(), "embedding backward", [&]<typename Ix>() {
      const Ix* ip = ix.data<Ix>();
      for (int64_t k = 0; k < n; ++k) {
        C* row = acc.data() + static_cast<int64_t>(ip[k]) * dim;
        const T* gr = gp + k * dim;
        for (int64_t j = 0; j < dim; ++j) row[j] += static_cast<C>(gr[j]);
      }
    });
    T* out = gw.data<T>();
    for (size_t k = 0; k < acc.size(); ++k) out[k] = static_cast<T>(acc[k]);
  });
  return gw;
}

void dropoutMaskCpu(Tensor& mask, uint64_t seed, uint64_t c, double p) {
  const int64_t n = mask.numel();
  const float keep = static_cast<float>(1.0 - p);
  COHORT_DISPATCH_FLOAT(mask.dtype(), "dropout", [&]<typename T>() {
    T* m = mask.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const T zero = static_cast<T>(0.0f);
    for (int64_t i = 0; i < n; i += 4) {
      auto w = Generator::philox(seed, c + static_cast<uint64_t>(i / 4));
      for (int64_t k = 0; k < 4 && i + k < n; ++k) m[i + k] = Generator::toUniformFloat(w[k]) < keep ? scale : zero;
    }
  });
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  using namespace cohort::detail;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<SoftmaxKernel>("softmax", kCpu, &softmaxCpu<false>);
  Register<SoftmaxKernel>("logSoftmax", kCpu, &softmaxCpu<true>);
  Register<SoftmaxBackwardKernel>("softmax backward", kCpu, &softmaxBackwardCpu<false>);
  Register<SoftmaxBackwardKernel>("logSoftmax backward", kCpu, &softmaxBackwardCpu<true>);
  Register<NllForwardKernel>("nllLoss", kCpu, &nllForwardCpu);
  Register<NllBackwardKernel>("nllLoss backward", kCpu, &nllBackwardCpu);
  Register<MseLossKernel>("mseLoss", kCpu, &fusedMseLoss);
  Register<EmbeddingKernel>("embedding", kCpu, &embeddingCpu);
  Register<EmbeddingBackwardKernel>("embedding backward", kCpu, &embeddingBackwardCpu);
  Register<DropoutMaskKernel>("dropout", kCpu, &dropoutMaskCpu);
  return true;
}();

}  // namespace

}  // namespace nn::functional
}  // namespace cohort
