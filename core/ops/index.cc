// Indexing ops: index_select, gather, scatter_add, masked_fill, tril/triu, one_hot.
//
// Index tensors are int64 or int32 and are read in place (no conversion copy). Every index is
// range-checked before anything is written, so a bad index gives an IndexError naming the op,
// the index value and the dim size, never an out-of-bounds access. Backward formulas use the
// same kernels (index_select <-> index_add, gather <-> scatter_add). Tensors on other devices go to
// their kernels (detail/index_dispatch.h) where the CPU code would touch data.
#include <algorithm>
#include <cstring>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/index_dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {
namespace {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

void requireDefined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(fmt::format("{}: the {} tensor is undefined", op, what));
}

void requireIndexDType(const Tensor& index, const char* op) {
  if (index.dtype() != DType::Int64 && index.dtype() != DType::Int32)
    throw ValueError(
        fmt::format("{}: index must be int64 or int32, got {} (shape {})", op, index.dtype(), shapeStr(index.sizes())));
}

// Checks every value of a contiguous index array against [0, size).
template <typename IT>
void checkIndexRange(const IT* idx, int64_t n, int64_t size, int64_t dim, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= size) [[unlikely]]
      throw IndexError(fmt::format("{}: index {} is out of range for dim {} of size {}", op, v, dim, size));
  }
}

// ---- index_select / index_add ------------------------------------------------------------------

// out[o, i, r] = a[o, index[i], r] for a contiguous a viewed as [outer, len, inner].
Tensor indexSelectCpu(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor ac = a.contiguous();
  Tensor ic = index.contiguous();
  const int64_t n = ic.numel();
  Shape outShape = a.sizes();
  outShape[dim] = n;
  Tensor out = empty(outShape, {.dtype = a.dtype(), .device = a.device()});
  const int64_t len = a.sizes()[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= a.sizes()[d];
  for (int64_t d = dim + 1; d < a.dim(); ++d) inner *= a.sizes()[d];
  const size_t es = a.elementSize();
  const size_t rowBytes = static_cast<size_t>(inner) * es;
  COHORT_DISPATCH_INDEX(index.dtype(), "indexSelect", [&]<typename IT>() {
    const IT* idx = ic.data<IT>();
    checkIndexRange(idx, n, len, dim, "indexSelect");
    if (out.numel() == 0) return;
    const char* src = static_cast<const char*>(ac.dataPtr());
    char* dst = static_cast<char*>(out.dataPtr());
    for (int64_t o = 0; o < outer; ++o) {
      const char* srcBlock = src + static_cast<size_t>(o * len) * rowBytes;
      char* dstBlock = dst + static_cast<size_t>(o * n) * rowBytes;
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dstBlock + static_cast<size_t>(i) * rowBytes, srcBlock + static_cast<size_t>(idx[i]) * rowBytes,
                    rowBytes);
    }
  });
  return out;
}

Tensor indexSelectKernel(const Tensor& a, int64_t dim, const Tensor& index) {
  return dispatch::kernel<dispatch::IndexSelectKernel>("indexSelect", a.device())(a, dim, index);
}

// zeros(shape)[o, index[i], r] += g[o, i, r]: the backward of index_select.
Tensor indexAddIntoZerosCpu(const Shape& shape, DType dt, int64_t dim, const Tensor& index, const Tensor& g) {
  Tensor out = zeros(shape, {.dtype = dt});
  Tensor gc = g.to(dt).contiguous();
  Tensor ic = index.contiguous();
  const int64_t n = ic.numel(), len = shape[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
  if (out.numel() == 0 || gc.numel() == 0) return out;
  COHORT_DISPATCH_NUMERIC(dt, "indexSelect backward", [&]<typename T>() {
    COHORT_DISPATCH_INDEX(index.dtype(), "indexSelect backward", [&]<typename IT>() {
      const IT* idx = ic.data<IT>();
      const T* src = gc.data<T>();
      T* dst = out.data<T>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < n; ++i) {
          T* d = dst + (o * len + static_cast<int64_t>(idx[i])) * inner;
          const T* s = src + (o * n + i) * inner;
          for (int64_t r = 0; r < inner; ++r)
            d[r] = static_cast<T>(static_cast<Acc<T>>(d[r]) + static_cast<Acc<T>>(s[r]));
        }
    });
  });
  return out;
}

Tensor indexAddIntoZeros(const Shape& shape, DType dt, int64_t dim, const Tensor& index, const Tensor& g) {
  return dispatch::kernel<dispatch::IndexAddIntoZerosKernel>("indexSelect backward", g.device())(shape, dt, dim, index,
                                                                                                 g);
}

