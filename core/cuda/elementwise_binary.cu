// Elementwise CUDA kernels, part 2: binary ops, comparisons, backward formulas and ternary ops.
// Each functor reproduces the CPU functor of the op (core/ops/elementwise.cc, compare.cc,
// activation.cc, inplace.cc) in the same compute type and order of operations. `x + s * y` and
// the like are written as on the CPU: g++ (-march=x86-64-v3, -std=c++20 contracts by default)
// and nvcc (-fmad=true) both fuse such a product and sum into one fma, so the roundings agree.
#include <cohort/core/cuda/detail/elementwise_device.cuh>

namespace cohort::cuda::detail {
namespace {

using namespace ew;

template <typename A>
struct AddF {
  __device__ auto operator()(A x, A y) const { return x + y; }
};
template <typename A>
struct SubF {
  __device__ auto operator()(A x, A y) const { return x - y; }
};
template <typename A>
struct MulF {
  __device__ auto operator()(A x, A y) const { return x * y; }
};
template <typename A>
struct DivF {
  __device__ auto operator()(A x, A y) const { return x / y; }
};
// torch.maximum/minimum: NaN in either operand gives NaN (compare.cc's maxValue/minValue).
template <typename A>
struct MaximumF {
  __device__ A operator()(A x, A y) const {
    A r = x > y ? x : y;
    if constexpr (std::is_floating_point_v<A>) r = y != y ? y : r;
    if constexpr (std::is_floating_point_v<A>) r = x != x ? x : r;
    return r;
  }
};
template <typename A>
struct MinimumF {
  __device__ A operator()(A x, A y) const {
    A r = x < y ? x : y;
    if constexpr (std::is_floating_point_v<A>) r = y != y ? y : r;
    if constexpr (std::is_floating_point_v<A>) r = x != x ? x : r;
    return r;
  }
};

template <typename A>
struct PowF {
  __device__ A operator()(A x, A y) const {
    if constexpr (std::is_floating_point_v<A>) return dpow(x, y);
    else return intPow<A>(x, y);
  }
};
template <typename A>
struct AddScaledF {
  A s;
  __device__ auto operator()(A x, A y) const { return x + s * y; }
};
template <typename A>
struct SubScaledF {
  A s;
  __device__ auto operator()(A x, A y) const { return x - s * y; }
};
// torch's lerp from the nearer end (inplace.cc's lerp_), so weight 1 gives exactly `end`.
template <typename A>
struct LerpF {
  A w;
  bool nearStart;  // |w| < 0.5, decided on the double weight
  __device__ A operator()(A x, A e) const { return nearStart ? x + w * (e - x) : e - (e - x) * (A(1) - w); }
};

// ---- backward formulas (g, saved) ---------------------------------------------------------------

template <typename A>
struct ReluBackwardF {
  __device__ A operator()(A g, A y) const { return y > A(0) ? g : A(0); }
};
template <typename A>
struct SigmoidBackwardF {
  __device__ A operator()(A g, A y) const { return g * (A(1) - y) * y; }
};
template <typename A>
struct TanhBackwardF {
  __device__ A operator()(A g, A y) const { return g * (A(1) - y * y); }
};
template <typename A>
struct SiluBackwardF {
  __device__ A operator()(A g, A x) const {
    const A s = dsigmoid(x);
    return g * s * (A(1) + x * (A(1) - s));
  }
};
template <typename A>
struct GeluTanhBackwardF {
  __device__ A operator()(A g, A x) const {
    const A kBeta = A(0.79788456080286535588), kKappa = A(0.044715);
    const A x2 = x * x;
    const A t = dtanh(kBeta * (x + kKappa * x2 * x));
    const A left = A(0.5) * x;
    const A right = A(1) + t;
    const A dRight = left * (A(1) - t * t) * kBeta * (A(1) + A(3) * kKappa * x2);
    return g * (A(0.5) * right + dRight);
  }
};
template <typename A>
struct GeluErfBackwardF {
  __device__ A operator()(A g, A x) const {
    const A cdf = A(0.5) * (A(1) + derf(x * A(0.70710678118654752440)));
    const A pdf = dexp(A(-0.5) * x * x) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
    return g * (cdf + x * pdf);
  }
};
template <typename A>
struct SqrtBackwardF {
  __device__ A operator()(A g, A y) const { return g / (y + y); }
};
template <typename A>
struct RsqrtBackwardF {
  __device__ A operator()(A g, A y) const { return A(-0.5) * g * y * y * y; }
};
template <typename A>
struct AbsBackwardF {
  __device__ A operator()(A g, A x) const { return x > A(0) ? g : (x < A(0) ? -g : A(0)); }
};
template <typename A>
struct ClampBackwardF {
  A lo, hi;
  __device__ A operator()(A g, A x) const { return (x >= lo) & (x <= hi) ? g : A(0); }
};

// ---- comparisons -----------------------------------------------------------------------------------

template <typename A>
struct EqF {
  __device__ bool operator()(A x, A y) const { return x == y; }
};
template <typename A>
struct NeF {
  __device__ bool operator()(A x, A y) const { return x != y; }
};
template <typename A>
struct LtF {
  __device__ bool operator()(A x, A y) const { return x < y; }
};
template <typename A>
struct LeF {
  __device__ bool operator()(A x, A y) const { return x <= y; }
};
template <typename A>
struct GtF {
  __device__ bool operator()(A x, A y) const { return x > y; }
};
template <typename A>
struct GeF {
  __device__ bool operator()(A x, A y) const { return x >= y; }
};

// ---- ternary -----------------------------------------------------------------------------------------

template <typename A>
struct PowBackwardBaseF {
  __device__ A operator()(A g, A x, A y) const { return y == A(0) ? A(0) : g * y * dpow(x, y - A(1)); }
};
template <typename A>
struct PowBackwardExponentF {
  __device__ A operator()(A g, A x, A y) const { return (x == A(0)) & (y >= A(0)) ? A(0) : g * dpow(x, y) * dlog(x); }
};
template <typename A, bool IsMax>
struct MaxMinBackwardF {
  __device__ A operator()(A g, A x, A y) const {
    const bool wins = IsMax ? x > y : x < y;
    return x == y ? g * A(0.5) : (wins ? g : A(0));
  }
};
template <typename A>
struct AddcmulF {
  A v;
  __device__ auto operator()(A x, A a, A b) const { return x + v * a * b; }
};
template <typename A>
struct AddcdivF {
  A v;
  __device__ auto operator()(A x, A a, A b) const { return x + v * a / b; }
};
template <typename B>
struct WhereF {
  __device__ B operator()(bool c, B a, B b) const { return c ? a : b; }
};

template <typename T>
bool binaryFor(EwOp op, const StridedIter<3>& it, const EwScalars& s, cudaStream_t st) {
  using A = Acc<T>;
  switch (op) {
    case EwOp::Add: launch<T, T, T>(it, AddF<A>{}, st); return true;
    case EwOp::Sub: launch<T, T, T>(it, SubF<A>{}, st); return true;
    case EwOp::Mul: launch<T, T, T>(it, MulF<A>{}, st); return true;
    case EwOp::Maximum: launch<T, T, T>(it, MaximumF<A>{}, st); return true;
    case EwOp::Minimum: launch<T, T, T>(it, MinimumF<A>{}, st); return true;
    case EwOp::AddScaled: launch<T, T, T>(it, AddScaledF<A>{pick<A>(s, 0)}, st); return true;
    case EwOp::SubScaled: launch<T, T, T>(it, SubScaledF<A>{pick<A>(s, 0)}, st); return true;
    case EwOp::Eq: launch<bool, T, T>(it, EqF<A>{}, st); return true;
    case EwOp::Ne: launch<bool, T, T>(it, NeF<A>{}, st); return true;
    case EwOp::Lt: launch<bool, T, T>(it, LtF<A>{}, st); return true;
    case EwOp::Le: launch<bool, T, T>(it, LeF<A>{}, st); return true;
    case EwOp::Gt: launch<bool, T, T>(it, GtF<A>{}, st); return true;
    case EwOp::Ge: launch<bool, T, T>(it, GeF<A>{}, st); return true;
    default: break;
  }
  if constexpr (!std::is_same_v<T, bool>) {
    if (op == EwOp::Pow) {
      launch<T, T, T>(it, PowF<A>{}, st);
      return true;
    }
  }
  if constexpr (kIsFloatType<T>) {
    switch (op) {
      case EwOp::Div: launch<T, T, T>(it, DivF<A>{}, st); return true;
      case EwOp::Lerp: launch<T, T, T>(it, LerpF<A>{pick<A>(s, 0), fabs(s.d[0]) < 0.5}, st); return true;
      case EwOp::ReluBackward: launch<T, T, T>(it, ReluBackwardF<A>{}, st); return true;
      case EwOp::SigmoidBackward: launch<T, T, T>(it, SigmoidBackwardF<A>{}, st); return true;
      case EwOp::TanhBackward: launch<T, T, T>(it, TanhBackwardF<A>{}, st); return true;
      case EwOp::SiluBackward: launch<T, T, T>(it, SiluBackwardF<A>{}, st); return true;
      case EwOp::GeluErfBackward: launch<T, T, T>(it, GeluErfBackwardF<A>{}, st); return true;
      case EwOp::GeluTanhBackward: launch<T, T, T>(it, GeluTanhBackwardF<A>{}, st); return true;
      case EwOp::SqrtBackward: launch<T, T, T>(it, SqrtBackwardF<A>{}, st); return true;
      case EwOp::RsqrtBackward: launch<T, T, T>(it, RsqrtBackwardF<A>{}, st); return true;
      case EwOp::AbsBackward: launch<T, T, T>(it, AbsBackwardF<A>{}, st); return true;
      case EwOp::ClampBackward:
        launch<T, T, T>(it, ClampBackwardF<A>{static_cast<A>(s.d[0]), static_cast<A>(s.d[1])}, st);
        return true;
      default: break;
    }
  }
  return false;
}

template <typename T>
bool ternaryFor(EwOp op, const StridedIter<4>& it, const EwScalars& s, cudaStream_t st) {
  using A = Acc<T>;
  if (op == EwOp::Where) {
    using B = typename BitsOf<sizeof(T)>::type;  // moves bits: NaN payloads kept as on the CPU
    launch<B, bool, B, B>(it, WhereF<B>{}, st);
    return true;
  }
  if (op == EwOp::Addcmul) {
    launch<T, T, T, T>(it, AddcmulF<A>{pick<A>(s, 0)}, st);
    return true;
  }
  if constexpr (kIsFloatType<T>) {
    switch (op) {
      case EwOp::Addcdiv: launch<T, T, T, T>(it, AddcdivF<A>{pick<A>(s, 0)}, st); return true;
      case EwOp::PowBackwardBase: launch<T, T, T, T>(it, PowBackwardBaseF<A>{}, st); return true;
      case EwOp::PowBackwardExponent: launch<T, T, T, T>(it, PowBackwardExponentF<A>{}, st); return true;
      case EwOp::MaximumBackward: launch<T, T, T, T>(it, MaxMinBackwardF<A, true>{}, st); return true;
      case EwOp::MinimumBackward: launch<T, T, T, T>(it, MaxMinBackwardF<A, false>{}, st); return true;
      default: break;
    }
  }
  return false;
}

}  // namespace

bool launchBinary(EwOp op, ElemType t, const StridedIter<3>& it, const EwScalars& s, cudaStream_t stream) {
  return dispatchType(t, [&]<typename T>() { return binaryFor<T>(op, it, s, stream); });
}

bool launchTernary(EwOp op, ElemType t, const StridedIter<4>& it, const EwScalars& s, cudaStream_t stream) {
  return dispatchType(t, [&]<typename T>() { return ternaryFor<T>(op, it, s, stream); });
}

}  // namespace cohort::cuda::detail
