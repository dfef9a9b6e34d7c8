// Indexing, embedding and dropout kernels (launchers declared in detail/index_kernels.h). The
// CPU ops in core/ops/index.cc and core/ops/nn_ops.cc define what each computes; where the CPU
// adds several values into one element, the kernels add them in the CPU's order, so results are
// bit-identical and deterministic (no floating-point atomics).
#include <cub/device/device_radix_sort.cuh>

#include <cohort/core/cuda/detail/index_kernels.h>
#include <cohort/core/cuda/detail/storage_types.cuh>

namespace cohort::cuda::detail {
namespace {

using storage::Elem;
using storage::gridFor;
using storage::kThreads;

__device__ __forceinline__ int64_t loadIndex(const void* idx, bool index64, int64_t i) {
  return index64 ? static_cast<const int64_t*>(idx)[i] : static_cast<int64_t>(static_cast<const int32_t*>(idx)[i]);
}

#define COHORT_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- range check ---------------------------------------------------------------------------------

template <typename IT>
__global__ void indexCheckKernel(const IT* idx, int64_t n, int64_t size, bool wantMax, IndexCheckResult* r) {
  unsigned long long bad = ~0ull;
  long long mx = -1;
  COHORT_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= size) {
      if (static_cast<unsigned long long>(i) < bad) bad = static_cast<unsigned long long>(i);
    }
    if (v > mx) mx = v;
  }
  // A thread's first bad position is its smallest (positions grow along the loop).
  if (bad != ~0ull) atomicMin(&r->badPos, bad);
  if (wantMax && mx >= 0) atomicMax(&r->maxValue, mx);
}

// ---- index_select / embedding forward -----------------------------------------------------------

template <typename E>
__global__ void indexSelectKernel(const E* src, E* out, const void* idx, bool index64, int64_t n, int64_t len,
                                  int64_t inner, int64_t total) {
  COHORT_GRID_STRIDE(e, total) {
    const int64_t r = e % inner;
    const int64_t t = e / inner;
    const int64_t i = t % n;
    const int64_t o = t / n;
    out[e] = src[(o * len + loadIndex(idx, index64, i)) * inner + r];
  }
}

// ---- sort by index -------------------------------------------------------------------------------

__global__ void sortInputsKernel(const void* idx, bool index64, int64_t n, uint64_t* keys, int64_t* pos) {
  COHORT_GRID_STRIDE(i, n) {
    keys[i] = static_cast<uint64_t>(loadIndex(idx, index64, i));
    pos[i] = i;
  }
}

int keyBits(int64_t len) {
  int bits = 1;
  while (bits < 64 && (uint64_t{1} << bits) < static_cast<uint64_t>(len)) ++bits;
  return bits;
}

size_t alignUp(size_t v) { return (v + 255) & ~size_t{255}; }

// ---- index_add into zeros (index_select and embedding backward) ----------------------------------

// Thread (o, s, r): when sorted position s starts a run of equal keys k, it sums g[o, pos, r]
// over the run (positions increasing, as the CPU loops) and writes out[o, k, r].
template <typename T>
__global__ void indexAddSortedKernel(const T* g, T* out, const uint64_t* keys, const int64_t* pos, int64_t n,
                                     int64_t len, int64_t inner, int64_t total, bool roundEachAdd) {
  using A = typename Elem<T>::Acc;
  COHORT_GRID_STRIDE(e, total) {
    const int64_t r = e % inner;
    const int64_t t = e / inner;
    const int64_t s = t % n;
    const int64_t o = t / n;
    const uint64_t k = keys[s];
    if (s > 0 && keys[s - 1] == k) continue;
    A acc = A(0);
    for (int64_t u = s; u < n && keys[u] == k; ++u) {
      acc = acc + Elem<T>::load(g[(o * n + pos[u]) * inner + r]);
      if (roundEachAdd) acc = Elem<T>::load(Elem<T>::store(acc));
    }
    out[(o * len + static_cast<int64_t>(k)) * inner + r] = Elem<T>::store(acc);
  }
}

// ---- gather / scatter_add ------------------------------------------------------------------------

// Splits `flat` (row-major over sizes, skipping dim `skip` when skip >= 0) into coordinates and
// returns the offsets of the three operands, without dim `skip`'s term.
struct Offsets {
  int64_t src, out, idx;
};
__device__ __forceinline__ Offsets offsetsOf(const GatherArgs& a, int64_t flat, int skip) {
  Offsets off{0, 0, 0};
  for (int d = a.ndim - 1; d >= 0; --d) {
    if (d == skip) continue;
    const int64_t c = flat % a.sizes[d];
    flat /= a.sizes[d];
    off.src += c * a.srcStrides[d];
    off.out += c * a.outStrides[d];
    off.idx += c * a.idxStrides[d];
  }
  return off;
}

