// Device side of the elementwise kernels (internal to core/cuda, included by the elementwise .cu
// files only): loads and stores that convert like the CPU kernels, the strided offset
// computation, the one kernel template and its launcher.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cohort/core/cuda/detail/elementwise_kernels.h>

namespace cohort::cuda::detail::ew {

// The compute type: float for the half types, the type itself otherwise (Acc<T> on the CPU).
template <typename T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<__half> {
  using type = float;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <typename T>
using Acc = typename AccOf<T>::type;

template <typename T>
inline constexpr bool kIsHalfType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
inline constexpr bool kIsFloatType = std::is_floating_point_v<T> || kIsHalfType<T>;

// Raw storage of a given width, for ops that move bits without looking at them (where, copies
// between equal dtypes), so NaN payloads survive as in the CPU's plain assignments.
template <int Bytes>
struct BitsOf;
template <>
struct BitsOf<1> {
  using type = uint8_t;
};
template <>
struct BitsOf<2> {
  using type = uint16_t;
};
template <>
struct BitsOf<4> {
  using type = uint32_t;
};
template <>
struct BitsOf<8> {
  using type = uint64_t;
};

template <typename T>
__device__ __forceinline__ Acc<T> load(const char* p) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(*reinterpret_cast<const __half*>(p));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  else return *reinterpret_cast<const T*>(p);
}

// float -> half as cohort::Half(float): round to nearest even, and NaN becomes the quiet NaN
// sign | 0x7e00 (the hardware conversion gives 0x7fff).
__device__ __forceinline__ __half halfFromFloat(float f) {
  if (f != f) {
    const unsigned sign = (__float_as_uint(f) >> 16) & 0x8000u;
    return __ushort_as_half(static_cast<unsigned short>(sign | 0x7e00u));
  }
  return __float2half_rn(f);
}

// float -> bfloat16 exactly as cohort::BFloat16::fromFloat (same integer steps).
__device__ __forceinline__ __nv_bfloat16 bf16FromFloat(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return __ushort_as_bfloat16(static_cast<unsigned short>((u + rounding) >> 16));
}

// static_cast<T>(v) of the CPU kernels (half types from float).
template <typename T, typename V>
__device__ __forceinline__ T toStorage(V v) {
  if constexpr (std::is_same_v<T, __half>) return halfFromFloat(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return bf16FromFloat(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Byte offsets of element `rem` (row-major index over it.sizes, innermost dim last) for every operand.
template <int N, typename I>
__device__ __forceinline__ void stridedOffsets(const StridedIter<N>& it, I rem, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = it.ndim - 1; d >= 1; --d) {
    const I size = static_cast<I>(it.sizes[d]);
    const I q = rem / size;
    const int64_t idx = static_cast<int64_t>(rem - q * size);
    rem = q;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += idx * it.strides[k][d];
  }
  // The outermost dim needs no division (rem < sizes[0]); with ndim == 0, rem is 0.
  if (it.ndim >= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(rem) * it.strides[k][0];
  }
}

template <typename F, typename TOut, typename... TIn, size_t... K>
__device__ __forceinline__ void applyAt(const F& f, char* const* data, const int64_t* off, std::index_sequence<K...>) {
  *reinterpret_cast<TOut*>(data[0] + off[0]) = toStorage<TOut>(f(load<TIn>(data[K + 1] + off[K + 1])...));
}

// Grid-stride loop over the linear index; I is uint32_t when numel fits (cheaper div/mod).
template <typename I, typename F, typename TOut, typename... TIn>
__device__ __forceinline__ void ewLoop(const StridedIter<1 + sizeof...(TIn)>& it, const F& f) {
  constexpr int N = 1 + sizeof...(TIn);
  const I n = static_cast<I>(it.numel);
  const I step = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
  const bool contiguous = it.contiguous;
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < n; i += step) {
    int64_t off[N];
    if (contiguous) {
      const int64_t elem[N] = {static_cast<int64_t>(sizeof(TOut)), static_cast<int64_t>(sizeof(TIn))...};
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = static_cast<int64_t>(i) * elem[k];
    } else {
      stridedOffsets<N, I>(it, i, off);
    }
    applyAt<F, TOut, TIn...>(f, it.data, off, std::index_sequence_for<TIn...>{});
  }
}

// ---- the vectorised loop: kVec neighbours along the innermost dim per thread ----------------------
// One offset computation and one wide load or store per operand for kVec elements (8 bytes for
// 16-bit types, 16 for float). Taken when every operand's innermost dim is dense or broadcast
// (stride 0: one element, repeated), the innermost size is a multiple of kVec (or there is one dim
// only: a scalar loop does the tail), and every dense operand's start and outer strides are
// multiples of kVec elements, so each group of kVec is aligned (vectorizable()).
inline constexpr int kVec = 4;

template <typename T>
struct alignas(sizeof(T) * kVec) VecOf {
  T v[kVec];
};

template <typename T>
__device__ __forceinline__ Acc<T> toAcc(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return v;
}

template <typename T>
struct Lanes {
  Acc<T> v[kVec];
};

template <typename T>
__device__ __forceinline__ Lanes<T> loadLanes(const char* p, bool broadcast) {
  Lanes<T> r;
  if (broadcast) {
    const Acc<T> x = load<T>(p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) r.v[j] = x;
  } else {
    const VecOf<T> raw = *reinterpret_cast<const VecOf<T>*>(p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) r.v[j] = toAcc<T>(raw.v[j]);
  }
  return r;
}

// The inputs' lanes arrive as arguments, so every load is issued before the first result.
template <typename F, typename TOut, typename... L>
__device__ __forceinline__ void storeLanes(const F& f, char* out, const L&... lanes) {
  VecOf<TOut> r;
#pragma unroll
  for (int j = 0; j < kVec; ++j) r.v[j] = toStorage<TOut>(f(lanes.v[j]...));
  *reinterpret_cast<VecOf<TOut>*>(out) = r;
}

template <typename F, typename TOut, typename... TIn, size_t... K>
__device__ __forceinline__ void applyVecAt(const F& f, char* const* data, const int64_t* off, const bool* broadcast,
                                           std::index_sequence<K...>) {
  storeLanes<F, TOut>(f, data[0] + off[0], loadLanes<TIn>(data[K + 1] + off[K + 1], broadcast[K + 1])...);
}

template <typename I, typename F, typename TOut, typename... TIn>
__device__ __forceinline__ void ewLoopVec(const StridedIter<1 + sizeof...(TIn)>& it, const F& f) {
  constexpr int N = 1 + sizeof...(TIn);
  const int last = it.ndim - 1;
  bool broadcast[N];
#pragma unroll
  for (int k = 0; k < N; ++k) broadcast[k] = it.strides[k][last] == 0;
  const I n = static_cast<I>(it.numel);
  const I groups = n / kVec;
  const I step = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
  const I first = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
  for (I g = first; g < groups; g += step) {
    int64_t off[N];
    if (last == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = static_cast<int64_t>(g) * kVec * it.strides[k][0];
    } else {
      stridedOffsets<N, I>(it, g * kVec, off);
    }
    applyVecAt<F, TOut, TIn...>(f, it.data, off, broadcast, std::index_sequence_for<TIn...>{});
  }
  // The tail past the last whole group (one dim only: with more, the innermost size divides).
  for (I i = groups * kVec + first; i < n; i += step) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = static_cast<int64_t>(i) * it.strides[k][0];
    applyAt<F, TOut, TIn...>(f, it.data, off, std::index_sequence_for<TIn...>{});
  }
}

template <typename TOut, typename... TIn>
bool vectorizable(const StridedIter<1 + sizeof...(TIn)>& it) {
  constexpr int N = 1 + sizeof...(TIn);
  constexpr int64_t size[N] = {static_cast<int64_t>(sizeof(TOut)), static_cast<int64_t>(sizeof(TIn))...};
  if (it.ndim < 1) return false;
  const int last = it.ndim - 1;
  if (last > 0 && it.sizes[last] % kVec != 0) return false;
  if (it.strides[0][last] != size[0]) return false;  // the output is written densely
  for (int k = 0; k < N; ++k) {
    const int64_t s = it.strides[k][last];
    if (s == 0) continue;
    const int64_t group = size[k] * kVec;
    if (s != size[k] || reinterpret_cast<uintptr_t>(it.data[k]) % group != 0) return false;
    for (int d = 0; d < last; ++d)
      if (it.strides[k][d] % group != 0) return false;
  }
  return true;
}

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = int64_t{1} << 16;  // the grid-stride loop covers the rest

// The iterator stays in the kernel's parameter space (__grid_constant__): the dims loop indexes
// it at run time without copying it to local memory.
template <typename F, typename TOut, typename... TIn>
__global__ void __launch_bounds__(kThreads)
    ewKernel(const __grid_constant__ StridedIter<1 + sizeof...(TIn)> it, F f, bool vec) {
  if (vec) {
    if (it.numel <= int64_t{0x7fffffff}) ewLoopVec<uint32_t, F, TOut, TIn...>(it, f);
    else ewLoopVec<int64_t, F, TOut, TIn...>(it, f);
  } else {
    if (it.numel <= int64_t{0x7fffffff}) ewLoop<uint32_t, F, TOut, TIn...>(it, f);
    else ewLoop<int64_t, F, TOut, TIn...>(it, f);
  }
}

template <typename TOut, typename... TIn, typename F>
void launch(const StridedIter<1 + sizeof...(TIn)>& it, const F& f, cudaStream_t stream) {
  if (it.numel <= 0) return;
  const bool vec = vectorizable<TOut, TIn...>(it);
  const int64_t work = vec ? (it.numel + kVec - 1) / kVec : it.numel;
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  ewKernel<F, TOut, TIn...><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(it, f, vec);
}

// The scalar of slot k in compute type A (see EwScalars).
template <typename A>
inline A pick(const EwScalars& s, int k) {
  if constexpr (std::is_same_v<A, float>) return s.f[k];
  else if constexpr (std::is_same_v<A, double>) return s.d[k];
  else return static_cast<A>(s.i[k]);
}

// Calls fn.template operator()<T>() with the storage type of t.
template <typename Fn>
bool dispatchType(ElemType t, Fn&& fn) {
  switch (t) {
    case ElemType::Float32: return fn.template operator()<float>();
    case ElemType::Float64: return fn.template operator()<double>();
    case ElemType::Float16: return fn.template operator()<__half>();
    case ElemType::BFloat16: return fn.template operator()<__nv_bfloat16>();
    case ElemType::Int64: return fn.template operator()<int64_t>();
    case ElemType::Int32: return fn.template operator()<int32_t>();
    case ElemType::UInt8: return fn.template operator()<uint8_t>();
    case ElemType::Bool: return fn.template operator()<bool>();
  }
  return false;
}

inline int elemSize(ElemType t) {
  switch (t) {
    case ElemType::Float64:
    case ElemType::Int64: return 8;
    case ElemType::Float32:
    case ElemType::Int32: return 4;
    case ElemType::Float16:
    case ElemType::BFloat16: return 2;
    case ElemType::UInt8:
    case ElemType::Bool: return 1;
  }
  return 0;
}

// ---- math in the compute type (float for half types), as the CPU functors ----------------------

__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }
__device__ __forceinline__ float dtanh(float x) { return tanhf(x); }
__device__ __forceinline__ double dtanh(double x) { return tanh(x); }
__device__ __forceinline__ float derf(float x) { return erff(x); }
__device__ __forceinline__ double derf(double x) { return erf(x); }
__device__ __forceinline__ float dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dsqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float dfabs(float x) { return fabsf(x); }
__device__ __forceinline__ double dfabs(double x) { return fabs(x); }
// float pow through double: within rounding of the exact value (the CPU's vecmath::pow is within a
// few ulp); the special values (zeros, infinities, negative bases) follow C's pow in both.
__device__ __forceinline__ float dpow(float x, float y) {
  return static_cast<float>(pow(static_cast<double>(x), static_cast<double>(y)));
}
__device__ __forceinline__ double dpow(double x, double y) { return pow(x, y); }

// vecmath::sigmoid: 1 / (1 + e^-|x|) or its complement, no overflow.
__device__ __forceinline__ float dsigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float inv = 1.0f / (1.0f + e);
  return x >= 0.0f ? inv : e * inv;
}
__device__ __forceinline__ double dsigmoid(double x) {
  const double e = exp(-fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// Integer power by squaring; negative exponents as the CPU's intPow (only 1 and -1 survive).
template <typename T>
__device__ __forceinline__ T intPow(T base, T e) {
  if constexpr (std::is_same_v<T, bool>) {
    return e ? base : true;
  } else {
    if constexpr (std::is_signed_v<T>) {
      if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e & 1) ? T(-1) : T(1);
        return 0;
      }
    }
    T r = 1;
    while (e) {
      if (e & 1) r = static_cast<T>(r * base);
      e = static_cast<T>(e >> 1);
      base = static_cast<T>(base * base);
    }
    return r;
  }
}

}  // namespace cohort::cuda::detail::ew
