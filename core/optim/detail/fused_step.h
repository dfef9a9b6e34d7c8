/*
 * Kernel signatures of the fused optimizer steps for devices other than the CPU (dispatch.h).
 * A kernel updates one parameter in place with the arithmetic of update_math.h, exactly as the
 * CPU loop in sgd.cc / adam.cc does: p, g and the state tensors are contiguous, of p's dtype, on
 * p's device.
 */
#pragma once

#include <cohort/core/ops/dispatch.h>
#include <cohort/core/optim/detail/update_math.h>

namespace cohort::optim::detail {

// The fused steps by device (dispatch.h). p, the state tensors and g are contiguous and of p's shape;
// the state has p's dtype, and g has it too or, for a float32 p, is bfloat16 or float16.
// "SGD.step": buf is undefined without momentum.
using SgdStepKernel = void(Tensor& p, const Tensor& g, Tensor& buf, const SgdScalars& s);
// "Adam.step" and "AdamW.step": vmax is undefined without amsgrad.
using AdamStepKernel = void(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& vmax, const AdamScalars& s);

}  // namespace cohort::optim::detail
