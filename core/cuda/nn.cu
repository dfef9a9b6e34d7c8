// Normalisation and loss kernels: softmax / log_softmax (forward and backward) over any dim,
// nll (per-position loss, valid count, backward scatter) and layer norm (forward and backward).
//
// Softmax and layer norm reduce each row the way reduce.cu does: rows along the last dim are
// reduced by 32 threads (rows up to 1023 elements, 8 rows per block) or 256 threads (longer rows),
// thread t taking elements t, t + 32 (or 256), ..., combined in a fixed tree (warp shuffles, then
// warps in order); a softmax over another dim gives each (outer, inner) column to one thread,
// which walks it in order. Row sums (softmax's sum of exponentials, layer norm's mean and squared
// deviations, the backward dot products) accumulate in double, as the CPU's do where it matters;
// elementwise steps compute in the compute type (float for half types) with the CPU's operation
// order and no fused multiply-adds (explicitly rounded intrinsics), so the results differ from the
// CPU only through the summation order and exp/log (CUDA's expf is within 2 ulp).
#include <cuda_runtime.h>

#include <cmath>
#include <limits>

#include <cohort/core/cuda/detail/nn_kernels.h>
#include <cohort/core/cuda/detail/reduce_device.cuh>

namespace cohort::cuda::detail {

using namespace red;  // NOLINT(google-build-using-namespace): this file's device helpers
namespace {

constexpr int kThreads = 256;

// IEEE operations that nvcc never contracts into fused multiply-adds (the CPU build does not).
template <typename C>
__device__ __forceinline__ C mulRn(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
}
template <typename C>
__device__ __forceinline__ C addRn(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fadd_rn(a, b);
  else return __dadd_rn(a, b);
}
template <typename C>
__device__ __forceinline__ C subRn(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fsub_rn(a, b);
  else return __dsub_rn(a, b);
}
__device__ __forceinline__ float expC(float v) { return expf(v); }
__device__ __forceinline__ double expC(double v) { return exp(v); }

struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
// Max where a NaN anywhere gives NaN.
struct MaxNan {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return (b > a || b != b) ? b : a;
  }
};
struct Pair {
  double a, b;
};
struct AddPair {
  __device__ Pair operator()(Pair x, Pair y) const { return Pair{x.a + y.a, x.b + y.b}; }
};

// A row max of -inf (every element -inf) shifts by 0, so exp gives 0 and the row NaN, as torch.
template <typename C>
__device__ __forceinline__ C shiftOf(C mx) {
  return (isinf(mx) && mx < C(0)) ? C(0) : mx;
}

// ---- softmax --------------------------------------------------------------------------------------

template <int TPR, typename T, bool Log>
__global__ void __launch_bounds__(kThreads)
    softmaxRows(const T* __restrict__ x, T* __restrict__ y, int64_t O, int64_t n) {
  using C = Compute<T>;
  constexpr int kRows = kThreads / TPR;
  __shared__ C smemC[kRows * (TPR / 32)];
  __shared__ double smemD[kRows * (TPR / 32)];
  for (int64_t rowBase = blockIdx.x * static_cast<int64_t>(kRows); rowBase < O;
       rowBase += static_cast<int64_t>(gridDim.x) * kRows) {
    const int64_t row = rowBase + threadIdx.y;
    const bool active = row < O;
    const T* xr = x + (active ? row : 0) * n;
    T* yr = y + (active ? row : 0) * n;
    C mx = -std::numeric_limits<C>::infinity();
    if (active)
      for (int64_t j = threadIdx.x; j < n; j += TPR) mx = MaxNan{}(mx, toCompute(xr[j]));
    mx = shiftOf(rowAllReduce<TPR>(mx, MaxNan{}, smemC));
    double s = 0;
    if (active)
      for (int64_t j = threadIdx.x; j < n; j += TPR) s += static_cast<double>(expC(subRn(toCompute(xr[j]), mx)));
    s = rowAllReduce<TPR>(s, AddD{}, smemD);
    if (active) {
      if constexpr (Log) {
        // (x - max) - log(sum): subtracting max first keeps the rounding of a huge lse out.
        const C ls = static_cast<C>(log(s));
        for (int64_t j = threadIdx.x; j < n; j += TPR) yr[j] = fromCompute<T>(subRn(subRn(toCompute(xr[j]), mx), ls));
      } else {
        const C inv = static_cast<C>(1.0 / s);
        for (int64_t j = threadIdx.x; j < n; j += TPR)
          yr[j] = fromCompute<T>(mulRn(expC(subRn(toCompute(xr[j]), mx)), inv));
      }
    }
  }
}

template <typename T, bool Log>
__global__ void softmaxCols(const T* __restrict__ x, T* __restrict__ y, int64_t O, int64_t n, int64_t I) {
  using C = Compute<T>;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < O * I;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = k / I, i = k - o * I;
    const T* xc = x + o * n * I + i;
    T* yc = y + o * n * I + i;
    C mx = -std::numeric_limits<C>::infinity();
    for (int64_t r = 0; r < n; ++r) mx = MaxNan{}(mx, toCompute(xc[r * I]));
    mx = shiftOf(mx);
    double s = 0;
    for (int64_t r = 0; r < n; ++r) s += static_cast<double>(expC(subRn(toCompute(xc[r * I]), mx)));
    if constexpr (Log) {
      const C ls = static_cast<C>(log(s));
      for (int64_t r = 0; r < n; ++r) yc[r * I] = fromCompute<T>(subRn(subRn(toCompute(xc[r * I]), mx), ls));
    } else {
      const C inv = static_cast<C>(1.0 / s);
      for (int64_t r = 0; r < n; ++r) yc[r * I] = fromCompute<T>(mulRn(expC(subRn(toCompute(xc[r * I]), mx)), inv));
    }
  }
}

