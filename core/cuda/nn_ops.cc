// CUDA kernels of softmax / log_softmax, the nll loss and layer norm (core/ops/nn_ops.cc): checks,
// scratch space and launches around core/cuda/nn.cu, registered with the op dispatch.
#include <cstring>
#include <initializer_list>
#include <limits>

#include <cohort/core/cuda/detail/nn_kernels.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/detail/nn_dispatch.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {
namespace {

namespace nnd = cohort::detail;

void requireDense(const Tensor& t, const char* op, const char* what) {
  COHORT_CHECK(t.isContiguous(), "{}: the CUDA kernel expects a contiguous {} (shape {})", op, what,
               shapeStr(t.sizes()));
}
const void* ptrOrNull(const Tensor& t) { return t.defined() && t.numel() > 0 ? devicePtr(t) : nullptr; }
void* mutPtrOrNull(Tensor& t) { return t.defined() && t.numel() > 0 ? devicePtr(t) : nullptr; }

template <bool Log>
void softmaxCuda(Tensor& y, const Tensor& src, int64_t outer, int64_t n, int64_t inner) {
  const char* op = Log ? "logSoftmax" : "softmax";
  requireSameDevice(op, y.device(), {&src});
  requireDense(src, op, "input");
  requireDense(y, op, "result");
  COHORT_CHECK(y.dtype() == src.dtype() && y.numel() == src.numel() && src.numel() == outer * n * inner,
               "{}: planned shape [{}, {}, {}] does not match the input ({} elements)", op, outer, n, inner,
               src.numel());
  if (y.numel() == 0) return;
  DeviceGuard guard(y.device().index());
  launchSoftmax(elemType(y.dtype()), Log, devicePtr(src), devicePtr(y), outer, n, inner, streamOf(y));
  COHORT_CUDA_CHECK_LAUNCH();
}

template <bool Log>
void softmaxBackwardCuda(Tensor& dx, const Tensor& y, const Tensor& g, int64_t outer, int64_t n, int64_t inner) {
  const char* op = Log ? "logSoftmax backward" : "softmax backward";
  requireSameDevice(op, dx.device(), {&y, &g});
  requireDense(dx, op, "gradient");
  requireDense(y, op, "saved output");
  requireDense(g, op, "output gradient");
  COHORT_CHECK(g.dtype() == y.dtype() && dx.dtype() == y.dtype() && g.numel() == y.numel() && dx.numel() == y.numel() &&
                   y.numel() == outer * n * inner,
               "{}: mismatched operands", op);
  if (dx.numel() == 0) return;
  DeviceGuard guard(dx.device().index());
  launchSoftmaxBackward(elemType(y.dtype()), Log, devicePtr(y), devicePtr(g), devicePtr(dx), outer, n, inner,
                        streamOf(dx));
  COHORT_CUDA_CHECK_LAUNCH();
}

int64_t nllForwardCuda(Tensor& perPos, Tensor& validMask, const Tensor& input, const Tensor& target, int64_t n,
                       int64_t c, int64_t d, int64_t ignoreIndex, const char* op) {
  requireSameDevice(op, input.device(), {&target, &perPos, &validMask});
  requireDense(input, op, "input");
  requireDense(target, op, "target");
  requireDense(perPos, op, "per-position loss");
  if (validMask.defined()) requireDense(validMask, op, "valid mask");
  COHORT_CHECK(perPos.numel() == n * d && target.numel() == n * d && input.numel() == n * c * d,
               "{}: mismatched loss operands", op);
  if (n * d == 0) return 0;
  DeviceGuard guard(input.device().index());
  cudaStream_t stream = streamOf(input);
  // stats[0]: positions not ignored; stats[1]: the first position with a bad label (all ones: none).
  Tensor stats = empty({2}, {.dtype = DType::Int64, .device = input.device()});
  auto* sp = static_cast<unsigned long long*>(devicePtr(stats));
  COHORT_CUDA_CHECK(cudaMemsetAsync(sp, 0, sizeof(unsigned long long), stream));
  COHORT_CUDA_CHECK(cudaMemsetAsync(sp + 1, 0xff, sizeof(unsigned long long), stream));
  launchNllForward(elemType(input.dtype()), elemType(target.dtype()), ptrOrNull(input), devicePtr(target),
                   devicePtr(perPos), mutPtrOrNull(validMask), sp, n, c, d, ignoreIndex, stream);
  COHORT_CUDA_CHECK_LAUNCH();
  // The count is the mean's divisor and a bad label is an error the caller must see now, as on
  // the CPU: this waits for the stream.
  unsigned long long host[2] = {0, 0};
  COHORT_CUDA_CHECK(cudaMemcpyAsync(host, sp, sizeof host, cudaMemcpyDeviceToHost, stream));
  COHORT_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host[1] != std::numeric_limits<unsigned long long>::max()) {
    const int64_t k = static_cast<int64_t>(host[1]);
    int64_t label = 0;
    const char* at = static_cast<const char*>(devicePtr(target)) + k * static_cast<int64_t>(target.elementSize());
    if (target.dtype() == DType::Int32) {
      int32_t v = 0;
      COHORT_CUDA_CHECK(cudaMemcpyAsync(&v, at, sizeof v, cudaMemcpyDeviceToHost, stream));
      COHORT_CUDA_CHECK(cudaStreamSynchronize(stream));
      label = v;
    } else {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(&label, at, sizeof label, cudaMemcpyDeviceToHost, stream));
      COHORT_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    throw IndexError(fmt::format("{}: target label {} is out of range for {} classes (input shape {}, target shape {})",
                                 op, label, c, shapeStr(input.sizes()), shapeStr(target.sizes())));
  }
  return static_cast<int64_t>(host[0]);
}

