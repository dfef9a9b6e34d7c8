/*
 * Kernel signatures of the indexing ops (core/ops/index.cc), embedding and dropout
 * (core/ops/nn_ops.cc) for devices other than the CPU (dispatch.h). Each kernel does what the
 * CPU code at its call site does, range checks with the CPU's IndexError messages included; the
 * op keeps its argument checks and autograd recording. Index tensors are int64 or int32, on the
 * data's device, any layout.
 */
#pragma once

#include <cstdint>

#include <cohort/core/ops/dispatch.h>

namespace cohort::dispatch {

// "indexSelect": a.indexSelect(dim, index) for a 1-D index and a.dim() >= 1; "gather": a.gather(dim, index)
// with the shapes checked (a 0-d input or index is treated as shape [1]).
using IndexSelectKernel = Tensor(const Tensor& a, int64_t dim, const Tensor& index);
using GatherKernel = Tensor(const Tensor& a, int64_t dim, const Tensor& index);

// "indexSelect backward": zeros(shape, dt) with g's rows [o, i, :] added at [o, index[i], :],
// each add rounded to dt (index is 1-D, already checked by the forward).
using IndexAddIntoZerosKernel = Tensor(const Shape& shape, DType dt, int64_t dim, const Tensor& index, const Tensor& g);

// "scatterAdd": out (contiguous, out's shape) += src at the positions index names along dim; `op`
// names the op in errors. Range-checks index first.
using ScatterAddKernel = void(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op);

// "tril" / "triu": a with the elements outside the triangle zeroed (a.dim() >= 2).
using TriangleKernel = Tensor(const Tensor& a, int64_t k, bool lower);

// "oneHot": int64 [..., classes] (numClasses -1: inferred from the largest label).
using OneHotKernel = Tensor(const Tensor& indices, int64_t numClasses);

// "embedding": weight's rows picked by indices, shape indices.sizes() + [dim] (weight is 2-D).
using EmbeddingKernel = Tensor(const Tensor& indices, const Tensor& weight);
// "embedding backward": the weight's gradient of shape wShape, rows of g (contiguous [n, dim], in
// indices' order) summed per index in the compute type, in increasing position (deterministic).
using EmbeddingBackwardKernel = Tensor(const Tensor& indices, const Tensor& g, const Shape& wShape);

// "dropout": fills mask (contiguous, x's float dtype) with 0 or 1/(1-p) from Philox blocks
// counter, counter + 1, ... under seed: element i from word i % 4 of block i / 4, kept when its
// uniform float is < 1 - p (the same words and test as the CPU, so the same mask).
using DropoutMaskKernel = void(Tensor& mask, uint64_t seed, uint64_t counter, double p);

// "maskedFill" uses BinaryScalarKernel (out, a, mask, value); out may be a itself.

}  // namespace cohort::dispatch
