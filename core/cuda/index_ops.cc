// CUDA kernels of the indexing ops, embedding and dropout: checks, outputs and arguments for the
// launchers in index.cu, registered with op dispatch (core/ops/detail/index_dispatch.h).
//
// Indices come from users, so every index is range-checked before anything is written, as on
// the CPU. On the GPU a kernel records the first bad position in device memory and the host reads
// it back: one stream synchronization per op that takes indices. That wait is the price of an
// IndexError naming the op and the bad value (a device-side assert would instead abort the
// kernel and leave the CUDA context unusable for the rest of the process, and an unchecked index
// reads or writes out of bounds). Backward kernels reuse indices the forward already checked.
#include <cuda_runtime_api.h>

#include <cstring>
#include <limits>

#include <cohort/core/cuda/cuda.h>
#include <cohort/core/cuda/detail/index_kernels.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/detail/index_dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/half.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

bool isIndex64(const Tensor& index) { return index.dtype() == DType::Int64; }

int64_t numelOf(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// An all-zero tensor without the elementwise fill (zero bits are zero in every dtype).
Tensor zerosOn(const Shape& shape, DType dt, Device device) {
  Tensor t = empty(shape, {.dtype = dt, .device = device});
  if (t.numel() > 0)
    COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(t), 0, static_cast<size_t>(t.numel()) * t.elementSize(), streamOf(t)));
  return t;
}

// The first value of the contiguous index tensor `idx` outside [0, size), with its position;
// position -1 when all are in range. maxValue: the largest value (with wantMax). Synchronizes
// the stream (see the top of the file).
struct IndexCheck {
  int64_t badPos = -1;
  int64_t badValue = 0;
  int64_t maxValue = -1;
};
IndexCheck checkIndices(const Tensor& idx, int64_t size, bool wantMax = false) {
  IndexCheck out;
  const int64_t n = idx.numel();
  if (n == 0) return out;
  cudaStream_t s = streamOf(idx);
  Tensor scratch = empty({2}, {.dtype = DType::Int64, .device = idx.device()});
  auto* r = static_cast<IndexCheckResult*>(devicePtr(scratch));
  static_assert(sizeof(IndexCheckResult) == 2 * sizeof(int64_t));
  COHORT_CUDA_CHECK(cudaMemsetAsync(r, 0xff, sizeof(IndexCheckResult), s));
  launchIndexCheck(devicePtr(idx), isIndex64(idx), n, size, wantMax, r, s);
  COHORT_CUDA_CHECK_LAUNCH();
  IndexCheckResult host{};
  COHORT_CUDA_CHECK(cudaMemcpyAsync(&host, r, sizeof host, cudaMemcpyDeviceToHost, s));
  COHORT_CUDA_CHECK(cudaStreamSynchronize(s));
  out.maxValue = host.maxValue;
  if (host.badPos != ~0ull) {
    out.badPos = static_cast<int64_t>(host.badPos);
    const char* at = static_cast<const char*>(devicePtr(idx)) + out.badPos * static_cast<int64_t>(idx.elementSize());
    int64_t v64 = 0;
    int32_t v32 = 0;
    const bool wide = isIndex64(idx);
    COHORT_CUDA_CHECK(cudaMemcpyAsync(wide ? static_cast<void*>(&v64) : static_cast<void*>(&v32), at, idx.elementSize(),
                                      cudaMemcpyDeviceToHost, s));
    COHORT_CUDA_CHECK(cudaStreamSynchronize(s));
    out.badValue = wide ? v64 : v32;
  }
  return out;
}

void throwIfBad(const IndexCheck& c, int64_t dim, int64_t size, const char* op) {
  if (c.badPos >= 0)
    throw IndexError(fmt::format("{}: index {} is out of range for dim {} of size {}", op, c.badValue, dim, size));
}

void requireIndexOn(const char* op, const Tensor& data, const Tensor& index) {
  requireSameDevice(op, data.device(), {&data, &index});
}

// ---- index_select --------------------------------------------------------------------------------

