/*
 * The tensor operations as free functions, by family. Every function here is differentiable
 * where it makes sense (autograd records it when grad mode is on and an input requires grad);
 * comparisons, argmax, indices and factories are not.
 *
 * Which file implements what:
 *   core/tensor/factories.cc   factories
 *   core/tensor/views.cc       view ops (Tensor members), cat, stack, contiguous, clone, to
 *   core/ops/elementwise.cc    arithmetic and unary math (vectorizable float math in vec_math.h)
 *   core/ops/compare.cc        comparisons, where, maximum/minimum
 *   core/ops/activation.cc     relu, gelu, silu, sigmoid, tanh
 *   core/ops/inplace.cc        the in-place Tensor members (add_, mul_, addcmul_, ...)
 *   core/ops/reduce.cc         reductions (max/min/argmax/argmin over a dim: reduce_extreme.cc)
 *   core/ops/linalg.cc         matmul, bmm, linear, addmm (through core/blas)
 *   core/ops/nn_ops.cc         softmax, log_softmax, losses, layer_norm, dropout, embedding
 *   core/ops/conv.cc           conv2d, pooling
 *   core/ops/index.cc          index_select, gather, scatter_add, masked_fill, tril/triu, one_hot
 */
#pragma once

#include <optional>
#include <vector>

#include <cohort/core/tensor/generator.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort {

// ---- factories (core/tensor/factories.cc) ---------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions opts = {});
Tensor zerosLike(const Tensor& t);
Tensor onesLike(const Tensor& t);
Tensor emptyLike(const Tensor& t);
Tensor fullLike(const Tensor& t, Scalar value);
// [start, end) with step; dtype int64 when all three are integral and opts.dtype is unset...
// (opts.dtype is used as given; pass {.dtype = DType::Int64} for integer ranges).
Tensor arange(Scalar end, TensorOptions opts = {});
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opts = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {});
Tensor eye(int64_t n, int64_t m = -1, TensorOptions opts = {});
// Random factories draw from `gen`, or the default CPU generator when null.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0,1)
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0,1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {.dtype = DType::Int64},
               Generator* gen = nullptr);  // [low, high)
// Copies values into a new tensor of the given shape (1-D when shape is empty) and dtype.
template <typename T>
Tensor fromVector(const std::vector<T>& values, const Shape& shape = {},
                  TensorOptions opts = {.dtype = DTypeOf<T>::value});
Tensor scalarTensor(Scalar v, TensorOptions opts = {});
// In-place random fills (used by nn initialisers).
Tensor& uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen = nullptr);

// ---- joining (core/tensor/views.cc) ---------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// ---- elementwise (core/ops/elementwise.cc) ----------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor rsub(const Tensor& a, Scalar b);  // b - a
Tensor neg(const Tensor& a);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(const Tensor& a, Scalar exponent);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);  // comparisons return bool tensors
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanhApprox = false);
Tensor silu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);

// ---- reductions (core/ops/reduce.cc, reduce_extreme.cc) -----------------------------------------
Tensor sum(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& a, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& a, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor norm(const Tensor& a, double p = 2, const Shape& dims = {}, bool keepdim = false);
// Sums `a` down to `shape` (the reverse of broadcasting); used by autograd.
Tensor sumToShape(const Tensor& a, const Shape& shape);

// ---- linear algebra (core/ops/linalg.cc) -----------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);  // 1-D/2-D/batched with broadcasting, like torch
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());  // x W^T + b
Tensor addmm(const Tensor& self, const Tensor& a, const Tensor& b, Scalar beta = 1, Scalar alpha = 1);

// ---- indexing (core/ops/index.cc) ------------------------------------------------------------
Tensor indexSelect(const Tensor& a, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatterAdd(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor maskedFill(const Tensor& a, const Tensor& mask, Scalar value);
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
Tensor oneHot(const Tensor& indices, int64_t numClasses = -1);  // int64 result

}  // namespace cohort
