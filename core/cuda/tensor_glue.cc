// From Tensors to the CUDA kernels' raw arguments (detail/tensor_glue.h), and CUDA error messages.
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/tensor/iter.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda::detail {

void throwCudaError(cudaError_t e, const char* what, const char* file, int line) {
  std::string msg =
      fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
  if (e == cudaErrorMemoryAllocation) throw Error(msg);
  if (e == cudaErrorNoKernelImageForDevice)
    msg += "; this build has no kernels for this GPU's architecture: rebuild with -DCMAKE_CUDA_ARCHITECTURES=native";
  throw Error(msg);
}

void* devicePtr(const Tensor& t) {
  COHORT_CHECK_T(ValueError, t.defined(), "a CUDA kernel was given an undefined tensor");
  const Storage& s = *t.storage();
  COHORT_CHECK_T(NotSupportedError, s.device().isCuda(), "a tensor of shape {} on {} was given to a CUDA kernel",
                 shapeStr(t.sizes()), s.device());
  if (s.released())
    throw Error(fmt::format("tensor of shape {} ({}) views storage that was freed; its data cannot be used until "
                            "the storage is reallocated{}{}",
                            shapeStr(t.sizes()), t.dtype(), s.releasedNote().empty() ? "" : ": ", s.releasedNote()));
  return static_cast<char*>(s.data()) + t.storageOffset() * static_cast<int64_t>(t.elementSize());
}

void requireSameDevice(const char* op, Device device, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t != nullptr && t->defined() && t->device() != device)
      throw ValueError(fmt::format("{}: tensors are on different devices ({} and {})", op, device, t->device()));
}

template <int NIn>
StridedIter<NIn + 1> makeIter(const Tensor& out, const std::array<const Tensor*, NIn>& ins) {
  constexpr int N = NIn + 1;
  StridedIter<N> it;
  const Shape& shape = out.sizes();
  COHORT_CHECK_T(NotSupportedError, static_cast<int>(shape.size()) <= kMaxDims,
                 "CUDA kernels take at most {} dims, not {}", kMaxDims, shape.size());
  std::array<Shape, N> st;
  st[0] = cohort::detail::broadcastByteStrides(out, shape);
  it.data[0] = static_cast<char*>(devicePtr(out));
  for (int k = 0; k < NIn; ++k) {
    st[k + 1] = cohort::detail::broadcastByteStrides(*ins[k], shape);
    it.data[k + 1] = static_cast<char*>(devicePtr(*ins[k]));
  }
  it.numel = out.numel();
  // Drop size-1 dims, then merge neighbours (outer d-1 into inner d) where every operand steps
  // evenly: stride[d-1] == stride[d] * size[d].
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (int k = 0; k < N && merge; ++k) merge = strides[k].back() == st[k][d] * shape[d];
    if (merge) {
      sizes.back() *= shape[d];
      for (int k = 0; k < N; ++k) strides[k].back() = st[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (int k = 0; k < N; ++k) strides[k].push_back(st[k][d]);
    }
  }
  it.ndim = static_cast<int>(sizes.size());
  it.contiguous = true;
  for (int d = 0; d < it.ndim; ++d) {
    it.sizes[d] = sizes[static_cast<size_t>(d)];
    for (int k = 0; k < N; ++k) it.strides[k][d] = strides[k][static_cast<size_t>(d)];
  }
  // Dense in one order: a single dim left (or none) with each operand's stride equal to its element size.
  if (it.ndim > 1) it.contiguous = false;
  for (int k = 0; k < N && it.ndim == 1; ++k) {
    int64_t es = static_cast<int64_t>(k == 0 ? out.elementSize() : ins[static_cast<size_t>(k - 1)]->elementSize());
    if (it.strides[k][0] != es) it.contiguous = false;
  }
  return it;
}

template StridedIter<1> makeIter<0>(const Tensor&, const std::array<const Tensor*, 0>&);
template StridedIter<2> makeIter<1>(const Tensor&, const std::array<const Tensor*, 1>&);
template StridedIter<3> makeIter<2>(const Tensor&, const std::array<const Tensor*, 2>&);
template StridedIter<4> makeIter<3>(const Tensor&, const std::array<const Tensor*, 3>&);

}  // namespace cohort::cuda::detail
