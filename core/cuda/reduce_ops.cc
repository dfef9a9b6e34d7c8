// CUDA kernels of the reductions (core/ops/reduce.cc, reduce_extreme.cc): checks, scratch space
// and launches around core/cuda/reduce.cu, registered with the op dispatch.
#include <cmath>

#include <cohort/core/cuda/detail/reduce_kernels.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/detail/reduce_dispatch.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

using cohort::detail::ReduceGradMap;

// The address of t's data, or null for an empty tensor (whose storage may hold no memory).
void* dataOrNull(const Tensor& t) { return t.numel() == 0 ? nullptr : devicePtr(t); }

// Scratch memory on t's device for `bytes` bytes (undefined when none is needed). Freed memory goes
// back to the pool of the stream the kernels run on, so releasing it before they finish is safe.
Tensor scratch(const Tensor& like, int64_t bytes) {
  if (bytes <= 0) return Tensor();
  return empty({bytes}, {.dtype = DType::UInt8, .device = like.device()});
}

void requireDense(const Tensor& t, const char* op, const char* what) {
  // (An empty tensor's strides are arbitrary and its data is never read.)
  COHORT_CHECK(t.numel() == 0 || t.isContiguous(), "{}: the CUDA kernel expects a contiguous {} (shape {})", op, what,
               shapeStr(t.sizes()));
}

template <ReduceOp Op>
constexpr const char* reduceName() {
  switch (Op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Amax: return "amax";
    case ReduceOp::Amin: return "amin";
    case ReduceOp::Norm: return "norm";
    case ReduceOp::Var: return "var";
    case ReduceOp::Std: return "std";
  }
  return "reduce";
}

template <ReduceOp Op>
void reduceCuda(Tensor& out, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner, double param) {
  const char* op = reduceName<Op>();
  requireSameDevice(op, out.device(), {&src});
  requireDense(src, op, "source");
  requireDense(out, op, "result");
  COHORT_CHECK(out.numel() == outer * inner && src.numel() == outer * reduced * inner,
               "{}: planned shape [{}, {}, {}] does not match the source ({} elements) or the result ({})", op, outer,
               reduced, inner, src.numel(), out.numel());
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  cudaStream_t stream = streamOf(out);
  // torch's inf-norm of an empty set is 0; reduce.cc writes the same on the CPU.
  if (Op == ReduceOp::Norm && std::isinf(param) && param > 0 && reduced == 0) {
    COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(out), 0, out.nbytes(), stream));
    return;
  }
  ReduceArgs a;
  a.op = Op;
  a.type = elemType(src.dtype());
  a.src = dataOrNull(src);
  a.out = devicePtr(out);
  a.outer = outer;
  a.reduced = reduced;
  a.inner = inner;
  a.param = param;
  Tensor ws = scratch(out, reduceWorkspaceBytes(a));
  launchReduce(a, ws.defined() ? devicePtr(ws) : nullptr, stream);
  COHORT_CUDA_CHECK_LAUNCH();
}

template <bool IsMax>
void argReduceCuda(Tensor& values, Tensor& indices, const Tensor& src, int64_t outer, int64_t reduced, int64_t inner) {
  const char* op = IsMax ? "max" : "min";
  requireSameDevice(op, indices.device(), {&src, &values});
  requireDense(src, op, "source");
  requireDense(indices, op, "indices");
  COHORT_CHECK(indices.dtype() == DType::Int64, "{}: indices must be int64", op);
  COHORT_CHECK(reduced >= 1, "{}: the CUDA kernel needs a non-empty reduced extent", op);
  if (values.defined()) {
    requireDense(values, op, "values");
    COHORT_CHECK(values.dtype() == src.dtype() && values.numel() == indices.numel(), "{}: bad values tensor", op);
  }
  if (indices.numel() == 0) return;
  DeviceGuard guard(indices.device().index());
  ArgReduceArgs a;
  a.isMax = IsMax;
  a.type = elemType(src.dtype());
  a.src = devicePtr(src);
  a.values = values.defined() ? devicePtr(values) : nullptr;
  a.indices = static_cast<int64_t*>(devicePtr(indices));
  a.outer = outer;
  a.reduced = reduced;
  a.inner = inner;
  Tensor ws = scratch(indices, argReduceWorkspaceBytes(a));
  launchArgReduce(a, ws.defined() ? devicePtr(ws) : nullptr, streamOf(indices));
  COHORT_CUDA_CHECK_LAUNCH();
}

