/*
 * Device-side element types for the index, embedding, dropout and optimizer kernels (nvcc only).
 * Half and bfloat16 travel as their 16-bit patterns and convert to and from float exactly as
 * cohort's CPU types do (core/tensor/half.h): round to nearest even, NaN to the canonical quiet
 * NaN of the same sign, so CPU and GPU results are bit-identical.
 */
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail::storage {

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Load<T>: the compute type (float for the 16-bit floats, T otherwise) and conversions.
template <typename T>
struct Elem {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc v) { return v; }
};

template <>
struct Elem<F16> {
  using Acc = float;
  __device__ static float load(F16 v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static F16 store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return F16{static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u)};
    return F16{__half_as_ushort(__float2half_rn(f))};
  }
};

template <>
struct Elem<BF16> {
  using Acc = float;
  __device__ static float load(BF16 v) { return __uint_as_float(static_cast<uint32_t>(v.bits) << 16); }
  __device__ static BF16 store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40u)};
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return BF16{static_cast<uint16_t>((u + rounding) >> 16)};
  }
};

// Calls f.template operator()<T>() with T the storage type of `t`.
template <typename F>
inline void dispatchFloat(ElemType t, F&& f) {
  switch (t) {
    case ElemType::Float32: f.template operator()<float>(); return;
    case ElemType::Float64: f.template operator()<double>(); return;
    case ElemType::Float16: f.template operator()<F16>(); return;
    case ElemType::BFloat16: f.template operator()<BF16>(); return;
    default: return;  // the glue only passes float types
  }
}

template <typename F>
inline void dispatchNumeric(ElemType t, F&& f) {
  switch (t) {
    case ElemType::Int64: f.template operator()<int64_t>(); return;
    case ElemType::Int32: f.template operator()<int32_t>(); return;
    case ElemType::UInt8: f.template operator()<uint8_t>(); return;
    default: dispatchFloat(t, static_cast<F&&>(f)); return;
  }
}

// The unsigned type of `size` bytes, for kernels that only move elements.
template <typename F>
inline void dispatchBySize(int size, F&& f) {
  switch (size) {
    case 1: f.template operator()<uint8_t>(); return;
    case 2: f.template operator()<uint16_t>(); return;
    case 4: f.template operator()<uint32_t>(); return;
    default: f.template operator()<unsigned long long>(); return;
  }
}

// Threads per block and a grid for `work` items walked with a grid-stride loop (grids stay far
// under the 2^31 - 1 block limit; each thread then takes several items).
constexpr int kThreads = 256;
inline unsigned gridFor(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace cohort::cuda::detail::storage
