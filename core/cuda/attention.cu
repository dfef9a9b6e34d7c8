// Fused scaled-dot-product attention on the GPU, in the manner of FlashAttention-2 (Dao, 2023):
// softmax(scale * q k^T) v without a [tq, tk] matrix in memory, the products on tensor cores
// through mma.sync m16n8k16 (16-bit inputs, float accumulation; sm_80 and newer), whose register
// layouts the PTX ISA documents: in a warp, lane = 4 g + t holds, of a 16x16 A tile, rows g and
// g + 8 at columns 2t, 2t + 1 and 2t + 8, 2t + 9; of a 16x8 B tile, rows 2t, 2t + 1, 2t + 8,
// 2t + 9 at column g; of the 16x8 float result, rows g and g + 8 at columns 2t, 2t + 1. A result
// tile pair is thus an A tile of the next product without leaving registers.
//
// Forward: a block of 4 warps takes 64 query rows of one batch entry and walks the keys in blocks
// of 64 (under a causal mask only up to the diagonal); K is staged in shared memory as is, V
// transposed (so both are read as pairs of neighbours). Each warp owns 16 query rows: S = Q K^T
// lands in registers, where the scale, the mask and the online softmax (running maximum m and
// sum l per row, kept per lane and combined across the lane quad) are applied; O is rescaled by
// exp(m_old - m_new) and P V is added, P rounded to the input type as FlashAttention does. At the
// end out = O / l and lse = m + log l.
//
// Backward: a block takes 64 keys of one batch entry and walks the query blocks (under a causal
// mask from the diagonal on). Each warp owns 16 keys and recomputes P^T = exp(scale * K Q^T - lse)
// and dP^T = V dO^T in registers; with delta = rowsum(dO * O), dS^T = P^T * (dP^T - delta) * scale.
// dV += P^T dO and dK += dS^T Q accumulate in registers across the walk; dS goes to shared memory,
// from where every warp adds dQ = dS K for 16 query rows into a float buffer with atomics (several
// key blocks write each query row), converted to the input type by the caller.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cohort/core/cuda/detail/attention_kernels.h>

namespace cohort::cuda::detail {
namespace {

constexpr int kBM = 64;  // query rows per block (forward) / per step of the walk (backward)
constexpr int kBN = 64;  // keys per step of the walk (forward) / per block (backward)
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPad = 8;  // shared rows padded by 8 16-bit values: the pair loads of a lane quad hit distinct banks
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a b for one m16n8k16 tile (a: 4 registers of 2 values, b: 2, d: 4 floats).
template <typename T>
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two neighbouring 16-bit values of a shared row (an even index: 4-byte aligned).
template <typename T>
__device__ inline uint32_t pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// The A tile (16 rows from `rows`, 16 columns from `col`) of a row-major shared matrix.
template <typename T>
__device__ inline void loadA(uint32_t (&a)[4], const T* m, int ld, int rows, int col, int g, int t) {
  a[0] = pair(m + (rows + g) * ld + col + 2 * t);
  a[1] = pair(m + (rows + g + 8) * ld + col + 2 * t);
  a[2] = pair(m + (rows + g) * ld + col + 8 + 2 * t);
  a[3] = pair(m + (rows + g + 8) * ld + col + 8 + 2 * t);
}

// The A tile of a product from two result tiles (16 x 8 each, side by side), rounded to T.
template <typename T>
__device__ inline void toA(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Rows [row0, row0 + rows) of a dense [n, D] matrix into a shared tile (row stride D + kPad);
// rows at or past n are zeros. 16-byte copies (D is a multiple of 8).
template <typename T, int D>
__device__ void loadTile(T* dst, const T* src, int64_t row0, int64_t n, int rows) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < n) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * D + c);
    *reinterpret_cast<uint4*>(dst + r * (D + kPad) + c) = val;
  }
}

// The same rows transposed: dst[c * (rows + kPad) + r] = src[row0 + r][c].
template <typename T, int D>
__device__ void loadTileT(T* dst, const T* src, int64_t row0, int64_t n, int rows) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPerRow = D / kVec;
  const int ld = rows + kPad;
  for (int i = threadIdx.x; i < rows * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < n) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * D + c);
    const T* v = reinterpret_cast<const T*>(&val);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dst[(c + j) * ld + r] = v[j];
  }
}

