// Matrix products through BLAS: mm, bmm, matmul, linear, addmm.
#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort {
namespace {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

struct MatArg {
  Tensor keep;  // holds a contiguous copy alive when one was needed
  const void* ptr = nullptr;
  blas::Trans trans = blas::Trans::No;
  int64_t ld = 1;
};

// Describes a [rows, cols] matrix view for row-major BLAS without copying when its strides allow.
MatArg matArg(const Tensor& t) {
  int64_t rows = t.size(0), cols = t.size(1);
  int64_t s0 = t.stride(0), s1 = t.stride(1);
  MatArg m;
  if ((s1 == 1 || cols == 1) && (s0 >= std::max<int64_t>(cols, 1) || rows == 1)) {
    m.ptr = t.dataPtr();
    m.trans = blas::Trans::No;
    m.ld = rows == 1 ? std::max<int64_t>(cols, 1) : s0;
    if (cols == 1 && rows > 1) m.ld = std::max<int64_t>(s0, 1);
    return m;
  }
  if ((s0 == 1 || rows == 1) && (s1 >= std::max<int64_t>(rows, 1) || cols == 1)) {
    m.ptr = t.dataPtr();
    m.trans = blas::Trans::Yes;
    m.ld = cols == 1 ? std::max<int64_t>(rows, 1) : s1;
    return m;
  }
  m.keep = t.contiguous();
  m.ptr = m.keep.dataPtr();
  m.trans = blas::Trans::No;
  m.ld = std::max<int64_t>(cols, 1);
  return m;
}

// The CPU's "matmul" kernel: BLAS for float types, a plain loop for the others.
void gemmCpu(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  DType dt = c.dtype();
  if (dt == DType::Float32 || dt == DType::Float64) {
    MatArg A = matArg(a), B = matArg(b);
    if (dt == DType::Float32)
      blas::sgemm(A.trans, B.trans, m, n, k, static_cast<float>(alpha), static_cast<const float*>(A.ptr), A.ld,
                  static_cast<const float*>(B.ptr), B.ld, static_cast<float>(beta), c.data<float>(), n);
    else
      blas::dgemm(A.trans, B.trans, m, n, k, alpha, static_cast<const double*>(A.ptr), A.ld,
                  static_cast<const double*>(B.ptr), B.ld, beta, c.data<double>(), n);
    return;
  }
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    // Half-width matrices accumulate in float32 and round once (blas::hgemm: oneDNN's matmul,
    // on AVX512-BF16 for bfloat16, else widened to float32).
    MatArg A = matArg(a), B = matArg(b);
    blas::hgemm(dt == DType::BFloat16 ? blas::HalfType::BFloat16 : blas::HalfType::Float16, /*cFloat32=*/false, A.trans,
                B.trans, m, n, k, static_cast<float>(alpha), static_cast<const uint16_t*>(A.ptr), A.ld,
                static_cast<const uint16_t*>(B.ptr), B.ld, static_cast<float>(beta), c.dataPtr(), n);
    return;
  }
  COHORT_DISPATCH_NUMERIC(dt, "matmul", [&]<typename T>() {
    Tensor ac = a.contiguous(), bc = b.contiguous();
    const T* pa = ac.data<T>();
    const T* pb = bc.data<T>();
    T* pc = c.data<T>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        Acc<T> s = 0;
        for (int64_t p = 0; p < k; ++p) s += static_cast<Acc<T>>(pa[i * k + p]) * static_cast<Acc<T>>(pb[p * n + j]);
        Acc<T> prev = beta == 0 ? Acc<T>(0) : static_cast<Acc<T>>(pc[i * n + j]);
        pc[i * n + j] =
            static_cast<T>(static_cast<Acc<T>>(alpha * static_cast<double>(s) + beta * static_cast<double>(prev)));
      }
  });
}

// c[m,n] (contiguous) = alpha * a[m,k] @ b[k,n] + beta * c. a, b, c share one dtype.
void gemmInto(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) c.zero_();
    else c.mul_(beta);
    return;
  }
  dispatch::kernel<dispatch::GemmKernel>("matmul", c.device())(a, b, c, alpha, beta);
}

// The CPU's "bmm" kernel: one GEMM per batch entry (k > 0).
void bmmCpu(const Tensor& a, const Tensor& b, Tensor& c) {
  for (int64_t i = 0; i < a.size(0); ++i) {
    Tensor ci = c.select(0, i);
    gemmCpu(a.select(0, i), b.select(0, i), ci, 1.0, 0.0);
  }
}

