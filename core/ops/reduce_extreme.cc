// Reductions that keep positions: max/min (values and indices) and argmax/argmin over one dim.
// The value-only reductions (sum, mean, amax, var, norm) are in reduce.cc; both share the
// planning and blocking in reduce_impl.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/reduce_dispatch.h>
#include <cohort/core/ops/detail/reduce_impl.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

// ---- max / min / argmax / argmin over one dim ----------------------------------------------------

namespace {

// Values (optional) and int64 indices of the first extreme element along the reduced dim; a NaN
// counts as the extreme (the first NaN wins), as in PyTorch.
template <typename T, bool IsMax>
bool betterThan(Acc<T> v, Acc<T> best) {
  bool b = IsMax ? v > best : v < best;
  if constexpr (kIsFloat<T>) b = b || (v != v && best == best);
  return b;
}

template <typename T>
bool sameValue(Acc<T> a, Acc<T> b) {
  if constexpr (kIsFloat<T>) return (a == b) | ((a != a) & (b != b));
  else return a == b;
}

// Value and index of the first extreme element of x[0, n), n >= 1, in one pass: 32 lanes each keep
// their extreme and its position (a strict comparison keeps a lane's first occurrence; the
// compare-and-blend on a float and an int32 vectorizes), then lanes merge by value, ties going to
// the lower position. NaN counts as the extreme, the first NaN wins.
template <typename T, bool IsMax>
void argBlock(const Acc<T>* x, int64_t n, Acc<T>& bestV, int64_t& bestI) {
  using C = Acc<T>;
  constexpr int64_t L = 32;
  C bv = x[0];
  int64_t bi = 0;
  int64_t i = 1;
  if (n >= 2 * L) {
    C m[L];
    int32_t id[L];
    for (int64_t j = 0; j < L; ++j) {
      m[j] = x[j];
      id[j] = static_cast<int32_t>(j);
    }
    for (i = L; i + L <= n; i += L)
      for (int64_t j = 0; j < L; ++j) {
        const C v = x[i + j];
        bool take = IsMax ? v > m[j] : v < m[j];
        if constexpr (kIsFloat<T>) take = take | ((v != v) & (m[j] == m[j]));
        m[j] = take ? v : m[j];
        id[j] = take ? static_cast<int32_t>(i + j) : id[j];
      }
    bv = m[0];
    bi = id[0];
    for (int64_t j = 1; j < L; ++j)
      if (betterThan<T, IsMax>(m[j], bv) || (sameValue<T>(m[j], bv) && id[j] < bi)) {
        bv = m[j];
        bi = id[j];
      }
  }
  for (; i < n; ++i)  // positions after every lane's: only a strictly better value replaces
    if (betterThan<T, IsMax>(x[i], bv)) {
      bv = x[i];
      bi = i;
    }
  bestV = bv;
  bestI = bi;
}

// Rows along the last dim (inner == 1, contiguous): argBlock over blocks of kRowBlock elements
// (half types converted to float per block), a later block replacing the best only when strictly
// better. Same results as the general loop below: the first extreme element, the first NaN if
// there is one.
template <typename T, bool IsMax>
void argRows(const T* x, int64_t O, int64_t R, T* vals, int64_t* idx) {
  using C = Acc<T>;
  C buf[detail::kIsHalf<T> ? detail::kRowBlock : 1];
  for (int64_t o = 0; o < O; ++o) {
    const T* row = x + o * R;
    C best{};
    int64_t bestI = 0;
    for (int64_t start = 0; start < R; start += detail::kRowBlock) {
      const int64_t len = std::min(detail::kRowBlock, R - start);
      const C* blk;
      if constexpr (detail::kIsHalf<T>) {
        detail::toCompute(row + start, buf, len);
        blk = buf;
      } else {
        blk = row + start;
      }
      C m;
      int64_t k;
      argBlock<T, IsMax>(blk, len, m, k);
      if (start == 0 || betterThan<T, IsMax>(m, best)) {
        best = m;
        bestI = start + k;
      }
    }
    if (vals) vals[o] = static_cast<T>(best);
    idx[o] = bestI;
  }
}

template <typename T, bool IsMax>
void argKernel(const detail::ReducePlan& p, T* vals, int64_t* idx) {
  using C = Acc<T>;
  const T* x = static_cast<const T*>(p.src.dataPtr());
  const int64_t R = p.reduced, I = p.inner, O = p.outer;
  if constexpr (!std::is_same_v<T, bool>) {
    if (I == 1 && R >= 2 * detail::kLanes) return argRows<T, IsMax>(x, O, R, vals, idx);
  }
  auto better = [](C v, C best) { return betterThan<T, IsMax>(v, best); };
  std::vector<C> bestV(static_cast<size_t>(I));
  std::vector<int64_t> bestI(static_cast<size_t>(I));
  for (int64_t o = 0; o < O; ++o) {
    const T* base = x + o * R * I;
    for (int64_t i = 0; i < I; ++i) {
      bestV[i] = static_cast<C>(base[i]);
      bestI[i] = 0;
    }
    for (int64_t r = 1; r < R; ++r) {
      const T* row = base + r * I;
      for (int64_t i = 0; i < I; ++i) {
        C v = static_cast<C>(row[i]);
        if (better(v, bestV[i])) {
          bestV[i] = v;
          bestI[i] = r;
        }
      }
    }
    for (int64_t i = 0; i < I; ++i) {
      if (vals) vals[o * I + i] = static_cast<T>(bestV[i]);
      idx[o * I + i] = bestI[i];
    }
  }
}

template <bool IsMax>
std::pair<Tensor, Tensor> extremeDim(const Tensor& a, int64_t dim, bool keepdim, bool wantValues, const char* op) {
  detail::ReducePlan p = detail::planReduce(a, {dim}, keepdim, op);
  detail::requireNonEmptyReduction(p, a, {dim}, op);
  Tensor values = wantValues ? empty(p.outShape, {.dtype = a.dtype(), .device = a.device()}) : Tensor();
  Tensor indices = empty(p.outShape, {.dtype = DType::Int64, .device = a.device()});
  dispatch::kernel<detail::ArgReduceKernel>(op, a.device())(values, indices, p.src, p.outer, p.reduced, p.inner);
  if (wantValues) {
    Shape inShape = a.sizes(), kept = p.keptShape;
    int64_t R = p.reduced, I = p.inner;
    autograd::record(op, {a}, {values}, {indices}, [inShape, kept, R, I](Ctx& ctx, const GradList& g) -> GradList {
      // The whole gradient goes to the returned index.
      Tensor idx = ctx.saved(0).contiguous();
      Tensor gc = g[0].contiguous();
      Tensor grad = empty(inShape, {.dtype = gc.dtype(), .device = gc.device()});
      dispatch::kernel<detail::ArgScatterKernel>("max backward", gc.device())(grad, idx, gc, R, I);
      return {grad};
    });
  }
  return {values, indices};
}

template <bool IsMax>
Tensor argExtreme(const Tensor& a, std::optional<int64_t> dim, bool keepdim, const char* op) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  autograd::NoGradGuard ng;
  if (dim) return extremeDim<IsMax>(a, *dim, keepdim, false, op).second;
  // Over the flattened tensor; keepdim keeps every dim as size 1, as in PyTorch.
  Tensor flat = a.reshape({a.numel()});
  Tensor r = extremeDim<IsMax>(flat, 0, false, false, op).second;
  if (keepdim) return r.reshape(Shape(static_cast<size_t>(a.dim()), 1));
  return r;
}

}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  COHORT_RECORD_OP("max", a, dim, keepdim);
  return extremeDim<true>(a, dim, keepdim, true, "max");
}
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  COHORT_RECORD_OP("min", a, dim, keepdim);
  return extremeDim<false>(a, dim, keepdim, true, "min");
}
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  COHORT_RECORD_OP("argmax", a, dim, keepdim);
  return argExtreme<true>(a, dim, keepdim, "argmax");
}
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  COHORT_RECORD_OP("argmin", a, dim, keepdim);
  return argExtreme<false>(a, dim, keepdim, "argmin");
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