template <typename T, int D>
constexpr size_t forwardSmemBytes() {
  return sizeof(T) * (2 * kBM * (D + kPad) + D * (kBN + kPad));
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attentionForward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                     float* __restrict__ lse, int64_t tq, int64_t tk, float scaleLog2, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldh = D + kPad, ldv = kBN + kPad;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBM * ldh;
  T* sVt = sK + kBN * ldh;  // V transposed: [D][keys]

  const int64_t b = blockIdx.x, m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  q += b * tq * D;
  k += b * tk * D;
  v += b * tk * D;
  out += b * tq * D;
  lse += b * tq;

  loadTile<T, D>(sQ, q, m0, tq, kBM);
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) loadA(qa[kk], sQ, ldh, warp * 16, kk * 16, g, t);
  // This lane's two rows: g and g + 8 of the warp's 16.
  const int64_t qi0 = m0 + warp * 16 + g, qi1 = qi0 + 8;
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // l: this lane's share of the row sums

  const int64_t kEnd = causal ? (m0 + kBM < tk ? m0 + kBM : tk) : tk;
  for (int64_t n0 = 0; n0 < kEnd; n0 += kBN) {
    __syncthreads();  // every warp is done with the previous key block
    loadTile<T, D>(sK, k, n0, tk, kBN);
    loadTileT<T, D>(sVt, v, n0, tk, kBN);
    __syncthreads();
    float s[kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const T* kr = sK + (nt * 8 + g) * ldh + 2 * t;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) mma<T>(s[nt], qa[kk], pair(kr + kk * 16), pair(kr + kk * 16 + 8));
    }
    // Scale (base 2), mask, and this block's row maxima.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t kj = n0 + nt * 8 + 2 * t + (i & 1);
        const int64_t qi = i < 2 ? qi0 : qi1;
        float x = s[nt][i] * scaleLog2;
        if (kj >= tk || (causal && kj > qi)) x = -INFINITY;
        s[nt][i] = x;
        mx[i / 2] = fmaxf(mx[i / 2], x);
      }
    float alpha[2], mUse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mNew = fmaxf(m[r], mx[r]);
      mUse[r] = mNew == -INFINITY ? 0.f : mNew;  // a row with no key yet (padding) stays zero
      alpha[r] = exp2f(m[r] - mUse[r]);
      m[r] = mNew;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(s[nt][i] - mUse[i / 2]);
        s[nt][i] = p;
        l[i / 2] += p;
      }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pa[4];
      toA<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const T* vr = sVt + (j * 8 + g) * ldv + kk * 16 + 2 * t;
        mma<T>(o[j], pa, pair(vr), pair(vr + 8));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv0 = l[0] > 0.f ? 1.f / l[0] : 0.f, inv1 = l[1] > 0.f ? 1.f / l[1] : 0.f;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int c = j * 8 + 2 * t;
    if (qi0 < tq) *reinterpret_cast<uint32_t*>(out + qi0 * D + c) = pack2<T>(o[j][0] * inv0, o[j][1] * inv0);
    if (qi1 < tq) *reinterpret_cast<uint32_t*>(out + qi1 * D + c) = pack2<T>(o[j][2] * inv1, o[j][3] * inv1);
  }
  if (t == 0) {
    if (qi0 < tq) lse[qi0] = (m[0] + log2f(l[0])) * kLn2;
    if (qi1 < tq) lse[qi1] = (m[1] + log2f(l[1])) * kLn2;
  }
}

template <typename T>
__device__ inline float toF(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
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
  return sizeof(T) * (2 * kBN * (D + kPad) + 2 * kBM * (D + kPad) + D * (kBN + kPad) + 2 * D * (kBM + kPad) +
                      kBM * (kBN + kPad)) +
         2 * sizeof(float) * kBM;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attentionBackward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      float* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv, int64_t tq, int64_t tk,
                      float scale, float scaleLog2, bool causal) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldh = D + kPad, ldk = kBN + kPad, ldq = kBM + kPad;
  T* sK = reinterpret_cast<T*>(smem);                     // [keys][D]
  T* sV = sK + kBN * ldh;                                 // [keys][D]
  T* sQ = sV + kBN * ldh;                                 // [queries][D]
  T* sdO = sQ + kBM * ldh;                                // [queries][D]
  T* sKt = sdO + kBM * ldh;                               // [D][keys]
  T* sQt = sKt + D * ldk;                                 // [D][queries]
  T* sdOt = sQt + D * ldq;                                // [D][queries]
  T* sdS = sdOt + D * ldq;                                // [queries][keys], scaled
  float* sL = reinterpret_cast<float*>(sdS + kBM * ldk);  // lse * log2(e) per query row (+inf: padding)
  float* sD = sL + kBM;                                   // delta per query row

  const int64_t b = blockIdx.x, n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
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
  loadTileT<T, D>(sKt, k, n0, tk, kBN);
  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) dka[j][i] = dva[j][i] = 0.f;
  // This lane's two keys: g and g + 8 of the warp's 16.
  const int64_t kj0 = n0 + warp * 16 + g, kj1 = kj0 + 8;
  for (int64_t m0 = causal ? n0 / kBM * kBM : 0; m0 < tq; m0 += kBM) {
    __syncthreads();  // every warp is done with the previous query block
    loadTile<T, D>(sQ, q, m0, tq, kBM);
    loadTile<T, D>(sdO, dout, m0, tq, kBM);
    loadTileT<T, D>(sQt, q, m0, tq, kBM);
    loadTileT<T, D>(sdOt, dout, m0, tq, kBM);
    for (int i = threadIdx.x; i < kBM; i += kThreads) {
      const bool in = m0 + i < tq;
      sL[i] = in ? lse[m0 + i] * kLog2e : INFINITY;
      sD[i] = in ? delta[m0 + i] : 0.f;
    }
    __syncthreads();
    // S^T and dP^T of the warp's 16 keys against the 64 queries.
    float st[kBM / 8][4], dpt[kBM / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBM / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) st[nt][i] = dpt[nt][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      loadA(ka, sK, ldh, warp * 16, kk * 16, g, t);
      loadA(va, sV, ldh, warp * 16, kk * 16, g, t);
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt) {
        const T* qr = sQ + (nt * 8 + g) * ldh + kk * 16 + 2 * t;
        const T* dr = sdO + (nt * 8 + g) * ldh + kk * 16 + 2 * t;
        mma<T>(st[nt], ka, pair(qr), pair(qr + 8));
        mma<T>(dpt[nt], va, pair(dr), pair(dr + 8));
      }
    }
    // P^T (into st) and dS^T (into dpt); dS also to shared memory, transposed back.