// softmax: dx = y * (g - sum(g * y));  log_softmax: dx = g - exp(y) * sum(g).
template <typename C, bool Log>
__device__ __forceinline__ C softmaxGrad(C yv, C gv, C s) {
  if constexpr (Log) return subRn(gv, mulRn(expC(yv), s));
  else return mulRn(yv, subRn(gv, s));
}

template <int TPR, typename T, bool Log>
__global__ void __launch_bounds__(kThreads)
    softmaxBackwardRows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t O, int64_t n) {
  using C = Compute<T>;
  constexpr int kRows = kThreads / TPR;
  __shared__ double smem[kRows * (TPR / 32)];
  for (int64_t rowBase = blockIdx.x * static_cast<int64_t>(kRows); rowBase < O;
       rowBase += static_cast<int64_t>(gridDim.x) * kRows) {
    const int64_t row = rowBase + threadIdx.y;
    const bool active = row < O;
    const int64_t off = (active ? row : 0) * n;
    double s = 0;
    if (active)
      for (int64_t j = threadIdx.x; j < n; j += TPR) {
        const C gv = toCompute(g[off + j]);
        s += Log ? static_cast<double>(gv) : static_cast<double>(mulRn(gv, toCompute(y[off + j])));
      }
    s = rowAllReduce<TPR>(s, AddD{}, smem);
    const C sv = static_cast<C>(s);
    if (active)
      for (int64_t j = threadIdx.x; j < n; j += TPR)
        dx[off + j] = fromCompute<T>(softmaxGrad<C, Log>(toCompute(y[off + j]), toCompute(g[off + j]), sv));
  }
}

template <typename T, bool Log>
__global__ void softmaxBackwardCols(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t O,
                                    int64_t n, int64_t I) {
  using C = Compute<T>;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < O * I;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = k / I, i = k - o * I;
    const int64_t base = o * n * I + i;
    double s = 0;
    for (int64_t r = 0; r < n; ++r) {
      const C gv = toCompute(g[base + r * I]);
      s += Log ? static_cast<double>(gv) : static_cast<double>(mulRn(gv, toCompute(y[base + r * I])));
    }
    const C sv = static_cast<C>(s);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t e = base + r * I;
      dx[e] = fromCompute<T>(softmaxGrad<C, Log>(toCompute(y[e]), toCompute(g[e]), sv));
    }
  }
}

// ---- nll ------------------------------------------------------------------------------------------