// ---- gather / scatter_add ------------------------------------------------------------------------

// Walks every position p of `shape` (row-major), with idx[k] the k-th index value (contiguous),
// calling f(direct, indexed) with element offsets: direct = sum_d p[d]*direct[d] and
// indexed = sum_{d != dim} p[d]*indexed[d] + idx[k]*indexed[dim].
template <typename IT, typename F>
void forEachIndexed(const Shape& shape, int64_t dim, const IT* idx, const Shape& directStrides,
                    const Shape& indexedStrides, F&& f) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (shapeNumel(shape) == 0) return;
  if (nd == 0) {
    f(int64_t{0}, static_cast<int64_t>(idx[0]) * (indexedStrides.empty() ? 1 : indexedStrides[0]));
    return;
  }
  const int64_t last = nd - 1;
  const int64_t n = shape[last];
  const int64_t ds = directStrides[last];
  const int64_t is = last == dim ? 0 : indexedStrides[last];
  const int64_t idxStride = indexedStrides[dim];
  std::vector<int64_t> counter(nd, 0);
  int64_t dBase = 0, iBase = 0, k = 0;
  while (true) {
    if (last == dim) {
      for (int64_t j = 0; j < n; ++j) f(dBase + j * ds, iBase + static_cast<int64_t>(idx[k + j]) * idxStride);
    } else {
      for (int64_t j = 0; j < n; ++j) f(dBase + j * ds, iBase + j * is + static_cast<int64_t>(idx[k + j]) * idxStride);
    }
    k += n;
    int64_t d = last - 1;
    for (; d >= 0; --d) {
      dBase += directStrides[d];
      if (d != dim) iBase += indexedStrides[d];
      if (++counter[d] < shape[d]) break;
      dBase -= directStrides[d] * shape[d];
      if (d != dim) iBase -= indexedStrides[d] * shape[d];
      counter[d] = 0;
    }
    if (d < 0) return;
  }
}

// Checks the gather/scatter shape rules: same number of dims, index.size(d) <= self.size(d) for
// d != dim (and <= src.size(d) for every d when src is given).
void checkGatherShapes(const Tensor& self, int64_t dim, const Tensor& index, const Tensor* src, const char* op) {
  int64_t nd = std::max<int64_t>(self.dim(), 1);
  int64_t ni = std::max<int64_t>(index.dim(), 1);
  if (ni != nd)
    throw ValueError(fmt::format("{}: index of shape {} must have as many dims as the input of shape {}", op,
                                 shapeStr(index.sizes()), shapeStr(self.sizes())));
  for (int64_t d = 0; d < index.dim(); ++d) {
    if (d != dim && self.dim() > 0 && index.sizes()[d] > self.sizes()[d])
      throw ValueError(fmt::format("{}: index of shape {} is larger than the input of shape {} in dim {}", op,
                                   shapeStr(index.sizes()), shapeStr(self.sizes()), d));
  }
  if (src) {
    int64_t ns = std::max<int64_t>(src->dim(), 1);
    if (ns != nd)
      throw ValueError(fmt::format("{}: src of shape {} must have as many dims as the input of shape {}", op,
                                   shapeStr(src->sizes()), shapeStr(self.sizes())));
    for (int64_t d = 0; d < index.dim(); ++d)
      if (index.sizes()[d] > src->sizes()[d])
        throw ValueError(fmt::format("{}: index of shape {} is larger than src of shape {} in dim {}", op,
                                     shapeStr(index.sizes()), shapeStr(src->sizes()), d));
  }
}

Shape stridesOr1(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.strides(); }
Shape sizesOr1(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.sizes(); }

Tensor gatherCpu(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor ic = index.contiguous();
  Tensor out = empty(index.sizes(), {.dtype = a.dtype(), .device = a.device()});
  const int64_t len = sizesOr1(a)[dim];
  COHORT_DISPATCH_INDEX(index.dtype(), "gather", [&]<typename IT>() {
    const IT* idx = ic.data<IT>();
    checkIndexRange(idx, ic.numel(), len, dim, "gather");
    if (out.numel() == 0) return;
    COHORT_DISPATCH(a.dtype(), "gather", [&]<typename T>() {
      const T* src = static_cast<const T*>(a.dataPtr());  // a's own strides: no copy
      T* dst = out.data<T>();
      forEachIndexed(sizesOr1(index), dim, idx, contiguousStrides(sizesOr1(index)), stridesOr1(a),
                     [&](int64_t o, int64_t i) { dst[o] = src[i]; });
    });
  });
  return out;
}

