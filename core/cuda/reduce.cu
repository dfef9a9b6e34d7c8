// Reduction kernels: sum, mean, amax/amin, norm, var/std, max/min/argmax/argmin over a dense
// [outer, reduced, inner] source (core/ops/detail/reduce_impl.h plans every reduction into it),
// and the elementwise maps of their backward passes.
//
// Two layouts, each with an optional split of the reduced extent:
//  - rows (inner == 1): a row of `reduced` contiguous elements is reduced by 32 threads (rows up to
//    1023 elements, 8 rows per block) or 256 threads (longer rows, one per block). Thread t takes
//    elements t, t + 32 (or 256), ... in order, then the row's threads combine in a fixed tree
//    (warp shuffles: lane l with l + 16, + 8, ..., 1; then the warps' results in warp order).
//  - columns (inner > 1): a block of 32 x 8 threads reduces 32 adjacent outputs; for each, the 8
//    threads of a column take rows r, r + 8, ... of the (split of the) reduced extent, and thread
//    row 0 combines the 8 results in order.
// When there are too few outputs to fill the GPU and the reduced extent is long, it is cut into S
// consecutive chunks reduced by separate blocks into a scratch buffer, which a second kernel
// combines per output in chunk order. The order of every sum is fixed by the shapes and the
// device's SM count, so results repeat exactly run to run; it differs from the CPU's blocked order,
// so float sums agree with the CPU within rounding, not bit for bit. Max/min/argmax/argmin are
// exact (the first extreme element, the first NaN if there is one, as on the CPU).
//
// Accumulators: floating sums (sum, mean, norms) add the mapped element (computed in float for
// half types and float32, in double for float64) into a double per thread, and combine in double;
// integer sums in int64. var/std use Welford's update per thread and Chan's merge, in double.
// Extremes compare in the compute type (float for half types).
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <limits>

#include <cohort/core/cuda/detail/reduce_kernels.h>
#include <cohort/core/cuda/detail/reduce_device.cuh>