void argScatterCuda(Tensor& grad, const Tensor& indices, const Tensor& g, int64_t reduced, int64_t inner) {
  const char* op = "max backward";
  requireSameDevice(op, grad.device(), {&indices, &g});
  requireDense(grad, op, "gradient");
  requireDense(indices, op, "indices");
  requireDense(g, op, "output gradient");
  COHORT_CHECK(g.dtype() == grad.dtype() && isFloating(g.dtype()), "{}: expected floating gradients", op);
  if (grad.numel() == 0) return;
  DeviceGuard guard(grad.device().index());
  cudaStream_t stream = streamOf(grad);
  COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(grad), 0, grad.nbytes(), stream));  // all-zero bits are 0.0
  const int64_t outer = inner == 0 || reduced == 0 ? 0 : g.numel() / inner;
  launchArgScatter(elemType(g.dtype()), devicePtr(grad), static_cast<const int64_t*>(dataOrNull(indices)),
                   dataOrNull(g), outer, reduced, inner, stream);
  COHORT_CUDA_CHECK_LAUNCH();
}

void gradMapCuda(Tensor& out, const Tensor& x, const Tensor& a, const Tensor& b, ReduceGradMap kind, double param) {
  const char* op = "reduce backward";
  requireSameDevice(op, out.device(), {&x, &a, &b});
  COHORT_CHECK(isFloating(out.dtype()) && x.dtype() == out.dtype() && a.dtype() == out.dtype() &&
                   (!b.defined() || b.dtype() == out.dtype()),
               "{}: operands must share the result's floating dtype", op);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index());
  StridedIter<4> it = makeIter<3>(out, {&x, &a, b.defined() ? &b : &a});
  launchReduceGradMap(elemType(out.dtype()), it, static_cast<GradMapKind>(kind), param, streamOf(out));
  COHORT_CUDA_CHECK_LAUNCH();
}

static_assert(static_cast<int>(ReduceGradMap::Norm) == static_cast<int>(GradMapKind::Norm) &&
              static_cast<int>(ReduceGradMap::Hits) == static_cast<int>(GradMapKind::Hits));

using cohort::detail::ArgReduceKernel;
using cohort::detail::ArgScatterKernel;
using cohort::detail::PlannedReduceKernel;
using cohort::detail::ReduceGradMapKernel;
constexpr DeviceType kCuda = DeviceType::CUDA;

const dispatch::Register<PlannedReduceKernel> kRegSum{"sum", kCuda, &reduceCuda<ReduceOp::Sum>};
const dispatch::Register<PlannedReduceKernel> kRegMean{"mean", kCuda, &reduceCuda<ReduceOp::Mean>};
const dispatch::Register<PlannedReduceKernel> kRegAmax{"amax", kCuda, &reduceCuda<ReduceOp::Amax>};
const dispatch::Register<PlannedReduceKernel> kRegAmin{"amin", kCuda, &reduceCuda<ReduceOp::Amin>};
const dispatch::Register<PlannedReduceKernel> kRegNorm{"norm", kCuda, &reduceCuda<ReduceOp::Norm>};
const dispatch::Register<PlannedReduceKernel> kRegVar{"var", kCuda, &reduceCuda<ReduceOp::Var>};
const dispatch::Register<PlannedReduceKernel> kRegStd{"std", kCuda, &reduceCuda<ReduceOp::Std>};
const dispatch::Register<ArgReduceKernel> kRegMax{"max", kCuda, &argReduceCuda<true>};
const dispatch::Register<ArgReduceKernel> kRegMin{"min", kCuda, &argReduceCuda<false>};
const dispatch::Register<ArgReduceKernel> kRegArgmax{"argmax", kCuda, &argReduceCuda<true>};
const dispatch::Register<ArgReduceKernel> kRegArgmin{"argmin", kCuda, &argReduceCuda<false>};
const dispatch::Register<ArgScatterKernel> kRegMaxBackward{"max backward", kCuda, &argScatterCuda};
const dispatch::Register<ReduceGradMapKernel> kRegGradMap{"reduce backward", kCuda, &gradMapCuda};

}  // namespace
}  // namespace cohort::cuda::detail