Tensor gatherKernel(const Tensor& a, int64_t dim, const Tensor& index) {
  return dispatch::kernel<dispatch::GatherKernel>("gather", a.device())(a, dim, index);
}

// out (contiguous, shape of self) += src at the indexed positions.
void scatterAddCpu(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  Tensor ic = index.contiguous();
  const int64_t len = sizesOr1(out)[dim];
  COHORT_DISPATCH_INDEX(index.dtype(), op, [&]<typename IT>() {
    const IT* idx = ic.data<IT>();
    checkIndexRange(idx, ic.numel(), len, dim, op);
    if (ic.numel() == 0) return;
    COHORT_DISPATCH_NUMERIC(out.dtype(), op, [&]<typename T>() {
      const T* s = static_cast<const T*>(src.dataPtr());
      T* o = out.data<T>();
      forEachIndexed(sizesOr1(index), dim, idx, stridesOr1(src), stridesOr1(out), [&](int64_t si, int64_t oi) {
        o[oi] = static_cast<T>(static_cast<Acc<T>>(o[oi]) + static_cast<Acc<T>>(s[si]));
      });
    });
  });
}

void scatterAddInto(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  dispatch::kernel<dispatch::ScatterAddKernel>("scatterAdd", out.device())(out, dim, index, src, op);
}

// ---- tril / triu ---------------------------------------------------------------------------------

// Keeps a[..., i, j] where (lower ? j - i <= k : j - i >= k), zeroes the rest.
Tensor triangleCpu(const Tensor& a, int64_t k, bool lower) {
  Tensor ac = a.contiguous();
  Tensor out = empty(a.sizes(), {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() == 0) return out;
  const int64_t rows = a.size(-2), cols = a.size(-1);
  const int64_t batch = a.numel() / (rows * cols);
  const size_t es = a.elementSize();
  const char* src = static_cast<const char*>(ac.dataPtr());
  char* dst = static_cast<char*>(out.dataPtr());
  // All dtypes have an all-zero-bits zero, so rows are filled with memcpy/memset.
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      const size_t rowOff = static_cast<size_t>((b * rows + i) * cols) * es;
      // Columns kept: [lo, hi).
      int64_t lo = lower ? 0 : std::clamp<int64_t>(i + k, 0, cols);
      int64_t hi = lower ? std::clamp<int64_t>(i + k + 1, 0, cols) : cols;
      if (hi < lo) hi = lo;
      std::memset(dst + rowOff, 0, static_cast<size_t>(lo) * es);
      std::memcpy(dst + rowOff + lo * es, src + rowOff + lo * es, static_cast<size_t>(hi - lo) * es);
      std::memset(dst + rowOff + hi * es, 0, static_cast<size_t>(cols - hi) * es);
    }
  return out;
}

Tensor triangleKernel(const Tensor& a, int64_t k, bool lower) {
  return dispatch::kernel<dispatch::TriangleKernel>(lower ? "tril" : "triu", a.device())(a, k, lower);
}

Tensor triangle(const Tensor& a, int64_t k, bool lower) {
  const char* op = lower ? "tril" : "triu";
  requireDefined(a, op, "input");
  if (a.dim() < 2)
    throw ValueError(fmt::format("{}: input must have at least 2 dims, got shape {}", op, shapeStr(a.sizes())));
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = triangleKernel(a, k, lower);
  }
  autograd::record(op, {a}, {out}, {},
                   [k, lower](Ctx&, const GradList& g) -> GradList { return {triangleKernel(g[0], k, lower)}; });
  return out;
}

}  // namespace

