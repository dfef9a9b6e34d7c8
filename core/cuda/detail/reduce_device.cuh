/*
 * Device-side helpers shared by the reduction and normalisation kernels (reduce.cu, nn.cu): element
 * types, loads in the compute type (float for half types, as the CPU's Acc<T>), warp and block
 * reductions in a fixed order (so a result does not depend on timing), and dispatch on ElemType.
 * nvcc only; no cohort tensor headers. In their own namespace (red), apart from the elementwise
 * kernels' helpers.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail::red {

template <typename T>
inline constexpr bool kHalfType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
inline constexpr bool kFloatType = kHalfType<T> || std::is_same_v<T, float> || std::is_same_v<T, double>;

// The compute type: float for half types, T otherwise (cohort::Acc<T>).
template <typename T>
using Compute = std::conditional_t<kHalfType<T>, float, T>;

template <typename T>
__device__ __forceinline__ Compute<T> toCompute(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return v;
}

// float -> half types bit for bit as the CPU's Half(float) / BFloat16(float) (core/tensor/half.h):
// round to nearest even, and the CPU's NaN encodings (CUDA's own conversions give a canonical
// NaN, which would make max/min of a NaN differ in its bits).
__device__ __forceinline__ __half halfFromFloat(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return __ushort_as_half(static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u));
  return __float2half_rn(f);
}
__device__ __forceinline__ __nv_bfloat16 bfloat16FromFloat(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
  return __ushort_as_bfloat16(static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

// From the compute type to T: as the CPU's static_cast<T>.
template <typename T, typename V>
__device__ __forceinline__ T fromCompute(V v) {
  if constexpr (std::is_same_v<T, __half>) return halfFromFloat(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return bfloat16FromFloat(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Converts double to T through float for half types, as the CPU's static_cast<Half>(double) does
// (double -> float -> half; the double rounding matches the CPU's).
template <typename T>
__device__ __forceinline__ T fromDouble(double v) {
  if constexpr (kHalfType<T>) return fromCompute<T>(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Warp shuffle of any trivially copyable value, 32 bits at a time.
template <typename V>
__device__ __forceinline__ V shflDown(V v, int delta) {
  static_assert(std::is_trivially_copyable_v<V>);
  constexpr int kWords = (sizeof(V) + 3) / 4;
  int buf[kWords] = {};
  memcpy(buf, &v, sizeof(V));
#pragma unroll
  for (int k = 0; k < kWords; ++k) buf[k] = __shfl_down_sync(0xffffffffu, buf[k], delta);
  memcpy(&v, buf, sizeof(V));
  return v;
}

template <typename V>
__device__ __forceinline__ V shflIdx(V v, int lane) {
  constexpr int kWords = (sizeof(V) + 3) / 4;
  int buf[kWords] = {};
  memcpy(buf, &v, sizeof(V));
#pragma unroll
  for (int k = 0; k < kWords; ++k) buf[k] = __shfl_sync(0xffffffffu, buf[k], lane);
  memcpy(&v, buf, sizeof(V));
  return v;
}

// Reduces v over the 32 lanes of a warp (all lanes must call): lane 0 gets combine over lanes in a
// fixed tree order (lane l with l + 16, then + 8, ...); other lanes get partial values.
template <typename V, typename F>
__device__ __forceinline__ V warpReduce(V v, F combine) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = combine(v, shflDown(v, d));
  return v;
}

// Reduces v over the TPR threads (threadIdx.x) of each row of the block (threadIdx.y picks the
// row; blockDim.x == TPR, a multiple of 32, blockDim.x * blockDim.y <= 1024). Every thread of the
// block must call it. Every thread of a row gets the row's result: warps reduce, then each
// thread combines the row's warp results in warp order. `smem` holds blockDim.y * TPR / 32 values.
template <int TPR, typename V, typename F>
__device__ __forceinline__ V rowAllReduce(V v, F combine, V* smem) {
  v = warpReduce(v, combine);
  if constexpr (TPR == 32) {
    return shflIdx(v, 0);
  } else {
    constexpr int kWarps = TPR / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    V* row = smem + threadIdx.y * kWarps;
    __syncthreads();  // an earlier call's readers are done with smem
    if (lane == 0) row[warp] = v;
    __syncthreads();
    V r = row[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = combine(r, row[w]);
    return r;
  }
}

// Calls f.template operator()<T>() with T the device type of `t`.
template <typename F>
void dispatchAll(ElemType t, F&& f) {
  switch (t) {
    case ElemType::Float32: f.template operator()<float>(); break;
    case ElemType::Float64: f.template operator()<double>(); break;
    case ElemType::Float16: f.template operator()<__half>(); break;
    case ElemType::BFloat16: f.template operator()<__nv_bfloat16>(); break;
    case ElemType::Int64: f.template operator()<int64_t>(); break;
    case ElemType::Int32: f.template operator()<int32_t>(); break;
    case ElemType::UInt8: f.template operator()<uint8_t>(); break;
    case ElemType::Bool: f.template operator()<bool>(); break;
  }
}
template <typename F>
void dispatchFloat(ElemType t, F&& f) {
  switch (t) {
    case ElemType::Float32: f.template operator()<float>(); break;
    case ElemType::Float64: f.template operator()<double>(); break;
    case ElemType::Float16: f.template operator()<__half>(); break;
    case ElemType::BFloat16: f.template operator()<__nv_bfloat16>(); break;
    default: break;  // the op glue checks dtypes before launching
  }
}

// Number of SMs of the current device (cached per device).
int smCount();

// Blocks for a grid-stride loop over `work` items of `perBlock` each: at most 2^31 - 1.
inline unsigned gridFor(int64_t work, int64_t perBlock) {
  int64_t b = (work + perBlock - 1) / perBlock;
  if (b < 1) b = 1;
  if (b > 0x7fffffffLL) b = 0x7fffffffLL;
  return static_cast<unsigned>(b);
}

}  // namespace cohort::cuda::detail::red