template <typename E>
__global__ void gatherKernel(const GatherArgs a) {
  const E* src = static_cast<const E*>(a.src);
  E* out = static_cast<E*>(a.out);
  COHORT_GRID_STRIDE(e, a.numel) {
    // Every dim contributes to out and idx; src takes the index value along dim.
    Offsets off{0, 0, 0};
    int64_t flat = e;
    for (int d = a.ndim - 1; d >= 0; --d) {
      const int64_t c = flat % a.sizes[d];
      flat /= a.sizes[d];
      off.out += c * a.outStrides[d];
      off.idx += c * a.idxStrides[d];
      if (d != a.dim) off.src += c * a.srcStrides[d];
    }
    out[off.out] = src[off.src + loadIndex(a.idx, a.index64, off.idx) * a.srcStrides[a.dim]];
  }
}

template <typename T>
__global__ void scatterAddKernel(const GatherArgs a, int64_t lines) {
  using A = typename Elem<T>::Acc;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const int64_t along = a.sizes[a.dim];
  COHORT_GRID_STRIDE(l, lines) {
    const Offsets base = offsetsOf(a, l, a.dim);
    for (int64_t j = 0; j < along; ++j) {
      const int64_t v = loadIndex(a.idx, a.index64, base.idx + j * a.idxStrides[a.dim]);
      T* o = out + base.out + v * a.outStrides[a.dim];
      *o = Elem<T>::store(Elem<T>::load(*o) + Elem<T>::load(src[base.src + j * a.srcStrides[a.dim]]));
    }
  }
}

// ---- masked_fill ---------------------------------------------------------------------------------

template <typename E>
__global__ void maskedFillKernel(const StridedIter<3> it, E value) {
  COHORT_GRID_STRIDE(e, it.numel) {
    int64_t off[3] = {0, 0, 0};
    if (it.contiguous) {
      off[0] = e * static_cast<int64_t>(sizeof(E));
      off[1] = off[0];
      off[2] = e;
    } else {
      int64_t flat = e;
      for (int d = it.ndim - 1; d >= 0; --d) {
        const int64_t c = flat % it.sizes[d];
        flat /= it.sizes[d];
        for (int k = 0; k < 3; ++k) off[k] += c * it.strides[k][d];
      }
    }
    const bool m = *reinterpret_cast<const bool*>(it.data[2] + off[2]);
    *reinterpret_cast<E*>(it.data[0] + off[0]) = m ? value : *reinterpret_cast<const E*>(it.data[1] + off[1]);
  }
}

// ---- tril / triu ---------------------------------------------------------------------------------

template <typename E>
__global__ void triangleKernel(const E* src, E* out, int64_t rows, int64_t cols, int64_t k, bool lower, int64_t total) {
  COHORT_GRID_STRIDE(e, total) {
    const int64_t j = e % cols;
    const int64_t i = (e / cols) % rows;
    const int64_t diff = j - i;
    const bool keep = lower ? diff <= k : diff >= k;
    out[e] = keep ? src[e] : E(0);
  }
}

// ---- one_hot -------------------------------------------------------------------------------------

__global__ void oneHotKernel(const void* idx, bool index64, int64_t classes, int64_t* out, int64_t total) {
  COHORT_GRID_STRIDE(e, total) { out[e] = loadIndex(idx, index64, e / classes) == e % classes ? 1 : 0; }
}

// ---- dropout -------------------------------------------------------------------------------------

// Philox4x32-10 with the CPU's constants and word order (core/tensor/generator.cc):
// counter = (counter lo, counter hi, 0, 0), key = (seed lo, seed hi).
__device__ __forceinline__ uint4 philox(uint64_t seed, uint64_t counter) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return make_uint4(c0, c1, c2, c3);
}

// Generator::toUniformFloat: the top 24 bits scaled by 2^-24 (exact).
__device__ __forceinline__ float toUniformFloat(uint32_t x) {
  return __fmul_rn(static_cast<float>(x >> 8), 1.0f / 16777216.0f);
}

template <typename E>
__global__ void dropoutMaskKernel(E* mask, int64_t n, uint64_t seed, uint64_t counter, float keep, E scale) {
  const int64_t blocks = (n + 3) / 4;
  COHORT_GRID_STRIDE(b, blocks) {
    const uint4 w = philox(seed, counter + static_cast<uint64_t>(b));
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    for (int k = 0; k < 4; ++k) {
      const int64_t i = b * 4 + k;
      if (i < n) mask[i] = toUniformFloat(words[k]) < keep ? scale : E(0);
    }
  }
}

}  // namespace

void launchIndexCheck(const void* idx, bool index64, int64_t n, int64_t size, bool wantMax, IndexCheckResult* result,
                      cudaStream_t stream) {
  if (n <= 0) return;
  if (index64)
    indexCheckKernel<<<gridFor(n), kThreads, 0, stream>>>(static_cast<const int64_t*>(idx), n, size, wantMax, result);
  else
    indexCheckKernel<<<gridFor(n), kThreads, 0, stream>>>(static_cast<const int32_t*>(idx), n, size, wantMax, result);
}