namespace cohort::cuda::detail {

using namespace red;  // NOLINT(google-build-using-namespace): this file's device helpers

int red::smCount() {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  if (dev >= 0 && dev < 64) {
    int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // leave no sticky error for the launch check
    n = 108;
  }
  if (dev >= 0 && dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

namespace {

constexpr int kThreads = 256;
constexpr int kColLanes = 32;  // outputs per column block
constexpr int kColRows = 8;    // threads per output in a column block

// ---- maps applied to each element before summing ---------------------------------------------

struct Identity {
  template <typename C>
  __device__ C operator()(C x) const {
    return x;
  }
};
struct AbsMap {
  template <typename C>
  __device__ C operator()(C x) const {
    return x < C(0) ? -x : x;
  }
};
struct SquareMap {
  template <typename C>
  __device__ C operator()(C x) const {
    return x * x;
  }
};
struct NonZeroMap {
  template <typename C>
  __device__ C operator()(C x) const {
    return x != C(0) ? C(1) : C(0);
  }
};
struct AbsPowMap {
  double p;
  template <typename C>
  __device__ C operator()(C x) const {
    return static_cast<C>(::pow(::fabs(static_cast<double>(x)), p));
  }
};

// ---- reducers: Acc init(), Acc step(Acc, T, r), Acc combine(Acc, Acc), finish(Acc, k) --------

enum class Finish : uint8_t { Scale, Sqrt, Pow };

template <typename T, typename Out, typename Map>
struct SumR {
  using C = Compute<T>;
  using Acc = std::conditional_t<kFloatType<T>, double, int64_t>;
  Map map;
  Out* out;
  double scale;  // Finish::Scale: mean's 1/count (1 for sum)
  double root;   // Finish::Pow
  Finish fin;
  __device__ Acc init() const { return Acc(0); }
  __device__ Acc step(Acc a, T x, int64_t) const { return a + static_cast<Acc>(map(toCompute(x))); }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void finish(Acc t, int64_t k) const {
    if constexpr (kFloatType<T>) {
      double v = fin == Finish::Scale ? t * scale : (fin == Finish::Sqrt ? ::sqrt(t) : ::pow(t, root));
      out[k] = fromDouble<Out>(v);
    } else {
      out[k] = static_cast<Out>(t);
    }
  }
};

// Max (IsMax) or min of map(x); NaN propagates (reduce.cc's ExtremeOp).
template <typename T, bool IsMax, typename Map>
struct ExtremeR {
  using C = Compute<T>;
  using Acc = C;
  Map map;
  T* out;
  __device__ static Acc pick(Acc a, Acc x) {
    bool take = IsMax ? x > a : x < a;
    if constexpr (kFloatType<T>) take = take | (x != x);
    return take ? x : a;
  }
  __device__ Acc init() const {
    if constexpr (std::is_same_v<T, bool>) return !IsMax;
    else if constexpr (kFloatType<T>)
      return IsMax ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    else return IsMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
  __device__ Acc step(Acc a, T x, int64_t) const { return pick(a, static_cast<Acc>(map(toCompute(x)))); }
  __device__ Acc combine(Acc a, Acc b) const { return pick(a, b); }
  __device__ void finish(Acc t, int64_t k) const { out[k] = fromCompute<T>(t); }
};

struct Welford {
  double n, mean, m2;
};

template <typename T>
struct VarR {
  using Acc = Welford;
  T* out;
  double divisor;
  bool takeSqrt;
  __device__ Acc init() const { return Welford{0.0, 0.0, 0.0}; }
  __device__ Acc step(Acc a, T x, int64_t) const {
    const double v = static_cast<double>(toCompute(x));
    a.n += 1.0;
    const double d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
    return a;
  }
  __device__ Acc combine(Acc a, Acc b) const {
    if (b.n == 0.0) return a;
    if (a.n == 0.0) return b;
    const double n = a.n + b.n;
    const double delta = b.mean - a.mean;
    return Welford{n, a.mean + delta * (b.n / n), a.m2 + b.m2 + delta * delta * (a.n * b.n / n)};
  }
  __device__ void finish(Acc t, int64_t k) const {
    const double v = t.m2 / divisor;  // divisor 0 gives inf or NaN, as on the CPU
    out[k] = fromDouble<T>(takeSqrt ? ::sqrt(v) : v);
  }
};

// Value and index of the first extreme element; kNone marks "no element yet".
constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

template <typename T>
struct ArgAcc {
  Compute<T> v;
  int64_t i;
};

template <typename T, bool IsMax>
struct ArgR {
  using C = Compute<T>;
  using Acc = ArgAcc<T>;
  T* values;
  int64_t* indices;
  __device__ static bool better(C v, C best) {
    bool b = IsMax ? v > best : v < best;
    if constexpr (kFloatType<T>) b = b || (v != v && best == best);
    return b;
  }
  __device__ static bool same(C a, C b) {
    if constexpr (kFloatType<T>) return (a == b) || (a != a && b != b);
    else return a == b;
  }
  __device__ Acc init() const { return Acc{C{}, kNone}; }
  __device__ Acc step(Acc a, T x, int64_t r) const {
    const C v = toCompute(x);
    // A thread sees its positions in increasing order: only a strictly better value replaces.
    if (a.i == kNone || better(v, a.v)) return Acc{v, r};
    return a;
  }
  __device__ Acc combine(Acc a, Acc b) const {
    if (b.i == kNone) return a;
    if (a.i == kNone) return b;
    if (better(b.v, a.v)) return b;
    if (better(a.v, b.v)) return a;
    if (same(a.v, b.v) && b.i < a.i) return b;
    return a;
  }
  __device__ void finish(Acc t, int64_t k) const {
    indices[k] = t.i;
    if (values != nullptr) values[k] = fromCompute<T>(t.v);
  }
};

// ---- kernels ------------------------------------------------------------------------------------

template <int TPR, typename T, typename Rd>
__global__ void __launch_bounds__(kThreads) rowKernel(const T* __restrict__ x, int64_t O, int64_t R, int64_t S,
                                                      int64_t chunk, Rd rd, typename Rd::Acc* partial) {
  using Acc = typename Rd::Acc;
  constexpr int kRows = kThreads / TPR;
  __shared__ Acc smem[kRows * (TPR / 32)];
  auto combine = [&rd](Acc a, Acc b) { return rd.combine(a, b); };
  const int64_t groups = (O + kRows - 1) / kRows;
  for (int64_t b = blockIdx.x; b < groups * S; b += gridDim.x) {
    const int64_t g = b / S, s = b - g * S;
    const int64_t row = g * kRows + threadIdx.y;
    Acc acc = rd.init();
    if (row < O) {
      const T* xr = x + row * R;
      const int64_t r0 = s * chunk;
      const int64_t r1 = r0 + chunk < R ? r0 + chunk : R;
      for (int64_t r = r0 + threadIdx.x; r < r1; r += TPR) acc = rd.step(acc, xr[r], r);
    }
    acc = rowAllReduce<TPR>(acc, combine, smem);
    if (threadIdx.x == 0 && row < O) {
      if (S == 1) rd.finish(acc, row);
      else partial[row * S + s] = acc;
    }
  }
}

template <typename T, typename Rd>
__global__ void __launch_bounds__(kThreads) colKernel(const T* __restrict__ x, int64_t O, int64_t R, int64_t I,
                                                      int64_t chunk, Rd rd, typename Rd::Acc* partial) {
  using Acc = typename Rd::Acc;
  __shared__ Acc smem[kColRows][kColLanes];
  const int64_t nOut = O * I;
  const int64_t tiles = (nOut + kColLanes - 1) / kColLanes;
  const int64_t S = gridDim.y, s = blockIdx.y;
  const int64_t r0 = s * chunk;
  const int64_t r1 = r0 + chunk < R ? r0 + chunk : R;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t c = tile * kColLanes + threadIdx.x;
    Acc acc = rd.init();
    if (c < nOut) {
      const int64_t o = c / I, i = c - o * I;
      const T* base = x + o * R * I + i;
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) acc = rd.step(acc, base[r * I], r);
    }
    smem[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < nOut) {
      Acc t = smem[0][threadIdx.x];
#pragma unroll
      for (int k = 1; k < kColRows; ++k) t = rd.combine(t, smem[k][threadIdx.x]);
      if (S == 1) rd.finish(t, c);
      else partial[c * S + s] = t;
    }
    __syncthreads();
  }
}

template <typename Rd>
__global__ void finalizeKernel(const typename Rd::Acc* __restrict__ partial, int64_t nOut, int64_t S, Rd rd) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < nOut;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    typename Rd::Acc t = partial[k * S];
    for (int64_t s = 1; s < S; ++s) t = rd.combine(t, partial[k * S + s]);
    rd.finish(t, k);
  }
}

// ---- launch geometry ----------------------------------------------------------------------------

struct Geometry {
  bool rows = true;
  int tpr = 32;
  int64_t splits = 1, chunk = 1;
  unsigned grid = 1;
};

Geometry geometry(int64_t O, int64_t R, int64_t I) {
  Geometry g;
  const int64_t target = 4 * static_cast<int64_t>(red::smCount());  // blocks that fill the GPU
  auto ceilDiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  if (I == 1) {
    g.rows = true;
    g.tpr = R >= 1024 ? 256 : 32;
    const int64_t groups = ceilDiv(O, kThreads / g.tpr);
    if (g.tpr == 256 && groups < target && R >= 16384) g.splits = std::min(ceilDiv(target, groups), ceilDiv(R, 8192));
    g.chunk = std::max<int64_t>(1, ceilDiv(R, g.splits));
    g.grid = gridFor(groups * g.splits, 1);
  } else {
    g.rows = false;
    const int64_t tiles = ceilDiv(O * I, kColLanes);
    if (tiles < target && R >= 256) g.splits = std::min<int64_t>({ceilDiv(target, tiles), ceilDiv(R, 64), 65535});
    g.chunk = std::max<int64_t>(1, ceilDiv(R, g.splits));
    g.grid = gridFor(tiles, 1);
  }
  return g;
}

template <typename T, typename Rd>
int64_t workspaceFor(int64_t O, int64_t R, int64_t I) {
  Geometry g = geometry(O, R, I);
  return g.splits > 1 ? O * I * g.splits * static_cast<int64_t>(sizeof(typename Rd::Acc)) : 0;
}

template <typename T, typename Rd>
void run(const T* x, int64_t O, int64_t R, int64_t I, const Rd& rd, void* workspace, cudaStream_t stream) {
  using Acc = typename Rd::Acc;
  Geometry g = geometry(O, R, I);
  Acc* partial = g.splits > 1 ? static_cast<Acc*>(workspace) : nullptr;
  if (g.rows) {
    if (g.tpr == 32)
      rowKernel<32, T, Rd><<<g.grid, dim3(32, kThreads / 32), 0, stream>>>(x, O, R, g.splits, g.chunk, rd, partial);
    else rowKernel<256, T, Rd><<<g.grid, dim3(256, 1), 0, stream>>>(x, O, R, g.splits, g.chunk, rd, partial);
  } else {
    colKernel<T, Rd>
        <<<dim3(g.grid, static_cast<unsigned>(g.splits)), dim3(kColLanes, kColRows), 0, stream>>>(x, O, R, I, g.chunk,
                                                                                                  rd, partial);
  }
  if (g.splits > 1) finalizeKernel<Rd><<<gridFor(O * I, kThreads), kThreads, 0, stream>>>(partial, O * I, g.splits, rd);
}

// Calls f(reducer) with the reducer of `a` for element type T (f is templated on the reducer).
template <typename T, typename F>
void withReducer(const ReduceArgs& a, F&& f) {
  switch (a.op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      if constexpr (kFloatType<T>) {
        f(SumR<T, T, Identity>{{}, static_cast<T*>(a.out), a.op == ReduceOp::Mean ? a.param : 1.0, 1.0, Finish::Scale});
      } else {
        f(SumR<T, int64_t, Identity>{{}, static_cast<int64_t*>(a.out), 1.0, 1.0, Finish::Scale});
      }
      break;
    case ReduceOp::Amax: f(ExtremeR<T, true, Identity>{{}, static_cast<T*>(a.out)}); break;
    case ReduceOp::Amin: f(ExtremeR<T, false, Identity>{{}, static_cast<T*>(a.out)}); break;
    case ReduceOp::Norm:
      if constexpr (kFloatType<T>) {
        T* out = static_cast<T*>(a.out);
        const double p = a.param;
        if (std::isinf(p) && p > 0) f(ExtremeR<T, true, AbsMap>{{}, out});
        else if (std::isinf(p)) f(ExtremeR<T, false, AbsMap>{{}, out});
        else if (p == 2) f(SumR<T, T, SquareMap>{{}, out, 1.0, 0.5, Finish::Sqrt});
        else if (p == 1) f(SumR<T, T, AbsMap>{{}, out, 1.0, 1.0, Finish::Scale});
        else if (p == 0) f(SumR<T, T, NonZeroMap>{{}, out, 1.0, 1.0, Finish::Scale});
        else f(SumR<T, T, AbsPowMap>{AbsPowMap{p}, out, 1.0, 1.0 / p, Finish::Pow});
      }
      break;
    case ReduceOp::Var:
    case ReduceOp::Std:
      if constexpr (kFloatType<T>) f(VarR<T>{static_cast<T*>(a.out), a.param, a.op == ReduceOp::Std});
      break;
  }
}

// ---- backward maps ------------------------------------------------------------------------------

__device__ __forceinline__ int64_t offsetOf(const StridedIter<4>& it, int q, int64_t k) {
  int64_t off = 0;
  for (int d = it.ndim - 1; d >= 0; --d) {
    const int64_t idx = k % it.sizes[d];
    k /= it.sizes[d];
    off += idx * it.strides[q][d];
  }
  return off;
}

template <typename T>
__global__ void gradMapKernel(StridedIter<4> it, GradMapKind kind, double param) {
  using V = Compute<T>;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < it.numel;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const V xv = toCompute(*reinterpret_cast<const T*>(it.data[1] + offsetOf(it, 1, k)));
    const V av = toCompute(*reinterpret_cast<const T*>(it.data[2] + offsetOf(it, 2, k)));
    const V bv = kind == GradMapKind::Hits || kind == GradMapKind::StdScale
                     ? V(0)
                     : toCompute(*reinterpret_cast<const T*>(it.data[3] + offsetOf(it, 3, k)));
    const bool absolute = param != 0.0;
    V r;
    switch (kind) {
      case GradMapKind::Hits: {
        const V a = absolute ? (xv < V(0) ? -xv : xv) : xv;
        r = a == av ? V(1) : V(0);
        break;
      }
      case GradMapKind::Share: {
        const V a = absolute ? (xv < V(0) ? -xv : xv) : xv;
        if (a != av) r = V(0);
        else if (!absolute) r = bv;
        else r = xv > V(0) ? bv : (xv < V(0) ? -bv : V(0));
        break;
      }
      case GradMapKind::StdScale: r = av == V(0) ? V(0) : xv / (V(2) * av); break;
      case GradMapKind::Var: r = static_cast<V>(param) * (xv - av) * bv; break;
      case GradMapKind::Norm: {
        const double p = param;
        const V sgn = xv > V(0) ? V(1) : (xv < V(0) ? V(-1) : V(0));
        if (p == 1) r = sgn * bv;
        else if (av == V(0)) r = V(0);
        else if (p == 2) r = bv * xv / av;
        else
          r = static_cast<V>(static_cast<double>(sgn * bv) * ::pow(::fabs(static_cast<double>(xv)), p - 1) /
                             ::pow(static_cast<double>(av), p - 1));
        break;
      }
    }
    *reinterpret_cast<T*>(it.data[0] + offsetOf(it, 0, k)) = fromCompute<T>(r);
  }
}

