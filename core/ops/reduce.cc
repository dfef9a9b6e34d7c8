// Reductions: sum, mean, amax/amin, max/min/argmax/argmin over a dim, var/std, norm.
//
// Every value reduction runs through one kernel (reduceKernel) driven by a small "op" policy:
//  - inner reductions (the reduced dims are the last ones, inner == 1) walk each row with 16
//    independent accumulator lanes, which the compiler turns into vector registers;
//  - outer reductions (inner > 1, e.g. summing a [N, C] gradient over N) add whole rows into a
//    tile of column accumulators (a plain vectorizable loop), and narrow rows (inner < 32) are
//    widened by treating m consecutive rows as one row of m*inner columns.
// Sums accumulate blocks in float (half types load as float) and combine blocks in double, so
// large float32 sums stay accurate.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/reduce_dispatch.h>
#include <cohort/core/ops/detail/reduce_impl.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

namespace detail {

namespace {

// Wraps and validates `dims` for a tensor of shape `sizes`: per-dim flags (one entry for 0-dim).
std::vector<bool> reducedDims(const Shape& sizes, const Shape& dims, const char* op) {
  int64_t nd = static_cast<int64_t>(sizes.size());
  int64_t n = std::max<int64_t>(nd, 1);
  std::vector<bool> flags(static_cast<size_t>(n), dims.empty());
  for (int64_t d : dims) {
    if (d < -n || d >= n)
      throw IndexError(fmt::format("{}: dim {} is out of range for a tensor of shape {} (expected [{}, {}])", op, d,
                                   shapeStr(sizes), -n, n - 1));
    int64_t w = d < 0 ? d + n : d;
    if (flags[static_cast<size_t>(w)])
      throw ValueError(fmt::format("{}: dim {} appears more than once in dims {} (input shape {})", op, w,
                                   shapeStr(dims), shapeStr(sizes)));
    flags[static_cast<size_t>(w)] = true;
  }
  return flags;
}

}  // namespace

ReducePlan planReduce(const Tensor& a, const Shape& dims, bool keepdim, const char* op) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  ReducePlan p;
  const Shape& sizes = a.sizes();
  const int64_t nd = a.dim();
  p.isReduced = reducedDims(sizes, dims, op);
  if (nd == 0) {  // a scalar reduces to itself
    p.src = a.contiguous();
    return p;
  }
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < nd; ++d) {
    if (p.isReduced[d]) {
      if (first < 0) first = d;
      last = d;
      p.keptShape.push_back(1);
      if (keepdim) p.outShape.push_back(1);
    } else {
      p.keptShape.push_back(sizes[d]);
      p.outShape.push_back(sizes[d]);
    }
  }
  // Reduced dims form one block when only size-1 kept dims sit between them.
  bool block = true;
  for (int64_t d = first; d <= last; ++d)
    if (!p.isReduced[d] && sizes[d] != 1) block = false;
  if (block) {
    p.src = a.contiguous();
    for (int64_t d = 0; d < first; ++d) p.outer *= sizes[d];
    for (int64_t d = first; d <= last; ++d) p.reduced *= sizes[d];
    for (int64_t d = last + 1; d < nd; ++d) p.inner *= sizes[d];
    return p;
  }
  // Kept dims first, reduced dims last, in one permuted copy.
  Shape perm;
  for (int64_t d = 0; d < nd; ++d)
    if (!p.isReduced[d]) perm.push_back(d);
  for (int64_t d = 0; d < nd; ++d)
    if (p.isReduced[d]) perm.push_back(d);
  p.src = a.permute(perm).contiguous();
  for (int64_t d = 0; d < nd; ++d) (p.isReduced[d] ? p.reduced : p.outer) *= sizes[d];
  return p;
}

void requireNonEmptyReduction(const ReducePlan& p, const Tensor& a, const Shape& dims, const char* op) {
  if (p.reduced == 0)
    throw ValueError(fmt::format("{}: cannot reduce over an empty dim (input shape {}, dims {}); the operation has no "
                                 "identity",
                                 op, shapeStr(a.sizes()), dims.empty() ? std::string("all") : shapeStr(dims)));
}