// y[rows, out] = x[rows, in] @ weight[out, in]^T + bias, with rows, out and in > 0: a kernel a
// device may register under "linear" to add the bias as the product is stored; without one, the
// op copies the bias into y and runs the GEMM with beta = 1.
using LinearBiasKernel = void(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y);

void linearBiasCpu(const Tensor& x2, const Tensor& weight, const Tensor& bias, Tensor& y) {
  const int64_t rows = x2.size(0), out = weight.size(0);
  if (y.dtype() == DType::Float32) {
    // The bias is added as the product is stored (blas::sgemmBias): one pass over the output.
    MatArg X = matArg(x2), W = matArg(weight.t());
    Tensor b = bias.contiguous();
    blas::sgemmBias(X.trans, W.trans, rows, out, x2.size(1), static_cast<const float*>(X.ptr), X.ld,
                    static_cast<const float*>(W.ptr), W.ld, b.data<float>(), y.data<float>(), out);
  } else if (y.dtype() == DType::BFloat16 || y.dtype() == DType::Float16) {
    // Likewise in half precision (blas::hgemmBias): the bias, widened to float32, is added to
    // the float32 product before the one rounding.
    MatArg X = matArg(x2), W = matArg(weight.t());
    Tensor b = bias.to(DType::Float32).contiguous();
    blas::hgemmBias(y.dtype() == DType::BFloat16 ? blas::HalfType::BFloat16 : blas::HalfType::Float16, X.trans, W.trans,
                    rows, out, x2.size(1), static_cast<const uint16_t*>(X.ptr), X.ld,
                    static_cast<const uint16_t*>(W.ptr), W.ld, b.data<float>(), static_cast<uint16_t*>(y.dataPtr()),
                    out);
  } else {
    y.copy_(bias.unsqueeze(0).expand({rows, out}));
    gemmCpu(x2, weight.t(), y, 1.0, 1.0);
  }
}

const dispatch::Register<dispatch::GemmKernel> kMatmulCpu{"matmul", DeviceType::CPU, &gemmCpu};
const dispatch::Register<dispatch::BatchedGemmKernel> kBmmCpu{"bmm", DeviceType::CPU, &bmmCpu};
const dispatch::Register<LinearBiasKernel> kLinearCpu{"linear", DeviceType::CPU, &linearBiasCpu};

