// Internal to core/cuda (.cc files only): from Tensors to the kernels' raw arguments.
#pragma once

#include <array>

#include <cohort/core/cuda/detail/check.h>
#include <cohort/core/cuda/detail/kernel_args.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::cuda::detail {

static_assert(static_cast<int>(ElemType::Bool) == static_cast<int>(DType::Bool) &&
              static_cast<int>(ElemType::BFloat16) == static_cast<int>(DType::BFloat16));
inline ElemType elemType(DType t) { return static_cast<ElemType>(t); }

// The address of t's first element on its CUDA device (Tensor::dataPtr is for CPU kernels). Checks
// what dataPtr checks: a defined tensor on CUDA whose storage was not released.
void* devicePtr(const Tensor& t);

// `out` and inputs broadcast to out's shape, dims coalesced (kernel_args.h). All tensors must be on
// out's device.
template <int NIn>
StridedIter<NIn + 1> makeIter(const Tensor& out, const std::array<const Tensor*, NIn>& ins);

// Throws ValueError naming `op` unless every tensor is on `device` (one CUDA device per op).
void requireSameDevice(const char* op, Device device, std::initializer_list<const Tensor*> tensors);

}  // namespace cohort::cuda::detail
