// Comparisons (bool results), where, maximum and minimum, all broadcasting. Operands are compared
// in their promoted dtype, as in torch.
#include <array>

#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/elementwise_impl.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>

namespace cohort {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

// ---- comparisons ---------------------------------------------------------------------------------

Tensor eq(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("eq", a, b);
  return detail::compareOp(a, b, "eq");
}
Tensor ne(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("ne", a, b);
  return detail::compareOp(a, b, "ne");
}
Tensor lt(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("lt", a, b);
  return detail::compareOp(a, b, "lt");
}
Tensor le(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("le", a, b);
  return detail::compareOp(a, b, "le");
}
Tensor gt(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("gt", a, b);
  return detail::compareOp(a, b, "gt");
}
Tensor ge(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("ge", a, b);
  return detail::compareOp(a, b, "ge");
}

// ---- maximum / minimum ---------------------------------------------------------------------------

namespace {

// NaN in either operand gives NaN (torch.maximum/minimum propagate NaN).
template <typename A>
inline A maxValue(A x, A y) {
  A r = x > y ? x : y;
  if constexpr (std::is_floating_point_v<A>) r = y != y ? y : r;
  if constexpr (std::is_floating_point_v<A>) r = x != x ? x : r;
  return r;
}
template <typename A>
inline A minValue(A x, A y) {
  A r = x < y ? x : y;
  if constexpr (std::is_floating_point_v<A>) r = y != y ? y : r;
  if constexpr (std::is_floating_point_v<A>) r = x != x ? x : r;
  return r;
}

Tensor maxMin(const Tensor& a, const Tensor& b, bool isMax) {
  const char* op = isMax ? "maximum" : "minimum";
  Tensor out = detail::binaryOp(a, b, op);
  autograd::record(op, {a, b}, {out}, {a, b}, [isMax](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(2);
    Tensor x = ctx.saved(0), y = ctx.saved(1);
    // The first operand's gradient: g where it won, g/2 on ties, 0 where it lost.
    const char* backward = isMax ? "maximum backward" : "minimum backward";
    if (ctx.needsInputGrad(0)) r[0] = detail::ternaryFloatOp(g[0], x, y, backward);
    if (ctx.needsInputGrad(1)) r[1] = detail::ternaryFloatOp(g[0], y, x, backward);
    return r;
  });
  return out;
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("maximum", a, b);
  return maxMin(a, b, true);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("minimum", a, b);
  return maxMin(a, b, false);
}

// ---- where ---------------------------------------------------------------------------------------

namespace {

// out = cond ? a : b over operands already broadcast-compatible with out and of out's dtype
// (cond bool).
template <typename T>
void whereKernel(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape& shape = out.sizes();
  if (out.numel() == 0) return;
  std::array<char*, 4> ptrs{static_cast<char*>(out.dataPtr()), static_cast<char*>(cond.dataPtr()),
                            static_cast<char*>(a.dataPtr()), static_cast<char*>(b.dataPtr())};
  std::array<Shape, 4> strides{detail::broadcastByteStrides(out, shape), detail::broadcastByteStrides(cond, shape),
                               detail::broadcastByteStrides(a, shape), detail::broadcastByteStrides(b, shape)};
  detail::forEachStrided<4>(shape, ptrs, strides,
                            [](std::array<char*, 4> p, const std::array<int64_t, 4>& s, int64_t n) {
                              if (s[0] == sizeof(T) && s[1] == 1 && s[2] == sizeof(T) && s[3] == sizeof(T)) {
                                T* o = reinterpret_cast<T*>(p[0]);
                                const uint8_t* c =
                                    reinterpret_cast<const uint8_t*>(p[1]);  // bool storage; uint8 vectorizes
                                const T* x = reinterpret_cast<const T*>(p[2]);
                                const T* y = reinterpret_cast<const T*>(p[3]);
                                // Both loads unconditional, so the select is branch-free and vectorizes.
                                for (int64_t i = 0; i < n; ++i) {
                                  const T xv = x[i], yv = y[i];
                                  o[i] = c[i] != 0 ? xv : yv;
                                }
                              } else {
                                for (int64_t i = 0; i < n; ++i)
                                  *reinterpret_cast<T*>(p[0] + i * s[0]) =
                                      *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                          ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                          : *reinterpret_cast<const T*>(p[3] + i * s[3]);
                              }
                            });
}

Tensor whereRaw(const Tensor& cond, const Tensor& a, const Tensor& b, DType dt, const Shape& shape) {
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  dispatch::kernel<dispatch::WhereKernel>("where", out.device())(out, cond, ac, bc);
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  COHORT_RECORD_OP("where", cond, a, b);
  if (!cond.defined()) throw ValueError("where: the condition tensor is undefined");
  detail::checkBinary(a, b, "where");
  detail::checkBinary(cond, a, "where");
  if (cond.dtype() != DType::Bool)
    throw ValueError(fmt::format("where: the condition must be a bool tensor, got {} (shape {})", cond.dtype(),
                                 shapeStr(cond.sizes())));
  DType dt = detail::resultType(a, b);
  Shape shape = detail::broadcastShapes3(cond.sizes(), a.sizes(), b.sizes(), "where");
  Tensor out = whereRaw(cond, a, b, dt, shape);
  autograd::record("where", {cond, a, b}, {out}, {cond}, [](Ctx& ctx, const GradList& g) -> GradList {
    GradList r(3);
    Tensor c = ctx.saved(0);
    Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
    if (ctx.needsInputGrad(1)) r[1] = whereRaw(c, g[0], zero, g[0].dtype(), g[0].sizes());
    if (ctx.needsInputGrad(2)) r[2] = whereRaw(c, zero, g[0], g[0].dtype(), g[0].sizes());
    return r;
  });
  return out;
}

// ---- CPU kernels ---------------------------------------------------------------------------------

namespace {

constexpr auto kEq = [](auto x, auto y) COHORT_KERNEL_FN { return x == y; };
constexpr auto kNe = [](auto x, auto y) COHORT_KERNEL_FN { return x != y; };
constexpr auto kLt = [](auto x, auto y) COHORT_KERNEL_FN { return x < y; };
constexpr auto kLe = [](auto x, auto y) COHORT_KERNEL_FN { return x <= y; };
constexpr auto kGt = [](auto x, auto y) COHORT_KERNEL_FN { return x > y; };
constexpr auto kGe = [](auto x, auto y) COHORT_KERNEL_FN { return x >= y; };
constexpr auto kMaximum = [](auto x, auto y) COHORT_KERNEL_FN { return maxValue(x, y); };
constexpr auto kMinimum = [](auto x, auto y) COHORT_KERNEL_FN { return minValue(x, y); };
// The gradient of the first operand of maximum (minimum): g where it is the greater (smaller), g/2
// on ties, 0 where it lost.
constexpr auto kMaximumBackward = [](auto gv, auto xv, auto yv) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return xv == yv ? gv * A(0.5) : (xv > yv ? gv : A(0));
};
constexpr auto kMinimumBackward = [](auto gv, auto xv, auto yv) COHORT_KERNEL_FN {
  using A = decltype(gv);
  return xv == yv ? gv * A(0.5) : (xv < yv ? gv : A(0));
};

void whereCpu(Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  COHORT_DISPATCH(out.dtype(), "where", [&]<typename T>() { whereKernel<T>(out, cond, a, b); });
}

const bool kCpuKernels = [] {
  using namespace dispatch;
  constexpr DeviceType kCpu = DeviceType::CPU;
  Register<BinaryKernel>("eq", kCpu, &detail::cpuCompare<decltype(kEq)>);
  Register<BinaryKernel>("ne", kCpu, &detail::cpuCompare<decltype(kNe)>);
  Register<BinaryKernel>("lt", kCpu, &detail::cpuCompare<decltype(kLt)>);
  Register<BinaryKernel>("le", kCpu, &detail::cpuCompare<decltype(kLe)>);
  Register<BinaryKernel>("gt", kCpu, &detail::cpuCompare<decltype(kGt)>);
  Register<BinaryKernel>("ge", kCpu, &detail::cpuCompare<decltype(kGe)>);
  Register<BinaryKernel>("maximum", kCpu, &detail::cpuBinary<decltype(kMaximum)>);
  Register<BinaryKernel>("minimum", kCpu, &detail::cpuBinary<decltype(kMinimum)>);
  Register<TernaryKernel>("maximum backward", kCpu, &detail::cpuTernaryFloat<decltype(kMaximumBackward)>);
  Register<TernaryKernel>("minimum backward", kCpu, &detail::cpuTernaryFloat<decltype(kMinimumBackward)>);
  Register<WhereKernel>("where", kCpu, &whereCpu);
  return true;
}();

}  // namespace

}  // namespace cohort