void checkFloatOrSame(const Tensor& a, const Tensor& b, const char* op) {
  if (!a.defined() || !b.defined()) throw ValueError(fmt::format("{}: an input is undefined", op));
  if (a.dtype() != b.dtype())
    throw ValueError(
        fmt::format("{}: expected both inputs to have the same dtype, got {} and {}", op, a.dtype(), b.dtype()));
  if (a.device() != b.device())
    throw ValueError(fmt::format("{}: inputs are on different devices ({} and {})", op, a.device(), b.device()));
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("mm", a, b);
  COHORT_AUTOCAST("mm", mm, a, b);
  checkFloatOrSame(a, b, "mm");
  if (a.dim() != 2 || b.dim() != 2)
    throw ValueError(
        fmt::format("mm: expects 2-D tensors, got shapes {} and {}", shapeStr(a.sizes()), shapeStr(b.sizes())));
  if (a.size(1) != b.size(0))
    throw ValueError(fmt::format("mm: shapes {} and {} cannot be multiplied ({} != {})", shapeStr(a.sizes()),
                                 shapeStr(b.sizes()), a.size(1), b.size(0)));
  Tensor c = empty({a.size(0), b.size(1)}, {.dtype = a.dtype(), .device = a.device()});
  {
    autograd::NoGradGuard ng;
    gemmInto(a, b, c, 1.0, 0.0);
  }
  autograd::record("mm", {a, b}, {c}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList out(2);
    if (ctx.needsInputGrad(0)) out[0] = mm(g[0], ctx.saved(1).t());
    if (ctx.needsInputGrad(1)) out[1] = mm(ctx.saved(0).t(), g[0]);
    return out;
  });
  return c;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("bmm", a, b);
  COHORT_AUTOCAST("bmm", bmm, a, b);
  checkFloatOrSame(a, b, "bmm");
  if (a.dim() != 3 || b.dim() != 3)
    throw ValueError(
        fmt::format("bmm: expects 3-D tensors, got shapes {} and {}", shapeStr(a.sizes()), shapeStr(b.sizes())));
  if (a.size(0) != b.size(0) || a.size(2) != b.size(1))
    throw ValueError(
        fmt::format("bmm: shapes {} and {} cannot be multiplied", shapeStr(a.sizes()), shapeStr(b.sizes())));
  int64_t batch = a.size(0);
  Tensor c = empty({batch, a.size(1), b.size(2)}, {.dtype = a.dtype(), .device = a.device()});
  {
    autograd::NoGradGuard ng;
    if (a.size(2) == 0) c.zero_();
    else if (c.numel() > 0) dispatch::kernel<dispatch::BatchedGemmKernel>("bmm", c.device())(a, b, c);
  }
  autograd::record("bmm", {a, b}, {c}, {a, b}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList out(2);
    if (ctx.needsInputGrad(0)) out[0] = bmm(g[0], ctx.saved(1).transpose(1, 2));
    if (ctx.needsInputGrad(1)) out[1] = bmm(ctx.saved(0).transpose(1, 2), g[0]);
    return out;
  });
  return c;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("matmul", a, b);
  COHORT_AUTOCAST("matmul", matmul, a, b);
  checkFloatOrSame(a, b, "matmul");
  int64_t da = a.dim(), db = b.dim();
  if (da == 0 || db == 0)
    throw ValueError(fmt::format("matmul: both arguments need at least 1 dim, got shapes {} and {}",
                                 shapeStr(a.sizes()), shapeStr(b.sizes())));
  if (da == 1 && db == 1) {
    if (a.size(0) != b.size(0))
      throw ValueError(fmt::format("matmul: 1-D tensors of sizes {} and {} differ", a.size(0), b.size(0)));
    return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  }
  if (da == 2 && db == 2) return mm(a, b);
  if (da == 1 && db == 2) return mm(a.unsqueeze(0), b).squeeze(0);
  if (da == 2 && db == 1) return mm(a, b.unsqueeze(1)).squeeze(1);
  if (db == 1) {  // [..., n, k] @ [k]
    Tensor r = matmul(a, b.unsqueeze(1));
    return r.squeeze(-1);
  }
  if (da == 1) {  // [k] @ [..., k, m]
    Tensor r = matmul(a.unsqueeze(0), b);
    return r.squeeze(-2);
  }
  if (db == 2) {  // [..., n, k] @ [k, m]: fold the batch into rows, one GEMM
    if (a.size(-1) != b.size(0))
      throw ValueError(fmt::format("matmul: shapes {} and {} cannot be multiplied ({} != {})", shapeStr(a.sizes()),
                                   shapeStr(b.sizes()), a.size(-1), b.size(0)));
    Shape out = a.sizes();
    out.back() = b.size(1);
    return mm(a.reshape({-1, a.size(-1)}), b).view(out);
  }
  // Batched: broadcast the batch dims.
  Shape ba(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  Shape batch = broadcastShapes(ba, bb, "matmul");
  int64_t n = a.size(-2), k = a.size(-1), k2 = b.size(-2), m = b.size(-1);
  if (k != k2)
    throw ValueError(fmt::format("matmul: shapes {} and {} cannot be multiplied ({} != {})", shapeStr(a.sizes()),
                                 shapeStr(b.sizes()), k, k2));
  Shape ea = batch, eb = batch;
  ea.push_back(n);
  ea.push_back(k);
  eb.push_back(k);
  eb.push_back(m);
  int64_t nb = shapeNumel(batch);
  Tensor r = bmm(a.expand(ea).reshape({nb, n, k}), b.expand(eb).reshape({nb, k, m}));
  Shape out = batch;
  out.push_back(n);
  out.push_back(m);
  return r.view(out);
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  COHORT_RECORD_OP("linear", input, weight, bias);
  COHORT_AUTOCAST("linear", linear, input, weight, bias);
  checkFloatOrSame(input, weight, "linear");
  if (weight.dim() != 2)
    throw ValueError(fmt::format("linear: weight must be 2-D [out, in], got shape {}", shapeStr(weight.sizes())));
  if (input.dim() == 0 || input.size(-1) != weight.size(1))
    throw ValueError(fmt::format("linear: input of shape {} does not match weight of shape {} (expected last dim {})",
                                 shapeStr(input.sizes()), shapeStr(weight.sizes()), weight.size(1)));
  int64_t out = weight.size(0);
  if (bias.defined() &&
      (bias.dim() != 1 || bias.size(0) != out || bias.dtype() != input.dtype() || bias.device() != input.device()))
    throw ValueError(fmt::format("linear: bias must be [{}] of {} on {}, got shape {} ({} on {})", out, input.dtype(),
                                 input.device(), shapeStr(bias.sizes()), bias.dtype(), bias.device()));
  Tensor x2 = input.dim() == 2 ? input : input.detach().reshape({-1, input.size(-1)});
  int64_t rows = x2.size(0);
  Tensor y = empty({rows, out}, {.dtype = input.dtype(), .device = input.device()});
  {
    autograd::NoGradGuard ng;
    LinearBiasKernel* fused = bias.defined() && rows > 0 && out > 0 && x2.size(1) > 0
                                  ? dispatch::find<LinearBiasKernel>("linear", y.device())
                                  : nullptr;
    if (fused != nullptr) {
      fused(x2, weight, bias, y);
    } else {
      double beta = 0.0;
      if (bias.defined() && rows > 0) {
        y.copy_(bias.unsqueeze(0).expand({rows, out}));
        beta = 1.0;
      }
      gemmInto(x2, weight.t(), y, 1.0, beta);
    }
  }
  Shape outShape = input.sizes();
  outShape.back() = out;
  Tensor result = input.dim() == 2 ? y : y.view(outShape);
  Shape inShape = input.sizes();
  autograd::record("linear", {input, weight, bias}, {result}, {input, weight},
                   [inShape](Ctx& ctx, const GradList& g) -> GradList {
                     Tensor x = ctx.saved(0), w = ctx.saved(1);
                     Tensor g2 = g[0].reshape({-1, g[0].size(-1)});
                     GradList r(3);
                     // The input's gradient first, handed on at once: when it goes to another
                     // worker it travels while the weight's gradient is computed.
                     if (ctx.needsInputGrad(0)) {
                       r[0] = mm(g2, w).view(inShape);
                       if (ctx.emit(0, r[0])) r[0] = Tensor();
                     }
                     if (ctx.needsInputGrad(1)) {
                       Tensor x2 = x.reshape({-1, x.size(-1)});
                       // The weight's gradient straight into its .grad (or DDP's bucket) when
                       // the engine offers it: no temporary, no second pass to add or copy.
                       autograd::GradSink sink = ctx.gradSink(1);
                       if (sink.target.defined() && sink.target.dtype() == g2.dtype()) {
                         gemmInto(g2.t(), x2, sink.target, 1.0, sink.accumulate ? 1.0 : 0.0);
                         sink.target.bumpVersion();
                         r[1] = sink.target;
                       } else {
                         r[1] = mm(g2.t(), x2);
                       }
                     }
                     if (ctx.needsInputGrad(2)) r[2] = g2.sum({0});
                     return r;
                   });
  return result;
}