void nllBackwardCuda(Tensor& dx, const Tensor& target, const Tensor& grad, int64_t n, int64_t c, int64_t d,
                     int64_t ignoreIndex, double scale, bool perPosition) {
  const char* op = "nllLoss backward";
  requireSameDevice(op, dx.device(), {&target, &grad});
  requireDense(dx, op, "gradient");
  requireDense(target, op, "target");
  requireDense(grad, op, "output gradient");
  COHORT_CHECK(grad.dtype() == dx.dtype() && dx.numel() == n * c * d && target.numel() == n * d &&
                   grad.numel() == (perPosition ? n * d : 1),
               "{}: mismatched operands", op);
  if (dx.numel() == 0) return;
  DeviceGuard guard(dx.device().index());
  cudaStream_t stream = streamOf(dx);
  COHORT_CUDA_CHECK(cudaMemsetAsync(devicePtr(dx), 0, dx.nbytes(), stream));  // all-zero bits are 0.0
  launchNllBackward(elemType(dx.dtype()), elemType(target.dtype()), ptrOrNull(target), ptrOrNull(grad), devicePtr(dx),
                    n, c, d, ignoreIndex, scale, perPosition, stream);
  COHORT_CUDA_CHECK_LAUNCH();
}

void layerNormCuda(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   int64_t m, int64_t n, double eps) {
  const char* op = "layerNorm";
  requireSameDevice(op, x.device(), {&y, &mean, &rstd, &weight, &bias});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&y, &mean, &rstd, &x, &weight, &bias})
    if (t->defined()) requireDense(*t, op, "operand");
  const DType statType = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  COHORT_CHECK(mean.dtype() == statType && rstd.dtype() == statType && mean.numel() == m && rstd.numel() == m &&
                   x.numel() == m * n && y.numel() == m * n,
               "{}: mismatched operands", op);
  if (m * n == 0) return;
  DeviceGuard guard(x.device().index());
  launchLayerNorm(elemType(x.dtype()), devicePtr(x), ptrOrNull(weight), ptrOrNull(bias), devicePtr(y), devicePtr(mean),
                  devicePtr(rstd), m, n, eps, streamOf(x));
  COHORT_CUDA_CHECK_LAUNCH();
}

void layerNormBackwardCuda(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& x, const Tensor& weight,
                           const Tensor& grad, const Tensor& mean, const Tensor& rstd, int64_t m, int64_t n) {
  const char* op = "layerNorm backward";
  requireSameDevice(op, x.device(), {&dx, &dw, &db, &weight, &grad, &mean, &rstd});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dx, &dw, &db, &x, &weight, &grad, &mean, &rstd})
    if (t->defined()) requireDense(*t, op, "operand");
  COHORT_CHECK(x.numel() == m * n && grad.numel() == m * n && grad.dtype() == x.dtype(), "{}: mismatched operands", op);
  if (n == 0) return;
  DeviceGuard guard(x.device().index());
  void* dxp = dx.defined() && m > 0 ? devicePtr(dx) : nullptr;
  void* dwp = mutPtrOrNull(dw);
  void* dbp = mutPtrOrNull(db);
  if (dxp == nullptr && dwp == nullptr && dbp == nullptr) return;
  const int64_t bytes = dwp != nullptr || dbp != nullptr ? layerNormBackwardWorkspaceBytes(m, n) : 0;
  Tensor ws = bytes > 0 ? empty({bytes}, {.dtype = DType::UInt8, .device = x.device()}) : Tensor();
  launchLayerNormBackward(elemType(x.dtype()), ptrOrNull(x), ptrOrNull(weight), ptrOrNull(grad), ptrOrNull(mean),
                          ptrOrNull(rstd), dxp, dwp, dbp, m, n, ws.defined() ? devicePtr(ws) : nullptr, streamOf(x));
  COHORT_CUDA_CHECK_LAUNCH();
}

constexpr DeviceType kCuda = DeviceType::CUDA;

const dispatch::Register<nnd::SoftmaxKernel> kRegSoftmax{"softmax", kCuda, &softmaxCuda<false>};
const dispatch::Register<nnd::SoftmaxKernel> kRegLogSoftmax{"logSoftmax", kCuda, &softmaxCuda<true>};
const dispatch::Register<nnd::SoftmaxBackwardKernel> kRegSoftmaxBackward{"softmax backward", kCuda,
                                                                         &softmaxBackwardCuda<false>};
const dispatch::Register<nnd::SoftmaxBackwardKernel> kRegLogSoftmaxBackward{"logSoftmax backward", kCuda,
                                                                            &softmaxBackwardCuda<true>};
const dispatch::Register<nnd::NllForwardKernel> kRegNll{"nllLoss", kCuda, &nllForwardCuda};
const dispatch::Register<nnd::NllBackwardKernel> kRegNllBackward{"nllLoss backward", kCuda, &nllBackwardCuda};
const dispatch::Register<nnd::LayerNormKernel> kRegLayerNorm{"layerNorm", kCuda, &layerNormCuda};
const dispatch::Register<nnd::LayerNormBackwardKernel> kRegLayerNormBackward{"layerNorm backward", kCuda,
                                                                             &layerNormBackwardCuda};

}  // namespace
}  // namespace cohort::cuda::detail
