/*
 * Launchers of the reduction kernels (core/cuda/reduce.cu), over raw device pointers. The source is
 * a dense [outer, reduced, inner] buffer (core/ops/detail/reduce_impl.h plans every reduction into
 * that form); results are dense [outer, inner].
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cohort/core/cuda/detail/kernel_args.h>

namespace cohort::cuda::detail {

enum class ReduceOp : uint8_t { Sum, Mean, Amax, Amin, Norm, Var, Std };

struct ReduceArgs {
  ReduceOp op = ReduceOp::Sum;
  ElemType type = ElemType::Float32;  // the source's; the result is the same type, int64 for integer sums
  const void* src = nullptr;
  void* out = nullptr;
  int64_t outer = 1, reduced = 1, inner = 1;
  double param = 1.0;  // Mean: scale; Norm: p; Var/Std: divisor
};

// Bytes of device scratch that launchReduce needs for these arguments on the current device (0
// when the reduction needs no second pass).
int64_t reduceWorkspaceBytes(const ReduceArgs& a);
// outer * inner > 0. `workspace` holds reduceWorkspaceBytes(a) bytes (may be null when that is 0).
void launchReduce(const ReduceArgs& a, void* workspace, cudaStream_t stream);

struct ArgReduceArgs {
  bool isMax = true;
  ElemType type = ElemType::Float32;
  const void* src = nullptr;
  void* values = nullptr;  // optional, the source's type
  int64_t* indices = nullptr;
  int64_t outer = 1, reduced = 1, inner = 1;  // reduced >= 1
};
int64_t argReduceWorkspaceBytes(const ArgReduceArgs& a);
void launchArgReduce(const ArgReduceArgs& a, void* workspace, cudaStream_t stream);

// grad (dense [outer, reduced, inner], already zero) gets g[o, i] at r = indices[o, i].
void launchArgScatter(ElemType type, void* grad, const int64_t* indices, const void* g, int64_t outer, int64_t reduced,
                      int64_t inner, cudaStream_t stream);

// Same values as cohort::detail::ReduceGradMap.
enum class GradMapKind : uint8_t { Hits, Share, StdScale, Var, Norm };
// out = map(x, a, b) over operand 0's shape (StridedIter<4>: out, x, a, b; b's data null when unused).
void launchReduceGradMap(ElemType type, const StridedIter<4>& it, GradMapKind kind, double param, cudaStream_t stream);

}  // namespace cohort::cuda::detail
