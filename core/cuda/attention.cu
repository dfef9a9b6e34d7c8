// Fused scaled-dot-product attention on the GPU, in the manner of FlashAttention-2 (Dao, 2023):
// softmax(scale * q k^T) v without a [tq, tk] matrix in memory, the products on tensor cores
// (nvcuda::wmma, 16x16x16 tiles of float16/bfloat16 with float accumulation).
//
// Forward: a block of 4 warps takes 64 query rows of one batch entry and walks the keys in blocks
// of 64 (under a causal mask only up to the diagonal). Each warp owns 16 rows: S = Q K^T goes
// through shared memory, where two lanes per row apply the scale and mask and keep the online
// softmax's running maximum m and sum l; the warp's output rows are rescaled by exp(m_old - m_new)
// and P V (P rounded to the input type, as FlashAttention does) is added. At the end out = O / l
// and lse = m + log l.
//
// Backward: a block takes 64 keys of one batch entry and walks the query blocks (under a causal
// mask from the diagonal on), recomputing P = exp(scale * K Q^T - lse) transposed; with
// delta = rowsum(dO * O), dS = P * (dP - delta) * scale where dP = V dO^T. dV += P^T dO and
// dK += dS^T Q stay in registers across the walk; dQ += dS K is added into a float buffer with
// atomics (several key blocks write each query row), converted to the input type by the caller.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include <cohort/core/cuda/detail/attention_kernels.h>

namespace cohort::cuda::detail {
namespace {

using namespace nvcuda;

constexpr int kBM = 64;  // query rows per block
constexpr int kBN = 64;  // keys per block
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPadH = 8;  // shared rows of 16-bit values padded by 16 bytes (fewer bank conflicts; wmma needs ld % 8 == 0)
constexpr int kPadF = 4;  // shared rows of floats padded by 16 bytes
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ inline float toF(__half x) { return __half2float(x); }
__device__ inline float toF(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ inline T fromF(float x);
template <>
__device__ inline __half fromF<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 fromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [row0, row0 + rows) of a dense [n, D] matrix into a shared tile with row stride D + kPadH;
// rows at or past n are zeros. 16-byte copies (D is a multiple of 8).
template <typename T, int D>
__device__ void loadTile(T* dst, const T* src, int64_t row0, int64_t n, int rows) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < n) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * D + c);
    *reinterpret_cast<uint4*>(dst + r * (D + kPadH) + c) = val;
  }
}

