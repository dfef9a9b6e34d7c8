/*
 * Launchers of the indexing, embedding and dropout kernels (core/cuda/index.cu), over raw device
 * pointers. Internal to core/cuda: the Tensor-level glue is core/cuda/index_ops.cc.
 *
 * Index arrays are contiguous int64 or int32 (`index64` says which), already range-checked with
 * launchIndexCheck unless a launcher says otherwise. Element data is moved as raw bits of
 * `elemSize` bytes (1, 2, 4 or 8) where the op only copies; kernels that add take the ElemType.
 * Offsets are int64 element counts. Launchers return at once for an empty problem; the caller checks the launch
 * (COHORT_CUDA_CHECK_LAUNCH).
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail {

// What launchIndexCheck leaves in device memory. Filling it with 0xff bytes initializes it:
// badPos = UINT64_MAX (no bad index yet), maxValue = -1.
struct IndexCheckResult {
  unsigned long long badPos;  // smallest position holding a value outside [0, size)
  long long maxValue;         // largest value seen (only with wantMax)
};

// Checks idx[0, n) against [0, size); `result` must be initialized as above.
void launchIndexCheck(const void* idx, bool index64, int64_t n, int64_t size, bool wantMax, IndexCheckResult* result,
                      cudaStream_t stream);

// out[o, i, r] = src[o, idx[i], r] with src contiguous [outer, len, inner], out [outer, n, inner].
struct IndexSelectArgs {
  const void* src = nullptr;
  void* out = nullptr;
  const void* idx = nullptr;
  bool index64 = true;
  int64_t outer = 0, n = 0, len = 0, inner = 0;
  int elemSize = 0;
};
void launchIndexSelect(const IndexSelectArgs& a, cudaStream_t stream);

// Sorts positions 0..n-1 by idx (stably: equal indices keep increasing positions). Keys are idx
// as uint64 (all in [0, len)), values the positions. `temp` holds indexSortTempBytes(n, len) bytes.
// Returns the error of the sort (CUB) or of the launch.
size_t indexSortTempBytes(int64_t n, int64_t len);
cudaError_t launchIndexSort(const void* idx, bool index64, int64_t n, int64_t len, uint64_t* sortedKeys,
                            int64_t* sortedPos, void* temp, size_t tempBytes, cudaStream_t stream);

// out[o, k, r] = sum over i with idx[i] == k, in increasing i, of g[o, i, r], for every k that
// occurs (other rows are not written: the caller zeroes out first). With roundEachAdd the sum is
// rounded to the element type after every add (index_select's backward on the CPU); without, it
// is kept in the compute type (float for half types) and rounded once (embedding's backward).
// g is contiguous [outer, n, inner], out contiguous [outer, len, inner].
struct IndexAddSortedArgs {
  const void* g = nullptr;
  void* out = nullptr;
  const uint64_t* sortedKeys = nullptr;
  const int64_t* sortedPos = nullptr;
  int64_t outer = 0, n = 0, len = 0, inner = 0;
  ElemType type = ElemType::Float32;
  bool roundEachAdd = true;
};
void launchIndexAddSorted(const IndexAddSortedArgs& a, cudaStream_t stream);

// Shape of a gather/scatter problem: `sizes` is the index's shape (ndim >= 1; a 0-d index is
// shape [1]); strides are element strides of each operand (any layout, no broadcast).
struct GatherArgs {
  int ndim = 0;
  int dim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t srcStrides[kMaxDims] = {};
  int64_t outStrides[kMaxDims] = {};
  int64_t idxStrides[kMaxDims] = {};
  const void* src = nullptr;
  void* out = nullptr;
  const void* idx = nullptr;
  bool index64 = true;
  int64_t numel = 0;  // product of sizes
  int elemSize = 0;
  ElemType type = ElemType::Float32;  // scatterAdd only
};
// gather: out[p] = src[p with p[dim] replaced by idx[p]].
void launchGather(const GatherArgs& a, cudaStream_t stream);
// scatterAdd: out[p with p[dim] replaced by idx[p]] += src[p], each add rounded to the element
// type, in increasing p[dim] for each target (as the CPU's row-major walk): one thread per line
// along dim, so no two threads touch one element and the result is deterministic.
void launchScatterAdd(const GatherArgs& a, cudaStream_t stream);

// out = mask ? value : a (broadcast; operands 0 = out, 1 = a, 2 = mask as bool bytes). value is
// the element's bits in the low elemSize bytes.
void launchMaskedFill(const StridedIter<3>& it, uint64_t valueBits, int elemSize, cudaStream_t stream);

// tril/triu on contiguous [batch, rows, cols]: keep a[b, i, j] where (lower ? j - i <= k : j - i >= k).
struct TriangleArgs {
  const void* src = nullptr;
  void* out = nullptr;
  int64_t batch = 0, rows = 0, cols = 0, k = 0;
  bool lower = true;
  int elemSize = 0;
};
void launchTriangle(const TriangleArgs& a, cudaStream_t stream);

// out[i, c] = (idx[i] == c) as int64, out contiguous [n, classes].
void launchOneHot(const void* idx, bool index64, int64_t n, int64_t classes, int64_t* out, cudaStream_t stream);

// Dropout's mask, element i from word i % 4 of Philox block (counter + i / 4) under seed (the
// CPU's Generator::philox): scaleBits when toUniformFloat(word) < keep, else 0 bits.
struct DropoutMaskArgs {
  void* mask = nullptr;
  int64_t n = 0;
  uint64_t seed = 0, counter = 0;
  float keep = 0.0f;
  uint64_t scaleBits = 0;
  int elemSize = 0;
};
void launchDropoutMask(const DropoutMaskArgs& a, cudaStream_t stream);

}  // namespace cohort::cuda::detail