template <typename T>
__global__ void argScatterKernel(T* __restrict__ grad, const int64_t* __restrict__ idx, const T* __restrict__ g,
                                 int64_t n, int64_t R, int64_t I) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = k / I, i = k - o * I;
    grad[(o * R + idx[k]) * I + i] = g[k];
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

int64_t reduceWorkspaceBytes(const ReduceArgs& a) {
  int64_t bytes = 0;
  dispatchAll(a.type, [&]<typename T>() {
    withReducer<T>(a, [&](const auto& rd) {
      bytes = workspaceFor<T, std::decay_t<decltype(rd)>>(a.outer, a.reduced, a.inner);
    });
  });
  return bytes;
}

void launchReduce(const ReduceArgs& a, void* workspace, cudaStream_t stream) {
  if (a.outer * a.inner == 0) return;
  dispatchAll(a.type, [&]<typename T>() {
    withReducer<T>(a, [&](const auto& rd) {
      run<T>(static_cast<const T*>(a.src), a.outer, a.reduced, a.inner, rd, workspace, stream);
    });
  });
}

int64_t argReduceWorkspaceBytes(const ArgReduceArgs& a) {
  int64_t bytes = 0;
  dispatchAll(a.type, [&]<typename T>() { bytes = workspaceFor<T, ArgR<T, true>>(a.outer, a.reduced, a.inner); });
  return bytes;
}