namespace {

// ---- the value-reduction kernel ------------------------------------------------------------
//
// An op policy provides:
//   using Acc;    lane accumulator;        Acc init(), Acc step(Acc acc, C x), Acc merge(Acc, Acc)
//   using Total;  cross-block accumulator; Total initTotal(), Total fold(Total, Acc), Total join(Total, Total)
//   Out finish(Total)
// where C = cohort::Acc<T> is the element's compute type.

// Reduces n <= kRowBlock contiguous elements with kLanes independent accumulators.
template <typename E, typename Op>
typename Op::Acc laneBlock(const E* x, int64_t n, const Op& op) {
  using A = typename Op::Acc;
  using C = typename Op::C;
  A lane[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lane[j] = op.init();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = op.step(lane[j], static_cast<C>(x[i + j]));
  A s = op.init();
  for (; i < n; ++i) s = op.step(s, static_cast<C>(x[i]));
  for (int64_t j = 0; j < kLanes; ++j) s = op.merge(s, lane[j]);
  return s;
}

template <typename T, typename Op>
typename Op::Total reduceRow(const T* x, int64_t n, const Op& op) {
  typename Op::Total total = op.initTotal();
  if (n < 2 * kLanes) {  // short rows: lane set-up would cost more than the work
    typename Op::Acc s = op.init();
    for (int64_t i = 0; i < n; ++i) s = op.step(s, static_cast<typename Op::C>(x[i]));
    return op.fold(total, s);
  }
  for (int64_t start = 0; start < n; start += kRowBlock) {
    const int64_t len = std::min(kRowBlock, n - start);
    if constexpr (kIsHalf<T>) {
      cohort::Acc<T> buf[kRowBlock];
      toCompute(x + start, buf, len);
      total = op.fold(total, laneBlock(buf, len, op));
    } else {
      total = op.fold(total, laneBlock(x + start, len, op));
    }
  }
  return total;
}

// res[c] = reduction over r < rows of base[r * rowStride + c], for c < width.
template <typename T, typename Op>
void reduceColumns(const T* base, int64_t rows, int64_t width, int64_t rowStride, typename Op::Total* res,
                   const Op& op) {
  using A = typename Op::Acc;
  using C = typename Op::C;
  A acc[kTile];
  cohort::Acc<T> buf[kIsHalf<T> ? kTile : 1];
  for (int64_t ts = 0; ts < width; ts += kTile) {
    const int64_t tw = std::min(kTile, width - ts);
    typename Op::Total* tot = res + ts;
    for (int64_t c = 0; c < tw; ++c) tot[c] = op.initTotal();
    for (int64_t rb = 0; rb < rows; rb += kRowsPerFold) {
      const int64_t re = std::min(rows, rb + kRowsPerFold);
      for (int64_t c = 0; c < tw; ++c) acc[c] = op.init();
      for (int64_t r = rb; r < re; ++r) {
        if constexpr (kIsHalf<T>) {
          toCompute(base + r * rowStride + ts, buf, tw);
          for (int64_t c = 0; c < tw; ++c) acc[c] = op.step(acc[c], buf[c]);
        } else {
          const T* row = base + r * rowStride + ts;
          for (int64_t c = 0; c < tw; ++c) acc[c] = op.step(acc[c], static_cast<C>(row[c]));
        }
      }
      for (int64_t c = 0; c < tw; ++c) tot[c] = op.fold(tot[c], acc[c]);
    }
  }
}

// out[o * inner + i] = finish(reduction over r of src[o, r, i]).
template <typename T, typename Out, typename Op>
void reduceKernel(const ReducePlan& p, Out* out, const Op& op) {
  using Tot = typename Op::Total;
  const T* x = static_cast<const T*>(p.src.dataPtr());
  const int64_t R = p.reduced, I = p.inner, O = p.outer;
  if (O * I == 0) return;
  if (I == 1) {
    for (int64_t o = 0; o < O; ++o) out[o] = op.finish(reduceRow(x + o * R, R, op));
    return;
  }
  // Narrow rows: m rows side by side make one row of about 1024 columns.
  const int64_t m = I < 256 ? std::max<int64_t>(1, std::min<int64_t>(1024 / I, R)) : 1;
  const int64_t superRows = R / m, leftover = R - superRows * m;
  // Arrays, not std::vector: Tot may be bool.
  std::unique_ptr<Tot[]> wide(new Tot[static_cast<size_t>(m * I)]), rest(new Tot[static_cast<size_t>(I)]);
  for (int64_t o = 0; o < O; ++o) {
    const T* base = x + o * R * I;
    reduceColumns(base, superRows, m * I, m * I, wide.get(), op);
    for (int64_t k = 1; k < m; ++k)
      for (int64_t i = 0; i < I; ++i) wide[i] = op.join(wide[i], wide[k * I + i]);
    if (leftover > 0) {
      reduceColumns(base + superRows * m * I, leftover, I, I, rest.get(), op);
      for (int64_t i = 0; i < I; ++i) wide[i] = op.join(wide[i], rest[i]);
    }
    for (int64_t i = 0; i < I; ++i) out[o * I + i] = op.finish(wide[i]);
  }
}

// ---- op policies ----------------------------------------------------------------------------

// Sum of map(x); Total is double for floating types (int64 for integers); finish scales.
template <typename T, typename Out, typename Map>
struct SumOp {
  using C = cohort::Acc<T>;
  using Acc = std::conditional_t<kIsFloat<T>, C, int64_t>;
  using Total = std::conditional_t<kIsFloat<T>, double, int64_t>;
  Map map;
  double scale = 1.0;  // mean: 1/count
  Acc init() const { return Acc(0); }
  Acc step(Acc a, C x) const { return a + static_cast<Acc>(map(x)); }
  Acc merge(Acc a, Acc b) const { return a + b; }
  Total initTotal() const { return Total(0); }
  Total fold(Total t, Acc a) const { return t + static_cast<Total>(a); }
  Total join(Total a, Total b) const { return a + b; }
  Out finish(Total t) const {
    if constexpr (kIsFloat<T>) return static_cast<Out>(t * scale);
    else return static_cast<Out>(t);
  }
};

struct Identity {
  template <typename X>
  X operator()(X x) const {
    return x;
  }
};

// Max (IsMax) or min of map(x); NaN propagates.
template <typename T, bool IsMax, typename Map>
struct ExtremeOp {
  using C = cohort::Acc<T>;
  using Acc = C;
  using Total = C;
  Map map;
  static Acc pick(Acc a, Acc x) {
    bool take = IsMax ? x > a : x < a;
    if constexpr (kIsFloat<T>) take = take | (x != x);  // bitwise: keeps the select branch-free
    return take ? x : a;
  }
  Acc init() const {
    if constexpr (std::is_same_v<T, bool>) return !IsMax;
    else if constexpr (kIsFloat<T>)
      return IsMax ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    else return IsMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
  Acc step(Acc a, C x) const { return pick(a, static_cast<Acc>(map(x))); }
  Acc merge(Acc a, Acc b) const { return pick(a, b); }
  Total initTotal() const { return init(); }
  Total fold(Total t, Acc a) const { return pick(t, a); }
  Total join(Total a, Total b) const { return pick(a, b); }
  T finish(Total t) const { return static_cast<T>(t); }
};

void requireFloat(const Tensor& a, const char* op) {
  if (a.defined() && !isFloating(a.dtype()))
    throw ValueError(fmt::format("{}: expected a floating-point tensor, got {} of shape {}; convert with to() first",
                                 op, a.dtype(), shapeStr(a.sizes())));
}

// out = f(x, a, b) (f(x, a) for map2) elementwise in x's dtype, with a and b broadcast to x's
// shape: the map `kind` (reduce_dispatch.h) with `param`, by the device's "reduce backward" kernel.
Tensor map3(const Tensor& x, const Tensor& a, const Tensor& b, ReduceGradMap kind, double param) {
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  dispatch::kernel<ReduceGradMapKernel>("reduce backward", x.device())(out, x, a.to(x.dtype()), b.to(x.dtype()), kind,
                                                                       param);
  return out;
}
Tensor map2(const Tensor& x, const Tensor& a, ReduceGradMap kind, double param) {
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  dispatch::kernel<ReduceGradMapKernel>("reduce backward", x.device())(out, x, a.to(x.dtype()), Tensor(), kind, param);
  return out;
}

// Gradient for reductions that pick extreme elements: g is split evenly among the elements
// where pick(x) equals the kept result m (amax, amin, norm inf); `sign` multiplies by sgn(x).
Tensor evenSplitGrad(const Tensor& x, const Tensor& m, const Tensor& g, const Shape& dims, bool absolute) {
  const double absFlag = absolute ? 1.0 : 0.0;
  Tensor hits = map2(x, m, ReduceGradMap::Hits, absFlag);
  Tensor count = sum(hits, dims, true);
  Tensor share = g / count;
  return map3(x, m, share, ReduceGradMap::Share, absFlag);
}

}  // namespace

}  // namespace detail

// ---- sum / mean ---------------------------------------------------------------------------------

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim) {
  COHORT_RECORD_OP("sum", a, dims, keepdim);
  COHORT_AUTOCAST("sum", sum, a, dims, keepdim);
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, "sum");
  // Integers and bools sum to int64, as in PyTorch.
  DType outType = isFloating(a.dtype()) ? a.dtype() : DType::Int64;
  Tensor out = empty(p.outShape, {.dtype = outType, .device = a.device()});
  dispatch::kernel<detail::PlannedReduceKernel>("sum", a.device())(out, p.src, p.outer, p.reduced, p.inner, 1.0);
  Shape inShape = a.sizes(), kept = p.keptShape;
  autograd::record("sum", {a}, {out}, {}, [inShape, kept](Ctx&, const GradList& g) -> GradList {
    return {g[0].reshape(kept).expand(inShape)};
  });
  return out;
}

Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) {
  COHORT_RECORD_OP("mean", a, dims, keepdim);
  if (a.defined() && !isFloating(a.dtype()))
    throw ValueError(fmt::format("mean: expected a floating-point tensor, got {} of shape {}; convert with to() first",
                                 a.dtype(), shapeStr(a.sizes())));
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, "mean");
  const int64_t count = p.reduced;
  // An empty reduction divides 0 by 0: NaN, as in PyTorch.
  const double scale = count == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / static_cast<double>(count);
  Tensor out = empty(p.outShape, {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<detail::PlannedReduceKernel>("mean", a.device())(out, p.src, p.outer, p.reduced, p.inner, scale);
  Shape inShape = a.sizes(), kept = p.keptShape;
  autograd::record("mean", {a}, {out}, {}, [inShape, kept, count](Ctx&, const GradList& g) -> GradList {
    return {(g[0] / static_cast<double>(count)).reshape(kept).expand(inShape)};
  });
  return out;
}

Tensor sumToShape(const Tensor& a, const Shape& shape) {
  COHORT_RECORD_OP("sumToShape", a, shape);
  if (a.sizes() == shape) return a;
  int64_t nd = a.dim(), ns = static_cast<int64_t>(shape.size());
  if (ns > nd)
    throw ValueError(fmt::format("sumToShape: shape {} has more dims than {}", shapeStr(shape), shapeStr(a.sizes())));
  Shape dims;
  int64_t lead = nd - ns;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (int64_t d = 0; d < ns; ++d) {
    int64_t have = a.sizes()[lead + d];
    if (shape[d] == 1 && have != 1) dims.push_back(lead + d);
    else if (shape[d] != have)
      throw ValueError(fmt::format("sumToShape: {} is not a broadcast of {}", shapeStr(a.sizes()), shapeStr(shape)));
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

// ---- amax / amin --------------------------------------------------------------------------------

namespace {

template <bool IsMax>
Tensor extreme(const Tensor& a, const Shape& dims, bool keepdim, const char* op) {
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, op);
  detail::requireNonEmptyReduction(p, a, dims, op);
  Tensor out = empty(p.outShape, {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<detail::PlannedReduceKernel>(op, a.device())(out, p.src, p.outer, p.reduced, p.inner, 0.0);
  Shape kept = p.keptShape, rdims = dims;
  autograd::record(op, {a}, {out}, {a, out}, [kept, rdims](Ctx& ctx, const GradList& g) -> GradList {
    // Ties share the gradient evenly, as torch.amax does.
    return {detail::evenSplitGrad(ctx.saved(0), ctx.saved(1).reshape(kept), g[0].reshape(kept), rdims, false)};
  });
  return out;
}

}  // namespace

Tensor amax(const Tensor& a, const Shape& dims, bool keepdim) {
  COHORT_RECORD_OP("amax", a, dims, keepdim);
  return extreme<true>(a, dims, keepdim, "amax");
}
Tensor amin(const Tensor& a, const Shape& dims, bool keepdim) {
  COHORT_RECORD_OP("amin", a, dims, keepdim);
  return extreme<false>(a, dims, keepdim, "amin");
}

// ---- var / std ------------------------------------------------------------------------------------

namespace {

// Two-pass variance in double: mean first, then the sum of squared deviations.
template <typename T>
void varKernel(const detail::ReducePlan& p, T* out, double divisor, bool takeSqrt) {
  const T* x = static_cast<const T*>(p.src.dataPtr());
  const int64_t R = p.reduced, I = p.inner, O = p.outer;
  std::vector<double> mu(static_cast<size_t>(I)), ss(static_cast<size_t>(I));
  for (int64_t o = 0; o < O; ++o) {
    const T* base = x + o * R * I;
    std::fill(mu.begin(), mu.end(), 0.0);
    std::fill(ss.begin(), ss.end(), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) mu[i] += static_cast<double>(static_cast<Acc<T>>(base[r * I + i]));
    for (int64_t i = 0; i < I; ++i) mu[i] /= static_cast<double>(R);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        double d = static_cast<double>(static_cast<Acc<T>>(base[r * I + i])) - mu[i];
        ss[i] += d * d;
      }
    for (int64_t i = 0; i < I; ++i) {
      double v = ss[i] / divisor;
      out[o * I + i] = static_cast<T>(takeSqrt ? std::sqrt(v) : v);
    }
  }
}

// Rows along the last dim (inner == 1) of float32 / float16 / bfloat16: one pass over memory.
// Each block of kRowBlock elements (in L1 after the first touch) is reduced twice: its sum in
// float lanes gives an approximate block mean mf, then d = x - mf is summed (sd) and squared-summed
// (sd2) in float lanes over 256-element chunks that fold into double lanes. The block's exact
// statistics follow as mean = mf + sd/n, M2 = sd2 - sd^2/n (the corrected two-pass formula, so
// the error of mf cancels), and blocks merge in double with Chan's parallel update
// (M2 += M2_b + delta^2 n_a n_b / (n_a + n_b)). A block whose float sums overflow is redone in
// double. Relative error about 1e-9 on 1e4 + N(0, 1) data (tests/core/ops/reduce_test.cc).
template <typename T>
void varRows(const T* x, int64_t O, int64_t R, T* out, double divisor, bool takeSqrt) {
  constexpr int64_t L = 32;
  constexpr int64_t kChunk = 8 * L;
  float buf[detail::kIsHalf<T> ? detail::kRowBlock : 1];
  const detail::SumOp<float, float, detail::Identity> sumOp{};
  for (int64_t o = 0; o < O; ++o) {
    const T* row = x + o * R;
    double count = 0, mean = 0, m2 = 0;
    for (int64_t start = 0; start < R; start += detail::kRowBlock) {
      const int64_t len = std::min(detail::kRowBlock, R - start);
      const float* b;
      if constexpr (detail::kIsHalf<T>) {
        detail::toCompute(row + start, buf, len);
        b = buf;
      } else {
        b = row + start;
      }
      const float mf = static_cast<float>(static_cast<double>(detail::laneBlock(b, len, sumOp)) / len);
      double sdD[L] = {}, sd2D[L] = {};
      int64_t i = 0;
      // The next block streams in from memory while this one is in the float loop below.
      const uintptr_t next = reinterpret_cast<uintptr_t>(row + start + len);
      for (; i + kChunk <= len; i += kChunk) {
        for (int64_t q = 0; q < kChunk * static_cast<int64_t>(sizeof(T)); q += 64)
          __builtin_prefetch(reinterpret_cast<const void*>(next + i * sizeof(T) + q));
        float sd[L] = {}, sd2[L] = {};
        for (int64_t c = 0; c < kChunk; c += L)
          for (int64_t j = 0; j < L; ++j) {
            const float d = b[i + c + j] - mf;
            sd[j] += d;
            sd2[j] = vecmath::fmaF(d, d, sd2[j]);
          }
        for (int64_t j = 0; j < L; ++j) {
          sdD[j] += sd[j];
          sd2D[j] += sd2[j];
        }
      }
      double d1 = 0, d2 = 0;
      for (int64_t j = 0; j < L; ++j) {
        d1 += sdD[j];
        d2 += sd2D[j];
      }
      for (; i < len; ++i) {
        const double d = static_cast<double>(b[i]) - mf;
        d1 += d;
        d2 += d * d;
      }
      const double nb = static_cast<double>(len);
      double mb, m2b;
      if (std::isfinite(mf) && std::isfinite(d2)) {
        mb = static_cast<double>(mf) + d1 / nb;
        m2b = d2 - d1 * d1 / nb;
      } else {  // float overflow, or inf/NaN in the data (which then gives NaN): redo in double
        double sum = 0;
        for (int64_t k = 0; k < len; ++k) sum += static_cast<double>(b[k]);
        mb = sum / nb;
        m2b = 0;
        for (int64_t k = 0; k < len; ++k) m2b += (static_cast<double>(b[k]) - mb) * (static_cast<double>(b[k]) - mb);
      }
      const double total = count + nb;
      const double delta = mb - mean;
      mean += delta * nb / total;
      m2 += m2b + delta * delta * (count * nb / total);
      count = total;
    }
    const double v = m2 / divisor;
    out[o] = static_cast<T>(takeSqrt ? std::sqrt(v) : v);
  }
}

Tensor varStd(const Tensor& a, const Shape& dims, int64_t correction, bool keepdim, bool takeSqrt, const char* op) {
  detail::requireFloat(a, op);
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, op);
  if (correction < 0)
    throw ValueError(
        fmt::format("{}: correction must be >= 0, got {} (input shape {})", op, correction, shapeStr(a.sizes())));
  // Like PyTorch: divide by max(0, N - correction); too few elements give inf or NaN.
  const double divisor = static_cast<double>(std::max<int64_t>(0, p.reduced - correction));
  Tensor out = empty(p.outShape, {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<detail::PlannedReduceKernel>(op, a.device())(out, p.src, p.outer, p.reduced, p.inner, divisor);
  Shape kept = p.keptShape, rdims = dims;
  autograd::record(op, {a}, {out}, {a, out}, [kept, rdims, divisor, takeSqrt](Ctx& ctx, const GradList& g) -> GradList {
    Tensor x = ctx.saved(0);
    Tensor mu = mean(x, rdims, true);
    Tensor gk = g[0].reshape(kept);
    if (takeSqrt) {
      // d std = d var / (2 std); a zero std gives a zero gradient, as in PyTorch.
      Tensor s = ctx.saved(1).reshape(kept);
      gk = detail::map2(gk, s, detail::ReduceGradMap::StdScale, 0.0);
    }
    return {detail::map3(x, mu, gk, detail::ReduceGradMap::Var, 2.0 / divisor)};
  });
  return out;
}

}  // namespace

Tensor var(const Tensor& a, const Shape& dims, int64_t correction, bool keepdim) {
  COHORT_RECORD_OP("var", a, dims, correction, keepdim);
  return varStd(a, dims, correction, keepdim, false, "var");
}
Tensor std(const Tensor& a, const Shape& dims, int64_t correction, bool keepdim) {
  COHORT_RECORD_OP("std", a, dims, correction, keepdim);
  return varStd(a, dims, correction, keepdim, true, "std");
}

// ---- norm -----------------------------------------------------------------------------------------

namespace {

struct AbsMap {
  template <typename X>
  X operator()(X x) const {
    return x < X(0) ? -x : x;
  }
};
struct SquareMap {
  template <typename X>
  X operator()(X x) const {
    return x * x;
  }
};
struct NonZeroMap {
  template <typename X>
  X operator()(X x) const {
    return x != X(0) ? X(1) : X(0);
  }
};
struct AbsPowMap {
  double p;
  template <typename X>
  X operator()(X x) const {
    return static_cast<X>(std::pow(std::abs(static_cast<double>(x)), p));
  }
};

// SumOp whose finish applies a power (sqrt for p = 2, 1/p in general).
template <typename T, typename Map>
struct PowSumOp : detail::SumOp<T, T, Map> {
  double root = 1.0;
  T finish(double t) const {
    if (root == 1.0) return static_cast<T>(t);
    if (root == 0.5) return static_cast<T>(std::sqrt(t));
    return static_cast<T>(std::pow(t, root));
  }
};

}  // namespace

Tensor norm(const Tensor& a, double p, const Shape& dims, bool keepdim) {
  COHORT_RECORD_OP("norm", a, p, dims, keepdim);
  COHORT_AUTOCAST("norm", norm, a, p, dims, keepdim);
  detail::requireFloat(a, "norm");
  if (std::isnan(p)) throw ValueError(fmt::format("norm: p must not be NaN (input shape {})", shapeStr(a.sizes())));
  detail::ReducePlan plan = detail::planReduce(a, dims, keepdim, "norm");
  const bool isInf = std::isinf(p);
  // inf-norms of an empty set: torch gives 0 for +inf; -inf has no identity.
  if (isInf && p < 0) detail::requireNonEmptyReduction(plan, a, dims, "norm");
  Tensor out = empty(plan.outShape, {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<detail::PlannedReduceKernel>("norm", a.device())(out, plan.src, plan.outer, plan.reduced, plan.inner,
                                                                    p);
  Shape kept = plan.keptShape, rdims = dims;
  autograd::record("norm", {a}, {out}, {a, out}, [kept, rdims, p, isInf](Ctx& ctx, const GradList& g) -> GradList {
    Tensor x = ctx.saved(0), n = ctx.saved(1).reshape(kept), gk = g[0].reshape(kept);
    if (isInf) return {detail::evenSplitGrad(x, n, gk, rdims, true)};
    if (p == 0) return {zerosLike(x)};
    return {detail::map3(x, n, gk, detail::ReduceGradMap::Norm, p)};
  });
  return out;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

using detail::PlannedReduceKernel;
using detail::ReduceGradMap;

// Integers and bools sum to int64, as in PyTorch.
void sumCpu(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double) {
  const detail::ReducePlan p = detail::planOf(src, outer, reduced, inner);
  COHORT_DISPATCH(src.dtype(), "sum", [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      detail::reduceKernel<T, T>(p, out.data<T>(), detail::SumOp<T, T, detail::Identity>{});
    } else {
      detail::reduceKernel<T, int64_t>(p, out.data<int64_t>(), detail::SumOp<T, int64_t, detail::Identity>{});
    }
  });
}

void meanCpu(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double scale) {
  const detail::ReducePlan p = detail::planOf(src, outer, reduced, inner);
  COHORT_DISPATCH_FLOAT(src.dtype(), "mean", [&]<typename T>() {
    detail::reduceKernel<T, T>(p, out.data<T>(), detail::SumOp<T, T, detail::Identity>{{}, scale});
  });
}

template <bool IsMax>
void extremeCpu(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double) {
  const detail::ReducePlan p = detail::planOf(src, outer, reduced, inner);
  COHORT_DISPATCH(src.dtype(), IsMax ? "amax" : "amin", [&]<typename T>() {
    detail::reduceKernel<T, T>(p, out.data<T>(), detail::ExtremeOp<T, IsMax, detail::Identity>{});
  });
}

template <bool TakeSqrt>
void varCpu(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double divisor) {
  const detail::ReducePlan p = detail::planOf(src, outer, reduced, inner);
  COHORT_DISPATCH_FLOAT(src.dtype(), TakeSqrt ? "std" : "var", [&]<typename T>() {
    if (outer * inner == 0) return;
    if constexpr (std::is_same_v<T, float> || detail::kIsHalf<T>) {
      if (inner == 1 && reduced >= 2 * detail::kLanes)
        return varRows<T>(static_cast<const T*>(src.dataPtr()), outer, reduced, out.data<T>(), divisor, TakeSqrt);
    }
    varKernel<T>(p, out.data<T>(), divisor, TakeSqrt);
  });
}

void normCpu(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double p) {
  const detail::ReducePlan plan = detail::planOf(src, outer, reduced, inner);
  const bool isInf = std::isinf(p);
  COHORT_DISPATCH_FLOAT(src.dtype(), "norm", [&]<typename T>() {
    T* o = out.data<T>();
    if (isInf && p > 0) {
      if (reduced == 0) {
        for (int64_t k = 0; k < out.numel(); ++k) o[k] = T(0.0f);
      } else {
        detail::reduceKernel<T, T>(plan, o, detail::ExtremeOp<T, true, AbsMap>{});
      }
    } else if (isInf) {
      detail::reduceKernel<T, T>(plan, o, detail::ExtremeOp<T, false, AbsMap>{});
    } else if (p == 2) {
      PowSumOp<T, SquareMap> op;
      op.root = 0.5;
      detail::reduceKernel<T, T>(plan, o, op);
    } else if (p == 1) {
      detail::reduceKernel<T, T>(plan, o, PowSumOp<T, AbsMap>{});
    } else if (p == 0) {
      detail::reduceKernel<T, T>(plan, o, PowSumOp<T, NonZeroMap>{});
    } else {
      PowSumOp<T, AbsPowMap> op;
      op.map = AbsPowMap{p};
      op.root = 1.0 / p;
      detail::reduceKernel<T, T>(plan, o, op);
    }
  });
}

// The elementwise maps of the reductions' backward closures (reduce_dispatch.h).
void gradMapCpu(Tensor& out, const Tensor& x, const Tensor& a, const Tensor& b, ReduceGradMap kind, double param) {
  COHORT_DISPATCH_FLOAT(out.dtype(), "reduce backward", [&]<typename T>() {
    using V = Acc<T>;
    const bool absolute = param != 0.0;
    switch (kind) {
      case ReduceGradMap::Hits:  // amax / amin (norm inf with |x|): 1 where x is the kept extreme
        detail::mapKernel<T, T, 2>(out, {x, a}, [absolute](V v, V mv) {
          V av = absolute ? (v < V(0) ? -v : v) : v;
          return av == mv ? V(1) : V(0);
        });
        return;
      case ReduceGradMap::Share:  // the extreme's share of the gradient (times sgn(x) for |x|)
        detail::mapKernel<T, T, 3>(out, {x, a, b}, [absolute](V v, V mv, V sh) {
          V av = absolute ? (v < V(0) ? -v : v) : v;
          if (av != mv) return V(0);
          if (!absolute) return sh;
          return v > V(0) ? sh : (v < V(0) ? -sh : V(0));
        });
        return;
      case ReduceGradMap::StdScale:  // d std = d var / (2 std); a zero std gives a zero gradient, as PyTorch
        detail::mapKernel<T, T, 2>(out, {x, a}, [](V gv, V sv) { return sv == V(0) ? V(0) : gv / (V(2) * sv); });
        return;
      case ReduceGradMap::Var:  // param = 2 / divisor
        detail::mapKernel<T, T, 3>(out, {x, a, b},
                                   [param](V xv, V mv, V gv) { return static_cast<V>(param) * (xv - mv) * gv; });
        return;
      case ReduceGradMap::Norm:  // the p-norm's gradient, p = param
        detail::mapKernel<T, T, 3>(out, {x, a, b}, [p = param](V xv, V nv, V gv) {
          V sgn = xv > V(0) ? V(1) : (xv < V(0) ? V(-1) : V(0));
          if (p == 1) return sgn * gv;
          if (nv == V(0)) return V(0);  // as torch: a zero norm has a zero subgradient
          if (p == 2) return gv * xv / nv;
          double ax = std::abs(static_cast<double>(xv));
          return static_cast<V>(static_cast<double>(sgn * gv) * std::pow(ax, p - 1) /
                                std::pow(static_cast<double>(nv), p - 1));
        });
        return;
    }
  });
}

const bool kCpuKernels = [] {
  using dispatch::Register;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<PlannedReduceKernel>("sum", kCpu, &sumCpu);
  Register<PlannedReduceKernel>("mean", kCpu, &meanCpu);
  Register<PlannedReduceKernel>("amax", kCpu, &extremeCpu<true>);
  Register<PlannedReduceKernel>("amin", kCpu, &extremeCpu<false>);
  Register<PlannedReduceKernel>("var", kCpu, &varCpu<false>);
  Register<PlannedReduceKernel>("std", kCpu, &varCpu<true>);
  Register<PlannedReduceKernel>("norm", kCpu, &normCpu);
  Register<detail::ReduceGradMapKernel>("reduce backward", kCpu, &gradMapCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