template <typename T, int D>
constexpr size_t forwardSmemBytes() {
  return sizeof(T) * (kBM + 2 * kBN) * (D + kPadH) + sizeof(float) * kBM * (kBN + kPadF) +
         sizeof(T) * kBM * (kBN + kPadH) + sizeof(float) * kBM * (D + kPadF);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attentionForward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                     float* __restrict__ lse, int64_t tq, int64_t tk, float scaleLog2, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldh = D + kPadH, ldS = kBN + kPadF, ldP = kBN + kPadH, ldO = D + kPadF;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBM * ldh;
  T* sV = sK + kBN * ldh;
  float* sS = reinterpret_cast<float*>(sV + kBN * ldh);
  T* sP = reinterpret_cast<T*>(sS + kBM * ldS);
  float* sO = reinterpret_cast<float*>(sP + kBM * ldP);

  const int64_t b = blockIdx.x, m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  q += b * tq * D;
  k += b * tk * D;
  v += b * tk * D;
  out += b * tq * D;
  lse += b * tq;

  loadTile<T, D>(sQ, q, m0, tq, kBM);
  for (int i = threadIdx.x; i < kBM * ldO; i += kThreads) sO[i] = 0.f;
  // Lanes 2r and 2r + 1 of warp w own row w * 16 + r: columns [0, half) and [half, 2 * half).
  const int row = warp * 16 + lane / 2, side = lane % 2;
  const int64_t qi = m0 + row;
  float mRow = -INFINITY, lRow = 0.f;
  const int64_t kEnd = causal ? (m0 + kBM < tk ? m0 + kBM : tk) : tk;
  for (int64_t n0 = 0; n0 < kEnd; n0 += kBN) {
    __syncthreads();  // every warp is done with the previous key block
    loadTile<T, D>(sK, k, n0, tk, kBN);
    loadTile<T, D>(sV, v, n0, tk, kBN);
    __syncthreads();
    float* sSw = sS + warp * 16 * ldS;
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA<T> a;
        FragBT<T> bt;
        wmma::load_matrix_sync(a, sQ + warp * 16 * ldh + kk * 16, ldh);
        wmma::load_matrix_sync(bt, sK + j * 16 * ldh + kk * 16, ldh);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(sSw + j * 16, acc, ldS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax in base 2 over this block's 64 columns of the row (32 per lane).
    float* srow = sS + row * ldS + side * 32;
    float mx = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int64_t kj = n0 + side * 32 + c;
      float s = srow[c] * scaleLog2;
      if (kj >= tk || (causal && kj > qi)) s = -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mNew = fmaxf(mRow, mx);
    const float mUse = mNew == -INFINITY ? 0.f : mNew;  // a row with no key yet (padding) stays zero
    const float alpha = exp2f(mRow - mUse);
    float sum = 0.f;
    T* prow = sP + row * ldP + side * 32;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(srow[c] - mUse);
      prow[c] = fromF<T>(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    lRow = lRow * alpha + sum;
    mRow = mNew;
    float* orow = sO + row * ldO + side * (D / 2);
#pragma unroll 8
    for (int c = 0; c < D / 2; ++c) orow[c] *= alpha;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      FragC acc;
      wmma::load_matrix_sync(acc, sO + warp * 16 * ldO + j * 16, ldO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        FragA<T> a;
        FragB<T> bm;
        wmma::load_matrix_sync(a, sP + warp * 16 * ldP + kk * 16, ldP);
        wmma::load_matrix_sync(bm, sV + kk * 16 * ldh + j * 16, ldh);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(sO + warp * 16 * ldO + j * 16, acc, ldO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi < tq) {
    const float inv = lRow > 0.f ? 1.f / lRow : 0.f;
    const float* orow = sO + row * ldO + side * (D / 2);
    T* o = out + qi * D + side * (D / 2);
#pragma unroll 8
    for (int c = 0; c < D / 2; ++c) o[c] = fromF<T>(orow[c] * inv);
    if (side == 0) lse[qi] = (mRow + log2f(lRow)) * kLn2;
  }
}

template <typename T, int D>
__global__ void attentionDelta(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                               int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float s = 0.f;
  for (int c = lane; c < D; c += 32) s += toF(out[r * D + c]) * toF(dout[r * D + c]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) delta[r] = s;
}

template <typename T, int D>
constexpr size_t backwardSmemBytes() {
  return sizeof(T) * (2 * kBN + 2 * kBM) * (D + kPadH) + 2 * sizeof(float) * kBN * (kBM + kPadF) +
         2 * sizeof(T) * kBN * (kBM + kPadH) + 2 * sizeof(float) * kBM + sizeof(float) * kBM * (D + kPadF);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attentionBackward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      float* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv, int64_t tq, int64_t tk,
                      float scale, float scaleLog2, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldh = D + kPadH, ldS = kBM + kPadF, ldP = kBM + kPadH, ldQ = D + kPadF;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBN * ldh;
  T* sQ = sV + kBN * ldh;
  T* sdO = sQ + kBM * ldh;
  float* sS = reinterpret_cast<float*>(sdO + kBM * ldh);  // S^T: keys x queries
  float* sdP = sS + kBN * ldS;                             // dP^T
  T* sP = reinterpret_cast<T*>(sdP + kBN * ldS);           // P^T
  T* sdS = sP + kBN * ldP;                                 // dS^T, scaled
  float* sL = reinterpret_cast<float*>(sdS + kBN * ldP);   // lse * log2(e) per query row (+inf: padding)
  float* sD = sL + kBM;                                    // delta per query row
  float* sdQ = sD + kBM;                                   // a warp's dQ rows; at the end dK and dV

  const int64_t b = blockIdx.x, n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  q += b * tq * D;
  k += b * tk * D;
  v += b * tk * D;
  dout += b * tq * D;
  lse += b * tq;
  delta += b * tq;
  dq += b * tq * D;
  dk += b * tk * D;
  dv += b * tk * D;

  loadTile<T, D>(sK, k, n0, tk, kBN);
  loadTile<T, D>(sV, v, n0, tk, kBN);
  FragC accK[D / 16], accV[D / 16];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wmma::fill_fragment(accK[j], 0.f);
    wmma::fill_fragment(accV[j], 0.f);
  }
  // Lanes 2r and 2r + 1 of warp w own key row w * 16 + r: query columns [0, 32) and [32, 64).
  const int krow = warp * 16 + lane / 2, side = lane % 2;
  const int64_t kj = n0 + krow;
  for (int64_t m0 = causal ? n0 / kBM * kBM : 0; m0 < tq; m0 += kBM) {
    __syncthreads();  // every warp is done with the previous query block
    loadTile<T, D>(sQ, q, m0, tq, kBM);
    loadTile<T, D>(sdO, dout, m0, tq, kBM);
    for (int i = threadIdx.x; i < kBM; i += kThreads) {
      const bool in = m0 + i < tq;
      sL[i] = in ? lse[m0 + i] * kLog2e : INFINITY;
      sD[i] = in ? delta[m0 + i] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kBM / 16; ++j) {
      FragC accS, accP;
      wmma::fill_fragment(accS, 0.f);
      wmma::fill_fragment(accP, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA<T> a;
        FragBT<T> bt;
        wmma::load_matrix_sync(a, sK + warp * 16 * ldh + kk * 16, ldh);
        wmma::load_matrix_sync(bt, sQ + j * 16 * ldh + kk * 16, ldh);
        wmma::mma_sync(accS, a, bt, accS);
        wmma::load_matrix_sync(a, sV + warp * 16 * ldh + kk * 16, ldh);
        wmma::load_matrix_sync(bt, sdO + j * 16 * ldh + kk * 16, ldh);
        wmma::mma_sync(accP, a, bt, accP);
      }
      wmma::store_matrix_sync(sS + warp * 16 * ldS + j * 16, accS, ldS, wmma::mem_row_major);
      wmma::store_matrix_sync(sdP + warp * 16 * ldS + j * 16, accP, ldS, wmma::mem_row_major);
    }
    __syncwarp();
    {
      const float* srow = sS + krow * ldS + side * 32;
      const float* dprow = sdP + krow * ldS + side * 32;
      T* prow = sP + krow * ldP + side * 32;
      T* dsrow = sdS + krow * ldP + side * 32;
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const int col = side * 32 + c;
        const int64_t qi = m0 + col;
        float p = exp2f(srow[c] * scaleLog2 - sL[col]);
        if (kj >= tk || (causal && kj > qi)) p = 0.f;
        prow[c] = fromF<T>(p);
        dsrow[c] = fromF<T>(p * (dprow[c] - sD[col]) * scale);
      }
    }
    __syncthreads();  // dQ below reads every warp's rows of dS^T
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        FragA<T> a;
        FragB<T> bm;
        wmma::load_matrix_sync(a, sP + warp * 16 * ldP + kk * 16, ldP);
        wmma::load_matrix_sync(bm, sdO + kk * 16 * ldh + j * 16, ldh);
        wmma::mma_sync(accV[j], a, bm, accV[j]);
        wmma::load_matrix_sync(a, sdS + warp * 16 * ldP + kk * 16, ldP);
        wmma::load_matrix_sync(bm, sQ + kk * 16 * ldh + j * 16, ldh);
        wmma::mma_sync(accK[j], a, bm, accK[j]);
      }
    }
    // dQ rows warp * 16 .. + 16 of this query block: dS (the transpose of dS^T) times K.
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        FragAT<T> at;
        FragB<T> bm;
        wmma::load_matrix_sync(at, sdS + kk * 16 * ldP + warp * 16, ldP);
        wmma::load_matrix_sync(bm, sK + kk * 16 * ldh + j * 16, ldh);
        wmma::mma_sync(acc, at, bm, acc);
      }
      wmma::store_matrix_sync(sdQ + warp * 16 * ldQ + j * 16, acc, ldQ, wmma::mem_row_major);
    }
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
      const int r = i / D, c = i % D;
      const int64_t qi = m0 + warp * 16 + r;
      if (qi < tq) atomicAdd(dq + qi * D + c, sdQ[(warp * 16 + r) * ldQ + c]);
    }
  }
  // dK and dV of this warp's 16 keys, through the warp's rows of sdQ.
  __syncwarp();
  float* stage = sdQ + warp * 16 * ldQ;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) wmma::store_matrix_sync(stage + j * 16, accK[j], ldQ, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    const int64_t key = n0 + warp * 16 + r;
    if (key < tk) dk[key * D + c] = fromF<T>(stage[r * ldQ + c]);
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < D / 16; ++j) wmma::store_matrix_sync(stage + j * 16, accV[j], ldQ, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    const int64_t key = n0 + warp * 16 + r;
    if (key < tk) dv[key * D + c] = fromF<T>(stage[r * ldQ + c]);
  }
}