template <typename T, typename Ix>
__global__ void nllForwardKernel(const T* __restrict__ x, const Ix* __restrict__ t, T* __restrict__ loss,
                                 T* __restrict__ valid, unsigned long long* stats, int64_t N, int64_t C, int64_t D,
                                 int64_t ignoreIndex) {
  const int64_t total = N * D;
  // base is the same for the whole block, so every lane of a warp takes part in the ballot.
  for (int64_t base = blockIdx.x * static_cast<int64_t>(blockDim.x); base < total;
       base += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = base + threadIdx.x;
    bool ok = false;
    if (k < total) {
      const int64_t label = static_cast<int64_t>(t[k]);
      const int64_t nn = k / D, d = k - nn * D;
      Compute<T> v = Compute<T>(0);
      if (label != ignoreIndex) {
        if (label < 0 || label >= C) {
          atomicMin(&stats[1], static_cast<unsigned long long>(k));
        } else {
          v = -toCompute(x[(nn * C + label) * D + d]);
          ok = true;
        }
      }
      loss[k] = fromCompute<T>(v);
      if (valid != nullptr) valid[k] = fromCompute<T>(ok ? Compute<T>(1) : Compute<T>(0));
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, ok);
    if ((threadIdx.x & 31) == 0 && ballot != 0) atomicAdd(&stats[0], static_cast<unsigned long long>(__popc(ballot)));
  }
}

template <typename T, typename Ix>
__global__ void nllBackwardKernel(const Ix* __restrict__ t, const T* __restrict__ g, T* __restrict__ dx, int64_t N,
                                  int64_t C, int64_t D, int64_t ignoreIndex, double scale, bool perPosition) {
  const int64_t total = N * D;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t label = static_cast<int64_t>(t[k]);
    if (label == ignoreIndex || label < 0 || label >= C) continue;  // the forward rejected bad labels
    const int64_t nn = k / D, d = k - nn * D;
    const double gv = static_cast<double>(toCompute(g[perPosition ? k : 0]));
    dx[(nn * C + label) * D + d] = fromDouble<T>(-gv * scale);
  }
}

// ---- layer norm -----------------------------------------------------------------------------------

template <int TPR, typename T>
__global__ void __launch_bounds__(kThreads)
    layerNormRows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  Compute<T>* __restrict__ meanOut, Compute<T>* __restrict__ rstdOut, int64_t M, int64_t N,
                  double eps) {
  using C = Compute<T>;
  constexpr int kRows = kThreads / TPR;
  __shared__ double smem[kRows * (TPR / 32)];
  for (int64_t rowBase = blockIdx.x * static_cast<int64_t>(kRows); rowBase < M;
       rowBase += static_cast<int64_t>(gridDim.x) * kRows) {
    const int64_t row = rowBase + threadIdx.y;
    const bool active = row < M;
    const T* xr = x + (active ? row : 0) * N;
    double s = 0;
    if (active)
      for (int64_t j = threadIdx.x; j < N; j += TPR) s += static_cast<double>(toCompute(xr[j]));
    s = rowAllReduce<TPR>(s, AddD{}, smem);
    const double mu = s / static_cast<double>(N);
    double ss = 0;
    if (active)
      for (int64_t j = threadIdx.x; j < N; j += TPR) {
        const double dv = static_cast<double>(toCompute(xr[j])) - mu;
        ss = __dadd_rn(ss, __dmul_rn(dv, dv));
      }
    ss = rowAllReduce<TPR>(ss, AddD{}, smem);
    const C rs = static_cast<C>(1.0 / sqrt(ss / static_cast<double>(N) + eps));
    const C mc = static_cast<C>(mu);
    if (active) {
      if (threadIdx.x == 0) {
        meanOut[row] = mc;
        rstdOut[row] = rs;
      }
      T* yr = y + row * N;
      for (int64_t j = threadIdx.x; j < N; j += TPR) {
        C v = mulRn(subRn(toCompute(xr[j]), mc), rs);
        if (w != nullptr) v = mulRn(v, toCompute(w[j]));
        if (b != nullptr) v = addRn(v, toCompute(b[j]));
        yr[j] = fromCompute<T>(v);
      }
    }
  }
}

// dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)), dy = g * w.
template <int TPR, typename T>
__global__ void __launch_bounds__(kThreads)
    layerNormBackwardRows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                          const Compute<T>* __restrict__ mean, const Compute<T>* __restrict__ rstd, T* __restrict__ dx,
                          int64_t M, int64_t N) {
  using C = Compute<T>;
  constexpr int kRows = kThreads / TPR;
  __shared__ Pair smem[kRows * (TPR / 32)];
  for (int64_t rowBase = blockIdx.x * static_cast<int64_t>(kRows); rowBase < M;
       rowBase += static_cast<int64_t>(gridDim.x) * kRows) {
    const int64_t row = rowBase + threadIdx.y;
    const bool active = row < M;
    const int64_t off = (active ? row : 0) * N;
    const C mu = active ? mean[row] : C(0), rs = active ? rstd[row] : C(0);
    Pair p{0.0, 0.0};
    if (active)
      for (int64_t j = threadIdx.x; j < N; j += TPR) {
        const C xhat = mulRn(subRn(toCompute(x[off + j]), mu), rs);
        const C gv = toCompute(g[off + j]);
        const C dy = w != nullptr ? mulRn(gv, toCompute(w[j])) : gv;
        p.a += static_cast<double>(dy);
        p.b += static_cast<double>(mulRn(dy, xhat));
      }
    p = rowAllReduce<TPR>(p, AddPair{}, smem);
    const C am = static_cast<C>(p.a / static_cast<double>(N)), bm = static_cast<C>(p.b / static_cast<double>(N));
    if (active)
      for (int64_t j = threadIdx.x; j < N; j += TPR) {
        const C xhat = mulRn(subRn(toCompute(x[off + j]), mu), rs);
        const C gv = toCompute(g[off + j]);
        const C dy = w != nullptr ? mulRn(gv, toCompute(w[j])) : gv;
        dx[off + j] = fromCompute<T>(mulRn(rs, subRn(subRn(dy, am), mulRn(xhat, bm))));
      }
  }
}

constexpr int kColLanes = 32, kColRows = 8;

// dw[j] = sum over rows of g * xhat, db[j] = sum of g, in double: a block of 32 x 8 threads takes 32
// columns and one chunk of rows (thread row ty takes rows ty, ty + 8, ...); the 8 partial sums
// combine in order, and chunks (when split) in chunk order in layerNormParamFinal.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    layerNormParamGrad(const T* __restrict__ x, const T* __restrict__ g, const Compute<T>* __restrict__ mean,
                       const Compute<T>* __restrict__ rstd, T* __restrict__ dw, T* __restrict__ db,
                       double* __restrict__ partial, int64_t M, int64_t N, int64_t chunk) {
  using C = Compute<T>;
  __shared__ Pair smem[kColRows][kColLanes];
  const int64_t S = gridDim.y, s = blockIdx.y;
  const int64_t m0 = s * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
  const int64_t tiles = (N + kColLanes - 1) / kColLanes;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j = tile * kColLanes + threadIdx.x;
    Pair p{0.0, 0.0};
    if (j < N)
      for (int64_t m = m0 + threadIdx.y; m < m1; m += kColRows) {
        const C gv = toCompute(g[m * N + j]);
        const C xhat = mulRn(subRn(toCompute(x[m * N + j]), mean[m]), rstd[m]);
        p.a += static_cast<double>(mulRn(gv, xhat));
        p.b += static_cast<double>(gv);
      }
    smem[threadIdx.y][threadIdx.x] = p;
    __syncthreads();
    if (threadIdx.y == 0 && j < N) {
      Pair t = smem[0][threadIdx.x];
#pragma unroll
      for (int k = 1; k < kColRows; ++k) t = AddPair{}(t, smem[k][threadIdx.x]);
      if (S == 1) {
        if (dw != nullptr) dw[j] = fromDouble<T>(t.a);
        if (db != nullptr) db[j] = fromDouble<T>(t.b);
      } else {
        partial[s * N + j] = t.a;
        partial[(S + s) * N + j] = t.b;
      }
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void layerNormParamFinal(const double* __restrict__ partial, T* __restrict__ dw, T* __restrict__ db,
                                    int64_t N, int64_t S) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < N;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double a = 0, b = 0;
    for (int64_t s = 0; s < S; ++s) {
      a += partial[s * N + j];
      b += partial[(S + s) * N + j];
    }
    if (dw != nullptr) dw[j] = fromDouble<T>(a);
    if (db != nullptr) db[j] = fromDouble<T>(b);
  }
}