Tensor indexSelect(const Tensor& a, int64_t dim, const Tensor& index) {
  COHORT_RECORD_OP("indexSelect", a, dim, index);
  requireDefined(a, "indexSelect", "input");
  requireDefined(index, "indexSelect", "index");
  requireIndexDType(index, "indexSelect");
  if (index.dim() > 1)
    throw ValueError(fmt::format("indexSelect: index must be 0-D or 1-D, got shape {} (input shape {})",
                                 shapeStr(index.sizes()), shapeStr(a.sizes())));
  dim = wrapDim(dim, a.dim(), "indexSelect");
  Tensor out;
  if (a.dim() == 0) {
    // A 0-d input behaves as one element along dim 0; the result stays 0-d (as in torch).
    if (index.numel() != 1)
      throw ValueError(
          fmt::format("indexSelect: a 0-d input needs exactly one index, got shape {}", shapeStr(index.sizes())));
    autograd::NoGradGuard ng;
    out = indexSelectKernel(a.reshape({1}), 0, index.reshape({1})).reshape({});
  } else {
    autograd::NoGradGuard ng;
    out = indexSelectKernel(a, dim, index.reshape({-1}));
  }
  Shape inShape = a.sizes();
  DType dt = a.dtype();
  autograd::record("indexSelect", {a}, {out}, {index}, [inShape, dt, dim](Ctx& ctx, const GradList& g) -> GradList {
    Tensor idx = ctx.saved(0).reshape({-1});
    if (inShape.empty()) return {indexAddIntoZeros({1}, dt, 0, idx, g[0].reshape({1})).reshape({})};
    Shape gShape = inShape;
    gShape[dim] = idx.numel();
    return {indexAddIntoZeros(inShape, dt, dim, idx, g[0].reshape(gShape))};
  });
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  COHORT_RECORD_OP("gather", a, dim, index);
  requireDefined(a, "gather", "input");
  requireDefined(index, "gather", "index");
  requireIndexDType(index, "gather");
  dim = wrapDim(dim, a.dim(), "gather");
  checkGatherShapes(a, dim, index, nullptr, "gather");
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = gatherKernel(a, dim, index);
  }
  Shape inShape = a.sizes();
  DType dt = a.dtype();
  autograd::record("gather", {a}, {out}, {index}, [inShape, dt, dim](Ctx& ctx, const GradList& g) -> GradList {
    Tensor gi = zeros(inShape, {.dtype = dt, .device = g[0].device()});
    Tensor gc = g[0].to(dt);
    scatterAddInto(gi, dim, ctx.saved(0), gc, "gather backward");
    return {gi};
  });
  return out;
}

Tensor scatterAdd(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  COHORT_RECORD_OP("scatterAdd", a, dim, index, src);
  COHORT_AUTOCAST("scatterAdd", scatterAdd, a, dim, index, src);
  requireDefined(a, "scatterAdd", "input");
  requireDefined(index, "scatterAdd", "index");
  requireDefined(src, "scatterAdd", "src");
  requireIndexDType(index, "scatterAdd");
  if (src.dtype() != a.dtype())
    throw ValueError(fmt::format("scatterAdd: src dtype {} differs from the input dtype {} (shapes {} and {})",
                                 src.dtype(), a.dtype(), shapeStr(src.sizes()), shapeStr(a.sizes())));
  if (a.dtype() == DType::Bool) throw ValueError("scatterAdd: not supported for bool tensors");
  dim = wrapDim(dim, a.dim(), "scatterAdd");
  checkGatherShapes(a, dim, index, &src, "scatterAdd");
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = a.clone();
    scatterAddInto(out, dim, index, src, "scatterAdd");
  }
  Shape srcShape = src.sizes();
  autograd::record("scatterAdd", {a, src}, {out}, {index}, [dim, srcShape](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    if (ctx.needsInputGrad(0)) r[0] = g[0];
    if (ctx.needsInputGrad(1)) {
      Tensor idx = ctx.saved(0);
      Tensor gs = gatherKernel(g[0], dim, idx);
      if (gs.sizes() != srcShape) {
        // src is larger than index: its elements outside index's extent got no use.
        Tensor full = zeros(srcShape, {.dtype = gs.dtype(), .device = gs.device()});
        Tensor region = full;
        for (int64_t d = 0; d < idx.dim(); ++d) region = region.narrow(d, 0, idx.sizes()[d]);
        region.copy_(gs);
        gs = full;
      }
      r[1] = gs;
    }
    return r;
  });
  return out;
}

Tensor maskedFill(const Tensor& a, const Tensor& mask, Scalar value) {
  COHORT_RECORD_OP("maskedFill", a, mask, value);
  requireDefined(a, "maskedFill", "input");
  requireDefined(mask, "maskedFill", "mask");
  if (mask.dtype() != DType::Bool)
    throw ValueError(
        fmt::format("maskedFill: mask must be bool, got {} (shape {})", mask.dtype(), shapeStr(mask.sizes())));
  Shape shape = broadcastShapes(a.sizes(), mask.sizes(), "maskedFill");
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  dispatch::kernel<dispatch::BinaryScalarKernel>("maskedFill", out.device())(out, a, mask, value);
  autograd::record("maskedFill", {a}, {out}, {mask},
                   [](Ctx& ctx, const GradList& g) -> GradList { return {maskedFill(g[0], ctx.saved(0), 0)}; });
  return out;
}