void launchIndexSelect(const IndexSelectArgs& a, cudaStream_t stream) {
  const int64_t total = a.outer * a.n * a.inner;
  if (total <= 0) return;
  storage::dispatchBySize(a.elemSize, [&]<typename E>() {
    indexSelectKernel<E><<<gridFor(total), kThreads, 0, stream>>>(static_cast<const E*>(a.src), static_cast<E*>(a.out),
                                                                  a.idx, a.index64, a.n, a.len, a.inner, total);
  });
}

size_t indexSortTempBytes(int64_t n, int64_t len) {
  size_t cubBytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, cubBytes, static_cast<const uint64_t*>(nullptr),
                                  static_cast<uint64_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                  static_cast<int64_t*>(nullptr), n, 0, keyBits(len));
  const size_t arrays = alignUp(static_cast<size_t>(n) * sizeof(uint64_t));
  return 2 * arrays + cubBytes;
}

cudaError_t launchIndexSort(const void* idx, bool index64, int64_t n, int64_t len, uint64_t* sortedKeys,
                            int64_t* sortedPos, void* temp, size_t tempBytes, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const size_t arrays = alignUp(static_cast<size_t>(n) * sizeof(uint64_t));
  char* base = static_cast<char*>(temp);
  auto* keysIn = reinterpret_cast<uint64_t*>(base);
  auto* posIn = reinterpret_cast<int64_t*>(base + arrays);
  sortInputsKernel<<<gridFor(n), kThreads, 0, stream>>>(idx, index64, n, keysIn, posIn);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  size_t cubBytes = tempBytes - 2 * arrays;
  return cub::DeviceRadixSort::SortPairs(base + 2 * arrays, cubBytes, keysIn, sortedKeys, posIn, sortedPos, n, 0,
                                         keyBits(len), stream);
}

void launchIndexAddSorted(const IndexAddSortedArgs& a, cudaStream_t stream) {
  const int64_t total = a.outer * a.n * a.inner;
  if (total <= 0) return;
  storage::dispatchNumeric(a.type, [&]<typename T>() {
    indexAddSortedKernel<T><<<gridFor(total), kThreads, 0, stream>>>(static_cast<const T*>(a.g), static_cast<T*>(a.out),
                                                                     a.sortedKeys, a.sortedPos, a.n, a.len, a.inner,
                                                                     total, a.roundEachAdd);
  });
}

void launchGather(const GatherArgs& a, cudaStream_t stream) {
  if (a.numel <= 0) return;
  storage::dispatchBySize(a.elemSize,
                          [&]<typename E>() { gatherKernel<E><<<gridFor(a.numel), kThreads, 0, stream>>>(a); });
}

void launchScatterAdd(const GatherArgs& a, cudaStream_t stream) {
  if (a.numel <= 0) return;
  const int64_t lines = a.numel / a.sizes[a.dim];
  storage::dispatchNumeric(a.type, [&]<typename T>() {
    scatterAddKernel<T><<<gridFor(lines), kThreads, 0, stream>>>(a, lines);
  });
}

void launchMaskedFill(const StridedIter<3>& it, uint64_t valueBits, int elemSize, cudaStream_t stream) {
  if (it.numel <= 0) return;
  storage::dispatchBySize(elemSize, [&]<typename E>() {
    maskedFillKernel<E><<<gridFor(it.numel), kThreads, 0, stream>>>(it, static_cast<E>(valueBits));
  });
}

void launchTriangle(const TriangleArgs& a, cudaStream_t stream) {
  const int64_t total = a.batch * a.rows * a.cols;
  if (total <= 0) return;
  storage::dispatchBySize(a.elemSize, [&]<typename E>() {
    triangleKernel<E><<<gridFor(total), kThreads, 0, stream>>>(static_cast<const E*>(a.src), static_cast<E*>(a.out),
                                                               a.rows, a.cols, a.k, a.lower, total);
  });
}

void launchOneHot(const void* idx, bool index64, int64_t n, int64_t classes, int64_t* out, cudaStream_t stream) {
  const int64_t total = n * classes;
  if (total <= 0) return;
  oneHotKernel<<<gridFor(total), kThreads, 0, stream>>>(idx, index64, classes, out, total);
}

void launchDropoutMask(const DropoutMaskArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  storage::dispatchBySize(a.elemSize, [&]<typename E>() {
    dropoutMaskKernel<E><<<gridFor((a.n + 3) / 4), kThreads, 0, stream>>>(static_cast<E*>(a.mask), a.n, a.seed,
                                                                          a.counter, a.keep,
                                                                          static_cast<E>(a.scaleBits));
  });
}

}  // namespace cohort::cuda::detail