Tensor addmm(const Tensor& self, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  COHORT_RECORD_OP("addmm", self, a, b, beta, alpha);
  COHORT_AUTOCAST("addmm", addmm, self, a, b, beta, alpha);
  checkFloatOrSame(a, b, "addmm");
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0))
    throw ValueError(
        fmt::format("addmm: shapes {} and {} cannot be multiplied", shapeStr(a.sizes()), shapeStr(b.sizes())));
  Shape outShape{a.size(0), b.size(1)};
  if (broadcastShapes(self.sizes(), outShape, "addmm") != outShape)
    throw ValueError(
        fmt::format("addmm: self of shape {} does not broadcast to {}", shapeStr(self.sizes()), shapeStr(outShape)));
  Tensor c = empty(outShape, {.dtype = a.dtype(), .device = a.device()});
  double be = beta.toDouble(), al = alpha.toDouble();
  {
    autograd::NoGradGuard ng;
    if (be != 0) c.copy_(self);
    gemmInto(a, b, c, al, be);
  }
  autograd::record("addmm", {self, a, b}, {c}, {a, b}, [be, al](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(3);
    if (ctx.needsInputGrad(0)) r[0] = g[0] * be;
    if (ctx.needsInputGrad(1)) r[1] = mm(g[0], ctx.saved(1).t()) * al;
    if (ctx.needsInputGrad(2)) r[2] = mm(ctx.saved(0).t(), g[0]) * al;
    return r;
  });
  return c;
}

}  // namespace cohort