Tensor indexSelectCuda(const Tensor& a, int64_t dim, const Tensor& index) {
  requireIndexOn("indexSelect", a, index);
  DeviceGuard guard(a.device().index());
  Tensor ac = a.contiguous();
  Tensor ic = index.contiguous();
  const int64_t n = ic.numel();
  const int64_t len = a.sizes()[dim];
  throwIfBad(checkIndices(ic, len), dim, len, "indexSelect");
  Shape outShape = a.sizes();
  outShape[dim] = n;
  Tensor out = empty(outShape, {.dtype = a.dtype(), .device = a.device()});
  IndexSelectArgs args;
  args.src = devicePtr(ac);
  args.out = devicePtr(out);
  args.idx = devicePtr(ic);
  args.index64 = isIndex64(ic);
  args.outer = 1;
  args.inner = 1;
  for (int64_t d = 0; d < dim; ++d) args.outer *= a.sizes()[d];
  for (int64_t d = dim + 1; d < a.dim(); ++d) args.inner *= a.sizes()[d];
  args.n = n;
  args.len = len;
  args.elemSize = static_cast<int>(a.elementSize());
  if (out.numel() > 0) {
    launchIndexSelect(args, streamOf(out));
    COHORT_CUDA_CHECK_LAUNCH();
  }
  return out;
}

// zeros(shape)[o, idx[i], r] += g[o, i, r] in increasing i, through a stable sort of the indices
// (no atomics: the sum's order, and so its rounding, is the CPU's).
Tensor indexAddSorted(const Shape& shape, DType dt, int64_t dim, const Tensor& index, const Tensor& g,
                      bool roundEachAdd) {
  DeviceGuard guard(g.device().index());
  Tensor out = zerosOn(shape, dt, g.device());
  Tensor gc = g.to(dt).contiguous();
  Tensor ic = index.contiguous();
  const int64_t n = ic.numel(), len = shape[static_cast<size_t>(dim)];
  if (out.numel() == 0 || gc.numel() == 0 || n == 0) return out;
  cudaStream_t s = streamOf(out);
  Tensor keys = empty({n}, {.dtype = DType::Int64, .device = g.device()});
  Tensor pos = empty({n}, {.dtype = DType::Int64, .device = g.device()});
  const size_t tempBytes = indexSortTempBytes(n, len);
  Tensor temp = empty({static_cast<int64_t>(tempBytes)}, {.dtype = DType::UInt8, .device = g.device()});
  COHORT_CUDA_CHECK(launchIndexSort(devicePtr(ic), isIndex64(ic), n, len, static_cast<uint64_t*>(devicePtr(keys)),
                                    static_cast<int64_t*>(devicePtr(pos)), devicePtr(temp), tempBytes, s));
  IndexAddSortedArgs args;
  args.g = devicePtr(gc);
  args.out = devicePtr(out);
  args.sortedKeys = static_cast<const uint64_t*>(devicePtr(keys));
  args.sortedPos = static_cast<const int64_t*>(devicePtr(pos));
  args.outer = 1;
  args.inner = 1;
  for (int64_t d = 0; d < dim; ++d) args.outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) args.inner *= shape[d];
  args.n = n;
  args.len = len;
  args.type = elemType(dt);
  args.roundEachAdd = roundEachAdd;
  launchIndexAddSorted(args, s);
  COHORT_CUDA_CHECK_LAUNCH();
  return out;
}

Tensor indexAddIntoZerosCuda(const Shape& shape, DType dt, int64_t dim, const Tensor& index, const Tensor& g) {
  requireIndexOn("indexSelect backward", g, index);
  if (dt == DType::Bool) throw ValueError("indexSelect backward: not supported for bool tensors");
  return indexAddSorted(shape, dt, dim, index, g, true);
}

// ---- gather / scatter_add ------------------------------------------------------------------------

Shape sizesOr1(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.sizes(); }
Shape stridesOr1(const Tensor& t) { return t.dim() == 0 ? Shape{1} : t.strides(); }

GatherArgs gatherArgs(const Tensor& index, int64_t dim, const Tensor& src, const Tensor& out) {
  GatherArgs a;
  Shape sizes = sizesOr1(index);
  COHORT_CHECK_T(NotSupportedError, static_cast<int>(sizes.size()) <= kMaxDims,
                 "gather/scatter on CUDA take at most {} dims, not {}", kMaxDims, sizes.size());
  Shape ss = stridesOr1(src), os = stridesOr1(out), is = stridesOr1(index);
  a.ndim = static_cast<int>(sizes.size());
  a.dim = static_cast<int>(dim);
  for (int d = 0; d < a.ndim; ++d) {
    a.sizes[d] = sizes[static_cast<size_t>(d)];
    a.srcStrides[d] = ss[static_cast<size_t>(d)];
    a.outStrides[d] = os[static_cast<size_t>(d)];
    a.idxStrides[d] = is[static_cast<size_t>(d)];
  }
  a.src = devicePtr(src);
  a.out = devicePtr(out);
  a.idx = devicePtr(index);
  a.index64 = isIndex64(index);
  a.numel = numelOf(sizes);
  a.elemSize = static_cast<int>(src.elementSize());
  a.type = elemType(src.dtype());
  return a;
}