int64_t paramGradSplits(int64_t M, int64_t N) {
  const int64_t tiles = (N + kColLanes - 1) / kColLanes;
  const int64_t target = 4 * static_cast<int64_t>(red::smCount());
  if (tiles >= target || M < 256) return 1;
  int64_t s = (target + tiles - 1) / tiles;
  s = s < (M + 63) / 64 ? s : (M + 63) / 64;
  return s < 65535 ? s : 65535;
}

template <typename T>
void dispatchIndex(ElemType t, T&& f) {
  if (t == ElemType::Int32) f.template operator()<int32_t>();
  else f.template operator()<int64_t>();
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

void launchSoftmax(ElemType type, bool log, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                   cudaStream_t stream) {
  dispatchFloat(type, [&]<typename T>() {
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    if (inner == 1) {
      if (n >= 1024) {
        if (log) softmaxRows<256, T, true><<<gridFor(outer, 1), dim3(256, 1), 0, stream>>>(xs, ys, outer, n);
        else softmaxRows<256, T, false><<<gridFor(outer, 1), dim3(256, 1), 0, stream>>>(xs, ys, outer, n);
      } else {
        if (log) softmaxRows<32, T, true><<<gridFor(outer, 8), dim3(32, 8), 0, stream>>>(xs, ys, outer, n);
        else softmaxRows<32, T, false><<<gridFor(outer, 8), dim3(32, 8), 0, stream>>>(xs, ys, outer, n);
      }
    } else {
      const unsigned grid = gridFor(outer * inner, kThreads);
      if (log) softmaxCols<T, true><<<grid, kThreads, 0, stream>>>(xs, ys, outer, n, inner);
      else softmaxCols<T, false><<<grid, kThreads, 0, stream>>>(xs, ys, outer, n, inner);
    }
  });
}

void launchSoftmaxBackward(ElemType type, bool log, const void* y, const void* g, void* dx, int64_t outer, int64_t n,
                           int64_t inner, cudaStream_t stream) {
  dispatchFloat(type, [&]<typename T>() {
    const T* ys = static_cast<const T*>(y);
    const T* gs = static_cast<const T*>(g);
    T* d = static_cast<T*>(dx);
    if (inner == 1) {
      if (n >= 1024) {
        if (log) softmaxBackwardRows<256, T, true><<<gridFor(outer, 1), dim3(256, 1), 0, stream>>>(ys, gs, d, outer, n);
        else softmaxBackwardRows<256, T, false><<<gridFor(outer, 1), dim3(256, 1), 0, stream>>>(ys, gs, d, outer, n);
      } else {
        if (log) softmaxBackwardRows<32, T, true><<<gridFor(outer, 8), dim3(32, 8), 0, stream>>>(ys, gs, d, outer, n);
        else softmaxBackwardRows<32, T, false><<<gridFor(outer, 8), dim3(32, 8), 0, stream>>>(ys, gs, d, outer, n);
      }
    } else {
      const unsigned grid = gridFor(outer * inner, kThreads);
      if (log) softmaxBackwardCols<T, true><<<grid, kThreads, 0, stream>>>(ys, gs, d, outer, n, inner);
      else softmaxBackwardCols<T, false><<<grid, kThreads, 0, stream>>>(ys, gs, d, outer, n, inner);
    }
  });
}

void launchNllForward(ElemType type, ElemType targetType, const void* x, const void* target, void* perPos, void* valid,
                      unsigned long long* stats, int64_t n, int64_t c, int64_t d, int64_t ignoreIndex,
                      cudaStream_t stream) {
  const int64_t total = n * d;
  if (total == 0) return;
  dispatchFloat(type, [&]<typename T>() {
    dispatchIndex(targetType, [&]<typename Ix>() {
      nllForwardKernel<T, Ix>
          <<<gridFor(total, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const Ix*>(target),
                                                              static_cast<T*>(perPos), static_cast<T*>(valid), stats, n,
                                                              c, d, ignoreIndex);
    });
  });
}

void launchNllBackward(ElemType type, ElemType targetType, const void* target, const void* grad, void* dx, int64_t n,
                       int64_t c, int64_t d, int64_t ignoreIndex, double scale, bool perPosition, cudaStream_t stream) {
  const int64_t total = n * d;
  if (total == 0) return;
  dispatchFloat(type, [&]<typename T>() {
    dispatchIndex(targetType, [&]<typename Ix>() {
      nllBackwardKernel<T, Ix><<<gridFor(total, kThreads), kThreads, 0, stream>>>(static_cast<const Ix*>(target),
                                                                                  static_cast<const T*>(grad),
                                                                                  static_cast<T*>(dx), n, c, d,
                                                                                  ignoreIndex, scale, perPosition);
    });
  });
}

void launchLayerNorm(ElemType type, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t m, int64_t n, double eps, cudaStream_t stream) {
  dispatchFloat(type, [&]<typename T>() {
    using C = Compute<T>;
    const T* xs = static_cast<const T*>(x);
    const T* ws = static_cast<const T*>(w);
    const T* bs = static_cast<const T*>(b);
    T* ys = static_cast<T*>(y);
    C* mu = static_cast<C*>(mean);
    C* rs = static_cast<C*>(rstd);
    if (n >= 1024) layerNormRows<256, T><<<gridFor(m, 1), dim3(256, 1), 0, stream>>>(xs, ws, bs, ys, mu, rs, m, n, eps);
    else layerNormRows<32, T><<<gridFor(m, 8), dim3(32, 8), 0, stream>>>(xs, ws, bs, ys, mu, rs, m, n, eps);
  });
}

int64_t layerNormBackwardWorkspaceBytes(int64_t m, int64_t n) {
  const int64_t s = paramGradSplits(m, n);
  return s > 1 ? 2 * s * n * static_cast<int64_t>(sizeof(double)) : 0;
}

void launchLayerNormBackward(ElemType type, const void* x, const void* w, const void* g, const void* mean,
                             const void* rstd, void* dx, void* dw, void* db, int64_t m, int64_t n, void* workspace,
                             cudaStream_t stream) {
  dispatchFloat(type, [&]<typename T>() {
    using C = Compute<T>;
    const T* xs = static_cast<const T*>(x);
    const T* ws = static_cast<const T*>(w);
    const T* gs = static_cast<const T*>(g);
    const C* mu = static_cast<const C*>(mean);
    const C* rs = static_cast<const C*>(rstd);
    if (dx != nullptr) {
      T* d = static_cast<T*>(dx);
      if (n >= 1024)
        layerNormBackwardRows<256, T><<<gridFor(m, 1), dim3(256, 1), 0, stream>>>(xs, ws, gs, mu, rs, d, m, n);
      else layerNormBackwardRows<32, T><<<gridFor(m, 8), dim3(32, 8), 0, stream>>>(xs, ws, gs, mu, rs, d, m, n);
    }
    if (dw != nullptr || db != nullptr) {
      const int64_t s = paramGradSplits(m, n);
      const int64_t chunk = s > 1 ? (m + s - 1) / s : (m > 0 ? m : 1);
      T* dws = static_cast<T*>(dw);
      T* dbs = static_cast<T*>(db);
      double* partial = static_cast<double*>(workspace);
      const unsigned tiles = gridFor((n + kColLanes - 1) / kColLanes, 1);
      layerNormParamGrad<T>
          <<<dim3(tiles, static_cast<unsigned>(s)), dim3(kColLanes, kColRows), 0, stream>>>(xs, gs, mu, rs, dws, dbs,
                                                                                            partial, m, n, chunk);
      if (s > 1) layerNormParamFinal<T><<<gridFor(n, kThreads), kThreads, 0, stream>>>(partial, dws, dbs, n, s);
    }
  });
}

}  // namespace cohort::cuda::detail
