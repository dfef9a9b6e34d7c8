/*
 * Arguments of the CUDA kernels' launchers (internal to core/cuda). Shared by the kernels (.cu,
 * compiled by nvcc) and the op glue (.cc): plain structs over raw device pointers, with no cohort
 * tensor headers and no fmt, which nvcc's host pass does not compile.
 */
#pragma once

#include <cstdint>

namespace cohort::cuda::detail {

// The same values as cohort::DType (tensor_glue.h checks it).
enum class ElemType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8, Bool };

constexpr int kMaxDims = 16;

// N operands walked over one shape: the element at index (i_0 .. i_{ndim-1}) of operand k is at
// data[k] + sum_d i_d * strides[k][d] bytes (stride 0 on broadcast dims). Operand 0 is the output.
// Dims are coalesced where every operand allows it, and `contiguous` says every operand is dense
// in the same order, so a kernel may index all of them with one flat index.
template <int N>
struct StridedIter {
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  char* data[N] = {};
  int64_t strides[N][kMaxDims] = {};
  bool contiguous = false;
};

}  // namespace cohort::cuda::detail
