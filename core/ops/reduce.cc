// Reductions. Sums accumulate in blocks with independent lanes (vectorized) and combine blocks
// in double, so large float32 sums stay accurate; half types accumulate in float.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/reduce_impl.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

namespace detail {

ReducePlan planReduce(const Tensor& a, const Shape& dims, bool keepdim, const char* op) {
  if (!a.defined()) throw ValueError(fmt::format("{}: the input tensor is undefined", op));
  ReducePlan p;
  int64_t nd = a.dim();
  p.isReduced.assign(std::max<int64_t>(nd, 1), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrapDim(d, nd, op);
    if (!dims.empty() && p.isReduced[w] && std::count(dims.begin(), dims.end(), d) > 1)
      throw ValueError(fmt::format("{}: dim {} appears more than once in {}", op, d, shapeStr(dims)));
    p.isReduced[w] = true;
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (p.isReduced[d]) {
      p.keptShape.push_back(1);
      if (keepdim) p.outShape.push_back(1);
    } else {
      p.keptShape.push_back(a.sizes()[d]);
      p.outShape.push_back(a.sizes()[d]);
    }
  }
  // Are the reduced dims one contiguous block [first, last]?
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < nd; ++d)
    if (p.isReduced[d]) {
      if (first < 0) first = d;
      last = d;
    }
  bool block = true;
  for (int64_t d = first; d >= 0 && d <= last; ++d)
    if (!p.isReduced[d] && a.sizes()[d] != 1) block = false;
  if (nd == 0 || first < 0) {
    p.src = a.contiguous();
    p.outer = 1;
    p.reduced = nd == 0 ? 1 : 1;
    p.inner = a.numel();
    if (nd == 0) {
      p.inner = 1;
    }
    return p;
  }
  if (block) {
    p.src = a.contiguous();
    for (int64_t d = 0; d < first; ++d) p.outer *= a.sizes()[d];
    for (int64_t d = first; d <= last; ++d) p.reduced *= a.sizes()[d];
    for (int64_t d = last + 1; d < nd; ++d) p.inner *= a.sizes()[d];
    return p;
  }
  // Move reduced dims to the end and copy.
  Shape perm;
  for (int64_t d = 0; d < nd; ++d)
    if (!p.isReduced[d]) perm.push_back(d);
  for (int64_t d = 0; d < nd; ++d)
    if (p.isReduced[d]) perm.push_back(d);
  p.src = a.permute(perm).contiguous();
  for (int64_t d = 0; d < nd; ++d) {
    if (p.isReduced[d]) p.reduced *= a.sizes()[d];
    else p.outer *= a.sizes()[d];
  }
  p.inner = 1;
  return p;
}

namespace {

// Sum of n contiguous values: 16 independent float lanes per block, blocks combined in double.
template <typename T>
double sumContiguous(const T* x, int64_t n) {
  using A = Acc<T>;
  constexpr int64_t kLanes = 16, kBlock = 4096;
  double total = 0;
  for (int64_t start = 0; start < n; start += kBlock) {
    int64_t end = std::min(n, start + kBlock);
    A lane[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) lane[j] += static_cast<A>(x[i + j]);
    A rest = 0;
    for (; i < end; ++i) rest += static_cast<A>(x[i]);
    A s = rest;
    for (int64_t j = 0; j < kLanes; ++j) s += lane[j];
    total += static_cast<double>(s);
  }
  return total;
}

}  // namespace

// out[o, i] = sum_r src[o, r, i], in the accumulation type; `out` is contiguous [outer*inner].
template <typename T, typename Out>
void sumKernel(const ReducePlan& p, Out* out) {
  const T* x = static_cast<const T*>(p.src.dataPtr());
  using A = std::conditional_t<kIsFloat<T>, Acc<T>, int64_t>;
  if (p.inner == 1) {
    for (int64_t o = 0; o < p.outer; ++o) {
      if constexpr (kIsFloat<T>) out[o] = static_cast<Out>(sumContiguous(x + o * p.reduced, p.reduced));
      else {
        A s = 0;
        for (int64_t r = 0; r < p.reduced; ++r) s += static_cast<A>(x[o * p.reduced + r]);
        out[o] = static_cast<Out>(s);
      }
    }
    return;
  }
  std::vector<A> acc(static_cast<size_t>(p.inner));
  for (int64_t o = 0; o < p.outer; ++o) {
    std::fill(acc.begin(), acc.end(), A(0));
    const T* base = x + o * p.reduced * p.inner;
    for (int64_t r = 0; r < p.reduced; ++r) {
      const T* row = base + r * p.inner;
      A* a = acc.data();
      for (int64_t i = 0; i < p.inner; ++i) a[i] += static_cast<A>(row[i]);
    }
    for (int64_t i = 0; i < p.inner; ++i) out[o * p.inner + i] = static_cast<Out>(acc[static_cast<size_t>(i)]);
  }
}

}  // namespace detail

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim) {
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, "sum");
  // Integers and bools sum to int64, as in PyTorch.
  DType outType = isFloating(a.dtype()) ? a.dtype() : DType::Int64;
  Tensor out = empty(p.outShape, {.dtype = outType});
  COHORT_DISPATCH(a.dtype(), "sum", [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      detail::sumKernel<T, T>(p, out.data<T>());
    } else {
      detail::sumKernel<T, int64_t>(p, out.data<int64_t>());
    }
  });
  Shape inShape = a.sizes(), kept = p.keptShape;
  autograd::record("sum", {a}, {out}, {}, [inShape, kept](Ctx&, const GradList& g) -> GradList {
    return {g[0].reshape(kept).expand(inShape)};
  });
  return out;
}

Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) {
  if (a.defined() && !isFloating(a.dtype()))
    throw ValueError(fmt::format("mean: expected a floating-point tensor, got {}; convert with to() first", a.dtype()));
  detail::ReducePlan p = detail::planReduce(a, dims, keepdim, "mean");
  int64_t count = p.reduced;
  return sum(a, dims, keepdim) / static_cast<double>(count == 0 ? 0 : count) ;
}

Tensor sumToShape(const Tensor& a, const Shape& shape) {
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

}  // namespace cohort
