/*
 * Tensor: a strided view of a Storage with a dtype, plus autograd metadata.
 *
 * Ownership: Tensor is a cheap handle (shared_ptr<TensorImpl>); copies alias the same tensor.
 * Views (view, transpose, slice, expand, ...) make new TensorImpls over the same Storage and share
 * its version counter, so an in-place change through any alias is seen by autograd's saved-tensor
 * checks. A default-constructed Tensor is undefined (defined() == false).
 *
 * Threads: a tensor may be read from several threads; writes (in-place ops, setGrad) need the
 * caller's synchronisation. The autograd engine runs backward on the calling thread.
 *
 * Errors: bad shapes, dtypes, dims and indices throw ValueError / IndexError naming the op and
 * the shapes or dtypes involved.
 *
 * Member functions are conveniences that forward to the free functions in core/ops/ops.h.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/tensor/device.h>
#include <cohort/core/tensor/dtype.h>
#include <cohort/core/tensor/scalar.h>
#include <cohort/core/tensor/storage.h>

namespace cohort {

using Shape = std::vector<int64_t>;
std::string shapeStr(const Shape& s);  // "[2, 3]"
class Tensor;
class Generator;
// Re-tags the memory under a tensor (its whole storage) as being for `c` (allocator.h).
void setMemoryCategory(const Tensor& t, MemoryCategory c);
namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  bool requiresGrad = false;
};

// A gradient hook: may return a replacement gradient (or nullopt to keep it).
using GradHook = std::function<std::optional<Tensor>(const Tensor& grad)>;
// Runs after a leaf's .grad was updated during backward; receives the leaf itself.
using PostAccumulateGradHook = std::function<void(Tensor& leaf)>;

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, int64_t offset, Shape sizes, Shape strides, DType dtype);
  ~TensorImpl();

  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype;
  int64_t numel = 0;
  bool contiguous = true;
  bool isView = false;                             // shares storage with the tensor it was made from
  std::shared_ptr<std::atomic<uint32_t>> version;  // shared by views and detach()
  std::unique_ptr<autograd::AutogradMeta> autograd;

  void refreshMetadata();  // recomputes numel and contiguous after sizes/strides change
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ---------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  int64_t dim() const;
  const Shape& sizes() const;
  const Shape& shape() const { return sizes(); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  const Shape& strides() const;
  int64_t stride(int64_t dim) const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool isContiguous() const;
  bool isFloatingPoint() const { return isFloating(dtype()); }
  size_t elementSize() const { return cohort::elementSize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * elementSize(); }
  int64_t storageOffset() const;
  const std::shared_ptr<Storage>& storage() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& implPtr() const { return impl_; }
  bool isSameAs(const Tensor& o) const { return impl_ == o.impl_; }
  // Points at element [0,...,0]. Throws when the storage was released or the tensor is undefined.
  void* dataPtr() const;
  // Typed pointer; throws ValueError when T does not match dtype().
  template <typename T>
  T* data() const {
    COHORT_CHECK_T(ValueError, DTypeOf<T>::value == dtype(), "Tensor::data<{}>() on a {} tensor",
                   dtypeName(DTypeOf<T>::value), dtype());
    return static_cast<T*>(dataPtr());
  }
  // The single element of a one-element tensor, converted to T. An integer T reads integer
  // tensors exactly (int64 values above 2^53 survive); a floating-point value is truncated
  // toward zero, and one that is NaN, infinite or outside int64's range is a ValueError.
  template <typename T>
  T item() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return static_cast<T>(itemInt64());
    } else {
      return static_cast<T>(itemDouble());
    }
  }
  double itemDouble() const;
  int64_t itemInt64() const;
  // All elements (in logical row-major order) converted to T.
  template <typename T>
  std::vector<T> toVector() const;
  std::string toString() const;  // shape, dtype and (for small tensors) values

  // ---- autograd ---------------------------------------------------------------------------
  bool requiresGrad() const;
  // Only leaves can change requiresGrad; returns *this.
  Tensor& setRequiresGrad(bool requiresGrad = true);
  bool isLeaf() const;            // no gradFn (user-created or detached)
  Tensor grad() const;            // undefined until backward produced one (a handle: in-place ops on it change .grad)
  void setGrad(const Tensor& g);  // undefined g clears it
  std::shared_ptr<autograd::Node> gradFn() const;
  uint32_t outputNr() const;
  // Backward from this tensor. `gradient` may be omitted only for one-element tensors.
  void backward(const Tensor& gradient = Tensor(), bool retainGraph = false) const;
  Tensor detach() const;  // shares storage and version counter, no history
  Tensor& detach_();
  // Gradient hook on this tensor (leaf or not); returns a handle for removeHook.
  int registerHook(GradHook hook);
  void removeHook(int handle);
  // Leaf tensors only: runs after .grad was accumulated in backward (DDP's ready signal).
  int registerPostAccumulateGradHook(PostAccumulateGradHook hook);
  void removePostAccumulateGradHook(int handle);
  void retainGrad();  // non-leaf: keep .grad after backward
  uint32_t version() const;
  void bumpVersion() const;

  // ---- views (no copy) --------------------------------------------------------------------
  Tensor view(const Shape& shape) const;     // -1 infers one dim; needs compatible strides
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const Shape& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // clamps like Python
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim
  Tensor expandAs(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t startDim = 0, int64_t endDim = -1) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t splitSize, int64_t dim = 0) const;
  std::vector<Tensor> split(const Shape& sizes, int64_t dim = 0) const;
  Tensor asStrided(const Shape& sizes, const Shape& strides, int64_t offset) const;  // no autograd

  Tensor contiguous() const;  // self when already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;  // self when already that dtype
  Tensor to(Device device) const;

  // ---- elementwise math (broadcasting) ---------------------------------------------------
  Tensor add(const Tensor& o, Scalar alpha = 1) const;
  Tensor sub(const Tensor& o, Scalar alpha = 1) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor neg() const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(Scalar exponent) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor abs() const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor relu() const;
  Tensor gelu(bool tanhApprox = false) const;
  Tensor silu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor maskedFill(const Tensor& mask, Scalar value) const;

  // ---- in-place (bump the version counter) -----------------------------------------------
  Tensor& add_(const Tensor& o, Scalar alpha = 1);
  Tensor& add_(Scalar v);
  Tensor& sub_(const Tensor& o, Scalar alpha = 1);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(Scalar v);
  Tensor& div_(const Tensor& o);
  Tensor& div_(Scalar v);
  Tensor& addcmul_(const Tensor& t1, const Tensor& t2, Scalar value = 1);  // self += value*t1*t2
  Tensor& addcdiv_(const Tensor& t1, const Tensor& t2, Scalar value = 1);  // self += value*t1/t2
  Tensor& lerp_(const Tensor& end, Scalar weight);                         // self += w*(end-self)
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& sqrt_();
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& zero_();
  Tensor& fill_(Scalar v);
  Tensor& maskedFill_(const Tensor& mask, Scalar value);

  // ---- reductions (dims may be negative; empty dims = all) --------------------------------
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor max() const;  // all elements
  Tensor min() const;
  std::pair<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;  // values, int64 indices
  std::pair<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;  // index into the flattened tensor
  Tensor var(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor norm(double p = 2, const Shape& dims = {}, bool keepdim = false) const;

  // ---- linear algebra and others ------------------------------------------------------
  Tensor matmul(const Tensor& o) const;
  Tensor softmax(int64_t dim) const;
  Tensor logSoftmax(int64_t dim) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor indexSelect(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatterAdd(int64_t dim, const Tensor& index, const Tensor& src) const;

 private:
  void requireDefined(const char* what) const;
  void requireScalar() const;  // item's checks: defined, one element
  std::shared_ptr<TensorImpl> impl_;
};

// Operators (broadcasting; a Scalar operand keeps the tensor's dtype unless it promotes it).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Normalises a possibly negative dim for a tensor of `ndim` dims; IndexError naming `op` otherwise.
int64_t wrapDim(int64_t dim, int64_t ndim, const char* op);
// Contiguous row-major strides for a shape.
Shape contiguousStrides(const Shape& sizes);
int64_t shapeNumel(const Shape& sizes);
// The broadcast of two shapes; ValueError naming `op` and both shapes when they do not broadcast.
Shape broadcastShapes(const Shape& a, const Shape& b, const char* op);

}  // namespace cohort