// Calls f.template operator()<T, D>() for the element type and head dim.
template <typename F>
cudaError_t dispatchAttention(ElemType type, int64_t d, F&& f) {
  auto byDim = [&]<typename T>() -> cudaError_t {
    switch (d) {
      case 32: return f.template operator()<T, 32>();
      case 64: return f.template operator()<T, 64>();
      case 128: return f.template operator()<T, 128>();
      default: return cudaErrorInvalidValue;
    }
  };
  if (type == ElemType::Float16) return byDim.template operator()<__half>();
  if (type == ElemType::BFloat16) return byDim.template operator()<__nv_bfloat16>();
  return cudaErrorInvalidValue;
}

// Kernels above 48 KiB of shared memory must say so (per device; a cheap call, made at each launch).
template <typename K>
cudaError_t allowSmem(K kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

unsigned blocksOf(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

bool attentionHeadDimSupported(int64_t d) { return d == 32 || d == 64 || d == 128; }

cudaError_t launchAttentionForward(ElemType type, const void* q, const void* k, const void* v, void* out, float* lse,
                                   int64_t nb, int64_t tq, int64_t tk, int64_t d, double scale, bool causal,
                                   cudaStream_t stream) {
  return dispatchAttention(type, d, [&]<typename T, int D>() -> cudaError_t {
    constexpr size_t bytes = forwardSmemBytes<T, D>();
    if (const cudaError_t e = allowSmem(attentionForward<T, D>, bytes); e != cudaSuccess) return e;
    attentionForward<T, D><<<dim3(static_cast<unsigned>(nb), blocksOf(tq, kBM)), kThreads, bytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse, tq,
        tk, static_cast<float>(scale) * kLog2e, causal);
    return cudaGetLastError();
  });
}

cudaError_t launchAttentionDelta(ElemType type, const void* out, const void* dout, float* delta, int64_t rows,
                                 int64_t d, cudaStream_t stream) {
  return dispatchAttention(type, d, [&]<typename T, int D>() -> cudaError_t {
    constexpr int kRowsPerBlock = 8;
    attentionDelta<T, D><<<blocksOf(rows, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
        static_cast<const T*>(out), static_cast<const T*>(dout), delta, rows);
    return cudaGetLastError();
  });
}

cudaError_t launchAttentionBackward(ElemType type, const void* q, const void* k, const void* v, const void* dout,
                                    const float* lse, const float* delta, float* dq, void* dk, void* dv, int64_t nb,
                                    int64_t tq, int64_t tk, int64_t d, double scale, bool causal, cudaStream_t stream) {
  return dispatchAttention(type, d, [&]<typename T, int D>() -> cudaError_t {
    constexpr size_t bytes = backwardSmemBytes<T, D>();
    if (const cudaError_t e = allowSmem(attentionBackward<T, D>, bytes); e != cudaSuccess) return e;
    attentionBackward<T, D><<<dim3(static_cast<unsigned>(nb), blocksOf(tk, kBN)), kThreads, bytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), lse,
        delta, dq, static_cast<T*>(dk), static_cast<T*>(dv), tq, tk, static_cast<float>(scale),
        static_cast<float>(scale) * kLog2e, causal);
    return cudaGetLastError();
  });
}

}  // namespace cohort::cuda::detail