Tensor gatherCuda(const Tensor& a, int64_t dim, const Tensor& index) {
  requireIndexOn("gather", a, index);
  DeviceGuard guard(a.device().index());
  Tensor ic = index.contiguous();
  const int64_t len = sizesOr1(a)[static_cast<size_t>(dim)];
  throwIfBad(checkIndices(ic, len), dim, len, "gather");
  Tensor out = empty(index.sizes(), {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() == 0) return out;
  GatherArgs args = gatherArgs(ic, dim, a, out);  // a's own strides: no copy
  launchGather(args, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
  return out;
}

void scatterAddCuda(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  requireSameDevice(op, out.device(), {&out, &index, &src});
  COHORT_CHECK_T(ValueError, out.dtype() != DType::Bool, "{}: not supported for bool tensors", op);
  DeviceGuard guard(out.device().index());
  Tensor ic = index.contiguous();
  const int64_t len = sizesOr1(out)[static_cast<size_t>(dim)];
  throwIfBad(checkIndices(ic, len), dim, len, op);
  if (ic.numel() == 0) return;
  Tensor sc = src.dtype() == out.dtype() ? src : src.to(out.dtype());
  GatherArgs args = gatherArgs(ic, dim, sc, out);
  launchScatterAdd(args, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
}

// ---- masked_fill ---------------------------------------------------------------------------------

uint64_t valueBits(DType dt, Scalar v) {
  return COHORT_DISPATCH(dt, "maskedFill", [&]<typename T>() -> uint64_t {
    const T x = static_cast<T>(v.to<Acc<T>>());
    uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof(T));
    return bits;
  });
}

void maskedFillCuda(Tensor& out, const Tensor& a, const Tensor& mask, Scalar value) {
  requireSameDevice("maskedFill", out.device(), {&out, &a, &mask});
  COHORT_CHECK_T(ValueError, mask.dtype() == DType::Bool, "maskedFill: mask must be bool, got {}", mask.dtype());
  COHORT_CHECK_T(ValueError, a.dtype() == out.dtype(), "maskedFill: input dtype {} differs from the output's {}",
                 a.dtype(), out.dtype());
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  StridedIter<3> it = makeIter<2>(out, {&a, &mask});
  launchMaskedFill(it, valueBits(out.dtype(), value), static_cast<int>(out.elementSize()), streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
}

// ---- tril / triu ---------------------------------------------------------------------------------

Tensor triangleCuda(const Tensor& a, int64_t k, bool lower) {
  DeviceGuard guard(a.device().index());
  Tensor ac = a.contiguous();
  Tensor out = empty(a.sizes(), {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() == 0) return out;
  TriangleArgs args;
  args.src = devicePtr(ac);
  args.out = devicePtr(out);
  args.rows = a.size(-2);
  args.cols = a.size(-1);
  args.batch = a.numel() / (args.rows * args.cols);
  args.k = k;
  args.lower = lower;
  args.elemSize = static_cast<int>(a.elementSize());
  launchTriangle(args, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
  return out;
}

// ---- one_hot -------------------------------------------------------------------------------------

Tensor oneHotCuda(const Tensor& indices, int64_t numClasses) {
  DeviceGuard guard(indices.device().index());
  Tensor ic = indices.contiguous();
  const int64_t n = ic.numel();
  // Negative labels are the bad ones; the largest decides the class count or is checked against it.
  IndexCheck c = checkIndices(ic, std::numeric_limits<int64_t>::max(), true);
  if (c.badPos >= 0)
    throw IndexError(fmt::format("oneHot: label {} at position {} is negative (shape {})", c.badValue, c.badPos,
                                 shapeStr(indices.sizes())));
  int64_t classes = numClasses;
  if (classes == -1) {
    if (n == 0)
      throw ValueError(fmt::format("oneHot: cannot infer the number of classes from an empty tensor (shape {})",
                                   shapeStr(indices.sizes())));
    classes = c.maxValue + 1;
  } else if (c.maxValue >= classes) {
    throw IndexError(fmt::format("oneHot: label {} is out of range for {} classes", c.maxValue, classes));
  }
  Shape shape = indices.sizes();
  shape.push_back(classes);
  Tensor out = empty(shape, {.dtype = DType::Int64, .device = indices.device()});
  if (out.numel() == 0) return out;
  launchOneHot(devicePtr(ic), isIndex64(ic), n, classes, static_cast<int64_t*>(devicePtr(out)), streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
  return out;
}

// ---- embedding -----------------------------------------------------------------------------------

Tensor embeddingCuda(const Tensor& indices, const Tensor& weight) {
  requireSameDevice("embedding", weight.device(), {&weight, &indices});
  DeviceGuard guard(weight.device().index());
  Tensor ic = indices.contiguous();
  Tensor w = weight.contiguous();
  const int64_t num = weight.sizes()[0], dim = weight.sizes()[1];
  IndexCheck c = checkIndices(ic, num);
  if (c.badPos >= 0)
    throw IndexError(fmt::format("embedding: index {} is out of range for a weight of shape {} (indices shape {})",
                                 c.badValue, shapeStr(weight.sizes()), shapeStr(indices.sizes())));
  Shape outShape = indices.sizes();
  outShape.push_back(dim);
  Tensor out = empty(outShape, {.dtype = weight.dtype(), .device = weight.device()});
  if (out.numel() == 0) return out;
  IndexSelectArgs args;
  args.src = devicePtr(w);
  args.out = devicePtr(out);
  args.idx = devicePtr(ic);
  args.index64 = isIndex64(ic);
  args.outer = 1;
  args.n = ic.numel();
  args.len = num;
  args.inner = dim;
  args.elemSize = static_cast<int>(w.elementSize());
  launchIndexSelect(args, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
  return out;
}

Tensor embeddingBackwardCuda(const Tensor& indices, const Tensor& g, const Shape& wShape) {
  requireSameDevice("embedding backward", g.device(), {&g, &indices});
  COHORT_CHECK_T(ValueError, isFloating(g.dtype()), "embedding backward: expected a floating-point gradient, got {}",
                 g.dtype());
  if (numelOf(wShape) == 0 || g.numel() == 0) {
    DeviceGuard guard(g.device().index());
    return zerosOn(wShape, g.dtype(), g.device());
  }
  // g viewed as [n, dim] rows in indices' order; the sum per row stays in the compute type and
  // is rounded once, as the CPU's accumulator.
  return indexAddSorted(wShape, g.dtype(), 0, indices.reshape({-1}), g.reshape({-1, wShape[1]}), false);
}

// ---- dropout -------------------------------------------------------------------------------------

void dropoutMaskCuda(Tensor& mask, uint64_t seed, uint64_t counter, double p) {
  COHORT_CHECK_T(ValueError, mask.isContiguous(), "dropout: the mask must be contiguous");
  if (mask.numel() == 0) return;
  DeviceGuard guard(mask.device().index());
  DropoutMaskArgs args;
  args.mask = devicePtr(mask);
  args.n = mask.numel();
  args.seed = seed;
  args.counter = counter;
  args.keep = static_cast<float>(1.0 - p);
  args.elemSize = static_cast<int>(mask.elementSize());
  // The scale rounded to the mask's dtype on the host, as the CPU does (static_cast<T>(double)).
  args.scaleBits = COHORT_DISPATCH_FLOAT(mask.dtype(), "dropout", [&]<typename T>() -> uint64_t {
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    uint64_t bits = 0;
    std::memcpy(&bits, &scale, sizeof(T));
    return bits;
  });
  launchDropoutMask(args, streamOf(mask));
  COHORT_CUDA_CHECK_LAUNCH();
}

using namespace cohort::dispatch;
const Register<IndexSelectKernel> kIndexSelect{"indexSelect", DeviceType::CUDA, &indexSelectCuda};
const Register<IndexAddIntoZerosKernel> kIndexAdd{"indexSelect backward", DeviceType::CUDA, &indexAddIntoZerosCuda};
const Register<GatherKernel> kGather{"gather", DeviceType::CUDA, &gatherCuda};
const Register<ScatterAddKernel> kScatterAdd{"scatterAdd", DeviceType::CUDA, &scatterAddCuda};
const Register<BinaryScalarKernel> kMaskedFill{"maskedFill", DeviceType::CUDA, &maskedFillCuda};
const Register<TriangleKernel> kTril{"tril", DeviceType::CUDA, &triangleCuda};
const Register<TriangleKernel> kTriu{"triu", DeviceType::CUDA, &triangleCuda};
const Register<OneHotKernel> kOneHot{"oneHot", DeviceType::CUDA, &oneHotCuda};
const Register<EmbeddingKernel> kEmbedding{"embedding", DeviceType::CUDA, &embeddingCuda};
const Register<EmbeddingBackwardKernel> kEmbeddingBackward{"embedding backward", DeviceType::CUDA,
                                                           &embeddingBackwardCuda};
const Register<DropoutMaskKernel> kDropout{"dropout", DeviceType::CUDA, &dropoutMaskCuda};

}  // namespace
}  // namespace cohort::cuda::detail
