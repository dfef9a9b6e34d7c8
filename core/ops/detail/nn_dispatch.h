/*
 * Kernel signatures of the normalisation and loss functions (core/ops/nn_ops.cc) for devices other
 * than the CPU (internal to core/ops). Sources are dense: softmax takes the planned
 * [outer, n, inner] source of detail::planReduce, layer norm a contiguous [m, n] input, the losses
 * contiguous inputs and targets.
 */
#pragma once

#include <cstdint>

#include <cohort/core/tensor/tensor.h>

namespace cohort::detail {

// y[o, :, i] = softmax (or log_softmax) of src[o, :, i]; y dense, src's shape. Registered under
// "softmax" and "logSoftmax".
using SoftmaxKernel = void(Tensor& y, const Tensor& src, int64_t outer, int64_t n, int64_t inner);
// dx from the saved output y and the output gradient g (all dense [outer, n, inner]). Registered
// under "softmax backward" and "logSoftmax backward".
using SoftmaxBackwardKernel = void(Tensor& dx, const Tensor& y, const Tensor& g, int64_t outer, int64_t n,
                                   int64_t inner);

// Class-index losses over input [n, c, d] and target [n, d] (both contiguous): perPos[k] =
// -input[n, target[k], d] (0 where the target is ignoreIndex) and, when validMask is defined, 1/0
// per position in the input's dtype. Returns the number of positions not ignored; a label outside
// [0, c) other than ignoreIndex is an IndexError naming `op`, the label and c (the kernel reads
// that result back, so the call waits for the device). Registered under "nllLoss".
using NllForwardKernel = int64_t(Tensor& perPos, Tensor& validMask, const Tensor& input, const Tensor& target,
                                 int64_t n, int64_t c, int64_t d, int64_t ignoreIndex, const char* op);
// dx (dense [n, c, d]) = 0 except dx[n, target[k], d] = -g * scale at positions not ignored, with
// g = grad[k] when perPosition, else grad[0]. Registered under "nllLoss backward".
using NllBackwardKernel = void(Tensor& dx, const Tensor& target, const Tensor& grad, int64_t n, int64_t c, int64_t d,
                               int64_t ignoreIndex, double scale, bool perPosition);

// Layer norm over rows of n elements of a contiguous [m, n] x; weight and bias ([n]) optional
// (undefined). mean and rstd are [m], float32 (float64 for a float64 x). Registered under
// "layerNorm".
using LayerNormKernel = void(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t m, int64_t n, double eps);
// Gradients of layerNorm; dx, dw, db are allocated by the caller, undefined when not wanted.
// Registered under "layerNorm backward".
using LayerNormBackwardKernel = void(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& x, const Tensor& weight,
                                     const Tensor& grad, const Tensor& mean, const Tensor& rstd, int64_t m, int64_t n);

}  // namespace cohort::detail