#pragma unroll
    for (int nt = 0; nt < kBM / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nt * 8 + 2 * t + (i & 1);
        const int64_t qi = m0 + col, kj = i < 2 ? kj0 : kj1;
        float p = exp2f(st[nt][i] * scaleLog2 - sL[col]);
        if (kj >= tk || (causal && kj > qi)) p = 0.f;
        const float ds = p * (dpt[nt][i] - sD[col]) * scale;
        st[nt][i] = p;
        dpt[nt][i] = ds;
        sdS[col * ldk + warp * 16 + g + (i < 2 ? 0 : 8)] = static_cast<T>(ds);
      }
      // dV += P^T dO and dK += dS^T Q over this block's 64 queries.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      uint32_t pa[4], da[4];
      toA<T>(pa, st[2 * kk], st[2 * kk + 1]);
      toA<T>(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const T* dor = sdOt + (j * 8 + g) * ldq + kk * 16 + 2 * t;
        const T* qr = sQt + (j * 8 + g) * ldq + kk * 16 + 2 * t;
        mma<T>(dva[j], pa, pair(dor), pair(dor + 8));
        mma<T>(dka[j], da, pair(qr), pair(qr + 8));
      }
    }
    __syncthreads();  // every warp's dS rows are in
    // dQ of query rows warp * 16 .. + 16: dS (64 keys) times K.
    const int64_t qr0 = m0 + warp * 16 + g, qr1 = qr0 + 8;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t sa[4];
        loadA(sa, sdS, ldk, warp * 16, kk * 16, g, t);
        const T* kr = sKt + (j * 8 + g) * ldk + kk * 16 + 2 * t;
        mma<T>(acc, sa, pair(kr), pair(kr + 8));
      }
      const int c = j * 8 + 2 * t;
      if (qr0 < tq) {
        atomicAdd(dq + qr0 * D + c, acc[0]);
        atomicAdd(dq + qr0 * D + c + 1, acc[1]);
      }
      if (qr1 < tq) {
        atomicAdd(dq + qr1 * D + c, acc[2]);
        atomicAdd(dq + qr1 * D + c + 1, acc[3]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int c = j * 8 + 2 * t;
    if (kj0 < tk) {
      *reinterpret_cast<uint32_t*>(dk + kj0 * D + c) = pack2<T>(dka[j][0], dka[j][1]);
      *reinterpret_cast<uint32_t*>(dv + kj0 * D + c) = pack2<T>(dva[j][0], dva[j][1]);
    }
    if (kj1 < tk) {
      *reinterpret_cast<uint32_t*>(dk + kj1 * D + c) = pack2<T>(dka[j][2], dka[j][3]);
      *reinterpret_cast<uint32_t*>(dv + kj1 * D + c) = pack2<T>(dva[j][2], dva[j][3]);
    }
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
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse, tq, tk,
        static_cast<float>(scale) * kLog2e, causal);
    return cudaGetLastError();
  });
}

cudaError_t launchAttentionDelta(ElemType type, const void* out, const void* dout, float* delta, int64_t rows,
                                 int64_t d, cudaStream_t stream) {
  return dispatchAttention(type, d, [&]<typename T, int D>() -> cudaError_t {
    constexpr int kRowsPerBlock = 8;
    attentionDelta<T, D><<<blocksOf(rows, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(static_cast<const T*>(out),
                                                                                           static_cast<const T*>(dout),
                                                                                           delta, rows);
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