Tensor tril(const Tensor& a, int64_t diagonal) {
  COHORT_RECORD_OP("tril", a, diagonal);
  return triangle(a, diagonal, true);
}
Tensor triu(const Tensor& a, int64_t diagonal) {
  COHORT_RECORD_OP("triu", a, diagonal);
  return triangle(a, diagonal, false);
}

Tensor oneHot(const Tensor& indices, int64_t numClasses) {
  COHORT_RECORD_OP("oneHot", indices, numClasses);
  requireDefined(indices, "oneHot", "indices");
  requireIndexDType(indices, "oneHot");
  if (numClasses < -1)
    throw ValueError(fmt::format("oneHot: numClasses must be -1 (infer) or non-negative, got {}", numClasses));
  return dispatch::kernel<dispatch::OneHotKernel>("oneHot", indices.device())(indices, numClasses);
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

// out = a where the mask is false, value where it is true (a and mask broadcast to out's shape;
// out may be a itself, for maskedFill_).
void maskedFillCpu(Tensor& out, const Tensor& a, const Tensor& mask, Scalar value) {
  if (out.numel() == 0) return;
  const Shape& shape = out.sizes();
  COHORT_DISPATCH(a.dtype(), "maskedFill", [&]<typename T>() {
    const T v = static_cast<T>(value.to<Acc<T>>());
    std::array<char*, 3> ptrs{static_cast<char*>(out.dataPtr()), static_cast<char*>(a.dataPtr()),
                              static_cast<char*>(mask.dataPtr())};
    std::array<Shape, 3> st{detail::broadcastByteStrides(out, shape), detail::broadcastByteStrides(a, shape),
                            detail::broadcastByteStrides(mask, shape)};
    detail::forEachStrided<3>(shape, ptrs, st, [&](std::array<char*, 3> p, const std::array<int64_t, 3>& s, int64_t n) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      const uint8_t* m = reinterpret_cast<const uint8_t*>(p[2]);  // bool storage; uint8 vectorizes
      if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] = m[i] != 0 ? v : x[i];
      } else if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == 0) {
        if (m[0] != 0) std::fill(o, o + n, v);
        else if (o != x) std::memcpy(o, x, static_cast<size_t>(n) * sizeof(T));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<T*>(p[0] + i * s[0]) =
              *reinterpret_cast<const bool*>(p[2] + i * s[2]) ? v : *reinterpret_cast<const T*>(p[1] + i * s[1]);
      }
    });
  });
}

Tensor oneHotCpu(const Tensor& indices, int64_t numClasses) {
  Tensor ic = indices.contiguous();
  const int64_t n = ic.numel();
  return COHORT_DISPATCH_INDEX(indices.dtype(), "oneHot", [&]<typename IT>() -> Tensor {
    const IT* idx = ic.data<IT>();
    int64_t maxLabel = -1;
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = static_cast<int64_t>(idx[i]);
      if (v < 0)
        throw IndexError(
            fmt::format("oneHot: label {} at position {} is negative (shape {})", v, i, shapeStr(indices.sizes())));
      maxLabel = std::max(maxLabel, v);
    }
    int64_t c = numClasses;
    if (c == -1) {
      if (n == 0)
        throw ValueError(fmt::format("oneHot: cannot infer the number of classes from an empty tensor (shape {})",
                                     shapeStr(indices.sizes())));
      c = maxLabel + 1;
    } else if (maxLabel >= c) {
      throw IndexError(fmt::format("oneHot: label {} is out of range for {} classes", maxLabel, c));
    }
    Shape shape = indices.sizes();
    shape.push_back(c);
    Tensor out = zeros(shape, {.dtype = DType::Int64});
    int64_t* o = out.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) o[i * c + static_cast<int64_t>(idx[i])] = 1;
    return out;
  });
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<IndexSelectKernel>("indexSelect", kCpu, &indexSelectCpu);
  Register<IndexAddIntoZerosKernel>("indexSelect backward", kCpu, &indexAddIntoZerosCpu);
  Register<GatherKernel>("gather", kCpu, &gatherCpu);
  Register<ScatterAddKernel>("scatterAdd", kCpu, &scatterAddCpu);
  Register<TriangleKernel>("tril", kCpu, &triangleCpu);
  Register<TriangleKernel>("triu", kCpu, &triangleCpu);
  Register<BinaryScalarKernel>("maskedFill", kCpu, &maskedFillCpu);
  Register<OneHotKernel>("oneHot", kCpu, &oneHotCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
