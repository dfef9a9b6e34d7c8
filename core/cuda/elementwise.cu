// Elementwise CUDA kernels, part 1: unary ops (with and without scalars), fill and dtype-converting
// copies. Each functor reproduces the CPU functor of the op (core/ops/elementwise.cc,
// activation.cc, core/tensor/views.cc) in the same compute type and order of operations; binary
// and ternary ops are in elementwise_binary.cu.
#include <cohort/core/cuda/detail/elementwise_device.cuh>

namespace cohort::cuda::detail {
namespace {

using namespace ew;

// ---- unary functors (A: the compute type) -------------------------------------------------------

template <typename A>
struct NegF {
  __device__ auto operator()(A x) const { return -x; }
};
template <typename A>
struct AbsF {
  __device__ A operator()(A x) const {
    if constexpr (std::is_floating_point_v<A>) return dfabs(x);
    else if constexpr (std::is_unsigned_v<A>) return x;
    else return x < 0 ? A(-x) : x;
  }
};
template <typename A>
struct ReluF {
  __device__ A operator()(A x) const { return x > A(0) ? x : (x != x ? x : A(0)); }  // NaN stays NaN
};
template <typename A>
struct ExpF {
  __device__ A operator()(A x) const { return dexp(x); }
};
template <typename A>
struct LogF {
  __device__ A operator()(A x) const { return dlog(x); }
};
template <typename A>
struct SqrtF {
  __device__ A operator()(A x) const { return dsqrt(x); }
};
template <typename A>
struct RsqrtF {
  __device__ A operator()(A x) const { return A(1) / dsqrt(x); }
};
template <typename A>
struct SigmoidF {
  __device__ A operator()(A x) const { return dsigmoid(x); }
};
template <typename A>
struct TanhF {
  __device__ A operator()(A x) const { return dtanh(x); }
};
template <typename A>
struct SiluF {
  __device__ A operator()(A x) const { return x * dsigmoid(x); }
};
// gelu(x) = x Phi(x). float: through erfc, which keeps the negative tail's relative accuracy as the
// CPU's vecmath::geluErf does; double: the CPU's 0.5 x (1 + erf(x / sqrt 2)).
template <typename A>
struct GeluErfF {
  __device__ A operator()(A x) const {
    if constexpr (std::is_same_v<A, float>) return x * 0.5f * erfcf(-x * 0.70710678118654752440f);
    else return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
  }
};
template <typename A>
struct GeluTanhF {
  __device__ A operator()(A x) const {
    if constexpr (std::is_same_v<A, float>) {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return x / (1.0f + expf(-2.0f * inner));
    } else {
      const double inner = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
      return 0.5 * x * (1.0 + tanh(inner));
    }
  }
};

template <typename A>
struct AddScalarF {
  A s;
  __device__ auto operator()(A x) const { return x + s; }
};
template <typename A>
struct MulScalarF {
  A s;
  __device__ auto operator()(A x) const { return x * s; }
};
template <typename A>
struct DivScalarF {
  A s;
  __device__ auto operator()(A x) const { return x / s; }
};
template <typename A>
struct RsubScalarF {
  A s;
  __device__ auto operator()(A x) const { return s - x; }
};
template <typename A>
struct ClampBothF {
  A lo, hi;
  __device__ A operator()(A x) const {
    const A r = x < lo ? lo : x;
    return r > hi ? hi : r;
  }
};
template <typename A>
struct ClampLoF {
  A lo;
  __device__ A operator()(A x) const { return x < lo ? lo : x; }
};
template <typename A>
struct ClampHiF {
  A hi;
  __device__ A operator()(A x) const { return x > hi ? hi : x; }
};

// x^e with a constant exponent: the CPU's powScalarKernel. Short forms for the common exponents;
// float (and half) small integer exponents |e| <= 8 as products in double in the CPU's exact order
// (intPowD: v^2k = (v^k)^2, v^(2k+1) = v * v^2k), one reciprocal, one rounding.
template <typename A>
struct PowScalarF {
  double e;
  A ei;  // integer dtypes: the exponent in T
  __device__ A operator()(A v) const {
    if constexpr (std::is_integral_v<A>) {
      return intPow<A>(v, ei);
    } else {
      if (e == 0) return A(1);
      if (e == 1) return v;
      if (e == 2) return v * v;
      if (e == 3) return v * v * v;
      if (e == 0.5) return dsqrt(v);
      if (e == -0.5) return A(1) / dsqrt(v);
      if (e == -1) return A(1) / v;
      if (e == -2) return A(1) / (v * v);
      if constexpr (std::is_same_v<A, float>) {
        if (fabs(e) <= 8 && trunc(e) == e) {
          const int k = static_cast<int>(fabs(e));
          const double p1 = v, p2 = p1 * p1, p3 = p1 * p2, p4 = p2 * p2;
          double p = 1.0;
          switch (k) {
            case 1: p = p1; break;
            case 2: p = p2; break;
            case 3: p = p3; break;
            case 4: p = p4; break;
            case 5: p = p1 * p4; break;
            case 6: p = p3 * p3; break;
            case 7: p = p1 * (p3 * p3); break;
            case 8: p = p4 * p4; break;
            default: break;
          }
          return static_cast<float>(e < 0 ? 1.0 / p : p);
        }
        return static_cast<float>(pow(static_cast<double>(v), e));
      } else {
        return pow(v, e);
      }
    }
  }
};

template <typename T>
bool unaryFor(EwOp op, const StridedIter<2>& it, const EwScalars& s, cudaStream_t st) {
  using A = Acc<T>;
  constexpr bool isFloat = kIsFloatType<T>;
  constexpr bool isBool = std::is_same_v<T, bool>;
  switch (op) {
    case EwOp::AddScalar: launch<T, T>(it, AddScalarF<A>{pick<A>(s, 0)}, st); return true;
    case EwOp::MulScalar: launch<T, T>(it, MulScalarF<A>{pick<A>(s, 0)}, st); return true;
    case EwOp::RsubScalar: launch<T, T>(it, RsubScalarF<A>{pick<A>(s, 0)}, st); return true;
    default: break;
  }
  if constexpr (!isBool) {
    switch (op) {
      case EwOp::Neg: launch<T, T>(it, NegF<A>{}, st); return true;
      case EwOp::Abs: launch<T, T>(it, AbsF<A>{}, st); return true;
      case EwOp::Relu: launch<T, T>(it, ReluF<A>{}, st); return true;
      case EwOp::ClampBoth: launch<T, T>(it, ClampBothF<A>{pick<A>(s, 0), pick<A>(s, 1)}, st); return true;
      case EwOp::ClampLo: launch<T, T>(it, ClampLoF<A>{pick<A>(s, 0)}, st); return true;
      case EwOp::ClampHi: launch<T, T>(it, ClampHiF<A>{pick<A>(s, 1)}, st); return true;
      case EwOp::PowScalar: launch<T, T>(it, PowScalarF<A>{s.d[0], pick<A>(s, 0)}, st); return true;
      default: break;
    }
  }
  if constexpr (isFloat) {
    switch (op) {
      case EwOp::Exp: launch<T, T>(it, ExpF<A>{}, st); return true;
      case EwOp::Log: launch<T, T>(it, LogF<A>{}, st); return true;
      case EwOp::Sqrt: launch<T, T>(it, SqrtF<A>{}, st); return true;
      case EwOp::Rsqrt: launch<T, T>(it, RsqrtF<A>{}, st); return true;
      case EwOp::Sigmoid: launch<T, T>(it, SigmoidF<A>{}, st); return true;
      case EwOp::Tanh: launch<T, T>(it, TanhF<A>{}, st); return true;
      case EwOp::Silu: launch<T, T>(it, SiluF<A>{}, st); return true;
      case EwOp::GeluErf: launch<T, T>(it, GeluErfF<A>{}, st); return true;
      case EwOp::GeluTanh: launch<T, T>(it, GeluTanhF<A>{}, st); return true;
      case EwOp::DivScalar: launch<T, T>(it, DivScalarF<A>{pick<A>(s, 0)}, st); return true;
      default: break;
    }
  }
  return false;
}

// ---- fill and copies ------------------------------------------------------------------------------

template <typename A>
struct FillF {
  A v;
  __device__ A operator()() const { return v; }
};

// copy_'s conversion: to bool by v != 0, otherwise static_cast to the destination's compute type
// (so double -> half rounds to float first, as on the CPU), then stored.
template <typename D, typename S>
struct CopyF {
  __device__ auto operator()(Acc<S> v) const {
    if constexpr (std::is_same_v<D, bool>) return v != Acc<S>(0);
    else return static_cast<Acc<D>>(v);
  }
};

template <typename B>
struct BitsF {
  __device__ B operator()(B v) const { return v; }
};

template <typename D>
bool copyFrom(ElemType src, const StridedIter<2>& it, cudaStream_t st) {
  return dispatchType(src, [&]<typename S>() {
    launch<D, S>(it, CopyF<D, S>{}, st);
    return true;
  });
}

}  // namespace

bool launchUnary(EwOp op, ElemType t, const StridedIter<2>& it, const EwScalars& s, cudaStream_t stream) {
  return dispatchType(t, [&]<typename T>() { return unaryFor<T>(op, it, s, stream); });
}

void launchFill(ElemType t, const StridedIter<1>& it, const EwScalars& s, cudaStream_t stream) {
  dispatchType(t, [&]<typename T>() {
    launch<T>(it, FillF<Acc<T>>{pick<Acc<T>>(s, 0)}, stream);
    return true;
  });
}

void launchCopy(ElemType dst, ElemType src, const StridedIter<2>& it, cudaStream_t stream) {
  if (dst == src) {
    // Same dtype: move the bits (a strided or broadcasting copy).
    switch (elemSize(dst)) {
      case 1: launch<uint8_t, uint8_t>(it, BitsF<uint8_t>{}, stream); return;
      case 2: launch<uint16_t, uint16_t>(it, BitsF<uint16_t>{}, stream); return;
      case 4: launch<uint32_t, uint32_t>(it, BitsF<uint32_t>{}, stream); return;
      default: launch<uint64_t, uint64_t>(it, BitsF<uint64_t>{}, stream); return;
    }
  }
  dispatchType(dst, [&]<typename D>() { return copyFrom<D>(src, it, stream); });
}

}  // namespace cohort::cuda::detail