template <bool IsMax>
void argReduceCpu(Tensor& values, Tensor& indices, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner) {
  if (outer * inner == 0) return;
  const detail::ReducePlan p = detail::planOf(src, outer, reduced, inner);
  COHORT_DISPATCH(src.dtype(), IsMax ? "max" : "min", [&]<typename T>() {
    argKernel<T, IsMax>(p, values.defined() ? values.data<T>() : nullptr, indices.data<int64_t>());
  });
}

// The whole gradient goes to the returned index.
void argScatterCpu(Tensor& grad, const Tensor& indices, const Tensor& g, int64_t reduced, int64_t inner) {
  if (grad.numel() > 0) std::memset(grad.dataPtr(), 0, grad.nbytes());
  const int64_t n = indices.numel();
  const int64_t* ip = indices.data<int64_t>();
  COHORT_DISPATCH_FLOAT(g.dtype(), "max backward", [&]<typename T>() {
    const T* gp = g.data<T>();
    T* out = grad.data<T>();
    for (int64_t k = 0; k < n; ++k) {
      int64_t o = k / inner, i = k % inner;
      out[(o * reduced + ip[k]) * inner + i] = gp[k];
    }
  });
}

const bool kCpuKernels = [] {
  using dispatch::Register;
  using detail::ArgReduceKernel;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<ArgReduceKernel>("max", kCpu, &argReduceCpu<true>);
  Register<ArgReduceKernel>("min", kCpu, &argReduceCpu<false>);
  Register<ArgReduceKernel>("argmax", kCpu, &argReduceCpu<true>);
  Register<ArgReduceKernel>("argmin", kCpu, &argReduceCpu<false>);
  Register<detail::ArgScatterKernel>("max backward", kCpu, &argScatterCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