void launchArgReduce(const ArgReduceArgs& a, void* workspace, cudaStream_t stream) {
  if (a.outer * a.inner == 0) return;
  dispatchAll(a.type, [&]<typename T>() {
    const T* x = static_cast<const T*>(a.src);
    T* vals = static_cast<T*>(a.values);
    if (a.isMax) run<T>(x, a.outer, a.reduced, a.inner, ArgR<T, true>{vals, a.indices}, workspace, stream);
    else run<T>(x, a.outer, a.reduced, a.inner, ArgR<T, false>{vals, a.indices}, workspace, stream);
  });
}

void launchArgScatter(ElemType type, void* grad, const int64_t* indices, const void* g, int64_t outer, int64_t reduced,
                      int64_t inner, cudaStream_t stream) {
  const int64_t n = outer * inner;
  if (n == 0) return;
  dispatchFloat(type, [&]<typename T>() {
    argScatterKernel<T><<<gridFor(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(grad), indices,
                                                                       static_cast<const T*>(g), n, reduced, inner);
  });
}

void launchReduceGradMap(ElemType type, const StridedIter<4>& it, GradMapKind kind, double param, cudaStream_t stream) {
  if (it.numel == 0) return;
  dispatchFloat(type, [&]<typename T>() {
    gradMapKernel<T><<<gridFor(it.numel, kThreads), kThreads, 0, stream>>>(it, kind, param);
  });
}

}  // namespace cohort::cuda::detail
