// View operations (no copy), joining, copies and conversions.
#include <algorithm>
#include <numeric>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/detail/elementwise_dispatch.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {
namespace {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

Tensor makeView(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>(base.storage(), offset, std::move(sizes), std::move(strides), base.dtype());
  impl->version = base.impl()->version;
  impl->isView = true;
  return Tensor(std::move(impl));
}

// Infers a -1 entry and checks the element count.
Shape inferShape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) throw ValueError(fmt::format("{}: only one dimension can be -1, got {}", op, shapeStr(shape)));
      infer = static_cast<int64_t>(i);
    } else if (out[i] < 0) {
      throw ValueError(fmt::format("{}: invalid size {} in shape {}", op, out[i], shapeStr(shape)));
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw ValueError(fmt::format("{}: shape {} is invalid for input of shape {} ({} elements)", op, shapeStr(shape),
                                   shapeStr(from), numel));
    out[infer] = numel / known;
  } else if (known != numel) {
    throw ValueError(fmt::format("{}: shape {} is invalid for input of shape {} ({} elements)", op, shapeStr(shape),
                                 shapeStr(from), numel));
  }
  return out;
}

// Strides for viewing (sizes, strides) as newShape without a copy, or nullopt (torch's computeStride).
std::optional<Shape> viewStrides(const Shape& sizes, const Shape& strides, const Shape& newShape) {
  if (sizes.empty()) return Shape(newShape.size(), 1);
  int64_t numel = shapeNumel(sizes);
  if (numel == 0) return contiguousStrides(newShape);
  Shape out(newShape.size());
  int64_t viewD = static_cast<int64_t>(newShape.size()) - 1;
  int64_t chunkBaseStride = strides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensorNumel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensorNumel * chunkBaseStride)) {
      while (viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1)) {
        out[viewD] = viewNumel * chunkBaseStride;
        viewNumel *= newShape[viewD];
        viewD--;
      }
      if (viewNumel != tensorNumel) return std::nullopt;
      if (d > 0) {
        chunkBaseStride = strides[d - 1];
        tensorNumel = 1;
        viewNumel = 1;
      }
    }
  }
  if (viewD != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  requireDefined("view");
  Shape ns = inferShape(shape, numel(), "view", sizes());
  auto st = viewStrides(sizes(), strides(), ns);
  if (!st)
    throw ValueError(fmt::format("view: shape {} is not compatible with the input's shape {} and strides {}; use "
                                 "reshape() (which copies) or contiguous() first",
                                 shapeStr(ns), shapeStr(sizes()), shapeStr(strides())));
  Tensor out = makeView(*this, ns, *st, storageOffset());
  Shape orig = sizes();
  autograd::record("view", {*this}, {out}, {},
                   [orig](Ctx&, const GradList& g) -> GradList { return {g[0].reshape(orig)}; });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  requireDefined("reshape");
  Shape ns = inferShape(shape, numel(), "reshape", sizes());
  if (viewStrides(sizes(), strides(), ns)) return view(ns);
  return contiguous().view(ns);
}

Tensor Tensor::permute(const Shape& dims) const {
  requireDefined("permute");
  int64_t n = dim();
  if (static_cast<int64_t>(dims.size()) != n)
    throw ValueError(fmt::format("permute: got {} dims {} for a tensor of {} dims", dims.size(), shapeStr(dims), n));
  Shape ns(n), nst(n), inverse(n);
  std::vector<bool> used(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrapDim(dims[i], n, "permute");
    if (used[d]) throw ValueError(fmt::format("permute: dim {} repeats in {}", d, shapeStr(dims)));
    used[d] = true;
    ns[i] = sizes()[d];
    nst[i] = strides()[d];
    inverse[d] = i;
  }
  Tensor out = makeView(*this, ns, nst, storageOffset());
  autograd::record("permute", {*this}, {out}, {},
                   [inverse](Ctx&, const GradList& g) -> GradList { return {g[0].permute(inverse)}; });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  requireDefined("transpose");
  int64_t n = dim();
  if (n == 0) return *this;
  d0 = wrapDim(d0, n, "transpose");
  d1 = wrapDim(d1, n, "transpose");
  Shape p(n);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[d0], p[d1]);
  return permute(p);
}

Tensor Tensor::t() const {
  requireDefined("t");
  if (dim() > 2)
    throw ValueError(fmt::format("t: expects a tensor of at most 2 dims, got shape {}", shapeStr(sizes())));
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  requireDefined("slice");
  if (dim() == 0) throw IndexError("slice: cannot slice a 0-dimensional tensor");
  d = wrapDim(d, dim(), "slice");
  if (step <= 0) throw ValueError(fmt::format("slice: step must be positive, got {}", step));
  int64_t len = sizes()[d];
  if (start < 0) start += len;
  if (end < 0) end += len;
  start = std::clamp<int64_t>(start, 0, len);
  end = std::clamp<int64_t>(end, start, len);
  Shape ns = sizes(), nst = strides();
  ns[d] = (end - start + step - 1) / step;
  nst[d] = strides()[d] * step;
  Tensor out = makeView(*this, ns, nst, storageOffset() + start * strides()[d]);
  Shape orig = sizes();
  DType dt = dtype();
  autograd::record("slice", {*this}, {out}, {}, [orig, dt, d, start, end, step](Ctx&, const GradList& g) -> GradList {
    Tensor gi = zeros(orig, {.dtype = dt, .device = g[0].device()});
    gi.slice(d, start, end, step).copy_(g[0]);
    return {gi};
  });
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  requireDefined("narrow");
  if (dim() == 0) throw IndexError("narrow: cannot narrow a 0-dimensional tensor");
  d = wrapDim(d, dim(), "narrow");
  int64_t len = sizes()[d];
  if (start < 0) start += len;
  if (start < 0 || length < 0 || start + length > len)
    throw IndexError(
        fmt::format("narrow: start {} and length {} are out of range for dim {} of size {}", start, length, d, len));
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  requireDefined("select");
  if (dim() == 0) throw IndexError("select: cannot select on a 0-dimensional tensor");
  d = wrapDim(d, dim(), "select");
  int64_t len = sizes()[d];
  if (index < -len || index >= len)
    throw IndexError(fmt::format("select: index {} is out of range for dim {} of size {} (shape {})", index, d, len,
                                 shapeStr(sizes())));
  if (index < 0) index += len;
  Shape ns = sizes(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  Tensor out = makeView(*this, ns, nst, storageOffset() + index * strides()[d]);
  Shape orig = sizes();
  DType dt = dtype();
  autograd::record("select", {*this}, {out}, {}, [orig, dt, d, index](Ctx&, const GradList& g) -> GradList {
    Tensor gi = zeros(orig, {.dtype = dt, .device = g[0].device()});
    gi.select(d, index).copy_(g[0]);
    return {gi};
  });
  return out;
}

Tensor Tensor::expand(const Shape& shape) const {
  requireDefined("expand");
  int64_t n = static_cast<int64_t>(shape.size());
  if (n < dim())
    throw ValueError(fmt::format("expand: target shape {} has fewer dims than the tensor's shape {}", shapeStr(shape),
                                 shapeStr(sizes())));
  Shape ns(n), nst(n);
  int64_t off = n - dim();
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = shape[i];
    if (i < off) {
      if (want < 0)
        throw ValueError(fmt::format("expand: -1 is not allowed for a new leading dim in {}", shapeStr(shape)));
      ns[i] = want;
      nst[i] = 0;
      continue;
    }
    int64_t have = sizes()[i - off];
    if (want == -1) want = have;
    if (want < 0) throw ValueError(fmt::format("expand: invalid size {} in target shape {}", want, shapeStr(shape)));
    if (want != have && have != 1)
      throw ValueError(fmt::format("expand: shape {} cannot be expanded to {} (dim {}: {} vs {})", shapeStr(sizes()),
                                   shapeStr(shape), i, have, want));
    ns[i] = want;
    nst[i] = have == want ? strides()[i - off] : 0;
  }
  Tensor out = makeView(*this, ns, nst, storageOffset());
  Shape orig = sizes();
  autograd::record("expand", {*this}, {out}, {},
                   [orig](Ctx&, const GradList& g) -> GradList { return {sumToShape(g[0], orig)}; });
  return out;
}

Tensor Tensor::squeeze() const {
  requireDefined("squeeze");
  Shape ns;
  for (int64_t s : sizes())
    if (s != 1) ns.push_back(s);
  return ns.size() == sizes().size() ? *this : view(ns);
}

Tensor Tensor::squeeze(int64_t d) const {
  requireDefined("squeeze");
  if (dim() == 0) return *this;
  d = wrapDim(d, dim(), "squeeze");
  if (sizes()[d] != 1) return *this;
  Shape ns = sizes(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  Tensor out = makeView(*this, ns, nst, storageOffset());
  Shape orig = sizes();
  autograd::record("squeeze", {*this}, {out}, {},
                   [orig](Ctx&, const GradList& g) -> GradList { return {g[0].reshape(orig)}; });
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  requireDefined("unsqueeze");
  d = wrapDim(d, dim() + 1, "unsqueeze");
  Shape ns = sizes(), nst = strides();
  int64_t st = d < dim() ? strides()[d] * sizes()[d] : 1;
  ns.insert(ns.begin() + d, 1);
  nst.insert(nst.begin() + d, st);
  Tensor out = makeView(*this, ns, nst, storageOffset());
  Shape orig = sizes();
  autograd::record("unsqueeze", {*this}, {out}, {},
                   [orig](Ctx&, const GradList& g) -> GradList { return {g[0].reshape(orig)}; });
  return out;
}

Tensor Tensor::flatten(int64_t startDim, int64_t endDim) const {
  requireDefined("flatten");
  if (dim() == 0) return reshape({1});
  startDim = wrapDim(startDim, dim(), "flatten");
  endDim = wrapDim(endDim, dim(), "flatten");
  if (startDim > endDim)
    throw ValueError(fmt::format("flatten: start dim {} comes after end dim {}", startDim, endDim));
  Shape ns;
  for (int64_t i = 0; i < startDim; ++i) ns.push_back(sizes()[i]);
  int64_t m = 1;
  for (int64_t i = startDim; i <= endDim; ++i) m *= sizes()[i];
  ns.push_back(m);
  for (int64_t i = endDim + 1; i < dim(); ++i) ns.push_back(sizes()[i]);
  return reshape(ns);
}

namespace {

// Consecutive views of `self` along dim `d` with these lengths (summing to its size), recorded as
// one autograd node: its backward concatenates the parts' gradients (zeros for a part that got
// none), one copy of the input's size. A view per part with a backward of its own would instead
// fill a zero tensor of the whole input for every part and add them up (for a transformer's
// q, k, v split: three fills, three copies and two additions of the whole projection).
std::vector<Tensor> splitViews(const Tensor& self, int64_t d, const Shape& lengths) {
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t len : lengths) {
    Shape ns = self.sizes();
    ns[d] = len;
    out.push_back(makeView(self, ns, self.strides(), self.storageOffset() + start * self.strides()[d]));
    start += len;
  }
  autograd::record("split", {self}, out, {}, [d](Ctx&, const GradList& g) -> GradList { return {cat(g, d)}; });
  return out;
}

}  // namespace

std::vector<Tensor> Tensor::split(int64_t splitSize, int64_t d) const {
  requireDefined("split");
  if (dim() == 0) throw ValueError("split: cannot split a 0-dimensional tensor");
  d = wrapDim(d, dim(), "split");
  if (splitSize <= 0) throw ValueError(fmt::format("split: split size must be positive, got {}", splitSize));
  const int64_t len = sizes()[d];
  Shape lengths;
  for (int64_t s = 0; s < len; s += splitSize) lengths.push_back(std::min(splitSize, len - s));
  if (lengths.empty()) lengths.push_back(0);
  return splitViews(*this, d, lengths);
}

std::vector<Tensor> Tensor::split(const Shape& parts, int64_t d) const {
  requireDefined("split");
  if (dim() == 0) throw ValueError("split: cannot split a 0-dimensional tensor");
  d = wrapDim(d, dim(), "split");
  int64_t total = 0;
  for (int64_t p : parts) {
    if (p < 0) throw ValueError(fmt::format("split: negative section size in {}", shapeStr(parts)));
    total += p;
  }
  if (total != sizes()[d])
    throw ValueError(
        fmt::format("split: sections {} sum to {}, but dim {} has size {}", shapeStr(parts), total, d, sizes()[d]));
  return splitViews(*this, d, parts);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  requireDefined("chunk");
  if (chunks <= 0) throw ValueError(fmt::format("chunk: number of chunks must be positive, got {}", chunks));
  if (dim() == 0) throw ValueError("chunk: cannot chunk a 0-dimensional tensor");
  d = wrapDim(d, dim(), "chunk");
  int64_t len = sizes()[d];
  int64_t each = (len + chunks - 1) / chunks;
  return split(std::max<int64_t>(each, 1), d);
}

Tensor Tensor::asStrided(const Shape& sz, const Shape& st, int64_t offset) const {
  requireDefined("asStrided");
  if (sz.size() != st.size())
    throw ValueError(fmt::format("asStrided: sizes {} and strides {} differ in length", shapeStr(sz), shapeStr(st)));
  for (int64_t s : sz)
    if (s < 0) throw ValueError(fmt::format("asStrided: negative size in {}", shapeStr(sz)));
  return makeView(*this, sz, st, offset);
}

// ---- copies ------------------------------------------------------------------------------------

namespace {

// The CPU's "copy_" kernel: out = src converted to out's dtype, src broadcast to out's shape.
void copyCpu(Tensor& out, const Tensor& from) {
  // Fast path: same dtype, both contiguous, same shape.
  const bool flat = from.isContiguous() && out.isContiguous() && from.sizes() == out.sizes();
  if (from.dtype() == out.dtype() && flat) {
    if (out.numel() > 0 && out.dataPtr() != from.dataPtr()) std::memcpy(out.dataPtr(), from.dataPtr(), out.nbytes());
  } else if (flat && from.dtype() == DType::Float32 && out.dtype() == DType::Float16) {
    // Vectorized float <-> half (F16C) and float <-> bfloat16, bit-identical to the per-element
    // conversion below.
    floatToHalfN(from.data<float>(), out.data<Half>(), out.numel());
  } else if (flat && from.dtype() == DType::Float16 && out.dtype() == DType::Float32) {
    halfToFloatN(from.data<Half>(), out.data<float>(), out.numel());
  } else if (flat && from.dtype() == DType::Float32 && out.dtype() == DType::BFloat16) {
    detail::simd::roundToBFloat16(from.data<float>(), out.data<BFloat16>(), out.numel());
  } else if (flat && from.dtype() == DType::BFloat16 && out.dtype() == DType::Float32) {
    detail::simd::widenBFloat16(from.data<BFloat16>(), out.data<float>(), out.numel());
  } else if (from.dtype() == out.dtype() && (out.elementSize() == 2 || out.elementSize() == 4)) {
    // Same dtype, strided: the elements' bits move as they are (a bfloat16 is not widened to
    // float and rounded back, which also keeps every NaN's payload, as memcpy does).
    auto bits = [](auto v) { return v; };
    if (out.elementSize() == 2) detail::mapKernel<uint16_t, uint16_t, 1>(out, {from}, bits);
    else detail::mapKernel<uint32_t, uint32_t, 1>(out, {from}, bits);
  } else {
    COHORT_DISPATCH(out.dtype(), "copy_", [&]<typename D>() {
      COHORT_DISPATCH(from.dtype(), "copy_", [&]<typename S>() {
        detail::mapKernel<D, S, 1>(out, {from}, [](Acc<S> v) {
          if constexpr (std::is_same_v<D, bool>) return v != Acc<S>(0);
          else return static_cast<Acc<D>>(v);
        });
      });
    });
  }
}

// The CPU's "fill_" kernel: every element of out (any strides) = v in out's dtype.
void fillCpu(Tensor& out, Scalar v) {
  COHORT_DISPATCH(out.dtype(), "fill_", [&]<typename T>() {
    T value = static_cast<T>(v.to<Acc<T>>());
    if (out.numel() == 0) return;
    std::array<char*, 1> p{static_cast<char*>(out.dataPtr())};
    std::array<Shape, 1> st{detail::broadcastByteStrides(out, out.sizes())};
    detail::forEachStrided<1>(out.sizes(), p, st,
                              [&](std::array<char*, 1> q, const std::array<int64_t, 1>& s, int64_t n) {
                                if (s[0] == sizeof(T)) {
                                  T* o = reinterpret_cast<T*>(q[0]);
                                  for (int64_t i = 0; i < n; ++i) o[i] = value;
                                } else {
                                  for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(q[0] + i * s[0]) = value;
                                }
                              });
  });
}

const dispatch::Register<dispatch::CopyKernel> kCopyCpu{"copy_", DeviceType::CPU, &copyCpu};
const dispatch::Register<dispatch::FillKernel> kFillCpu{"fill_", DeviceType::CPU, &fillCpu};

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  COHORT_RECORD_OP("copy_", *this, src);
  requireDefined("copy_");
  src.requireDefined("copy_ (source)");
  broadcastShapes(src.sizes(), sizes(), "copy_");
  if (broadcastShapes(src.sizes(), sizes(), "copy_") != sizes())
    throw ValueError(fmt::format("copy_: source of shape {} does not broadcast to destination shape {}",
                                 shapeStr(src.sizes()), shapeStr(sizes())));
  {
    autograd::NoGradGuard ng;
    // From another device: the source, made contiguous on its own device, moves whole (the
    // runtime's copy), then converts and broadcasts on this one.
    Tensor from = src;
    if (src.device() != device()) from = src.detach().contiguous().to(device());
    dispatch::kernel<dispatch::CopyKernel>("copy_", device())(*this, from);
  }
  Shape srcShape = src.sizes();
  DType srcType = src.dtype();
  Device srcDevice = src.device();
  autograd::recordInplace("copy_", *this, {src}, {},
                          [srcShape, srcType, srcDevice](Ctx&, const GradList& g) -> GradList {
                            // The source's gradient lives on the source's device.
                            return {Tensor(), g[0].device() == srcDevice ? g[0] : g[0].to(srcDevice)};
                          });
  return *this;
}

Tensor& Tensor::fill_(Scalar v) {
  COHORT_RECORD_OP("fill_", *this, v);
  requireDefined("fill_");
  autograd::checkInplace("fill_", *this);
  dispatch::kernel<dispatch::FillKernel>("fill_", device())(*this, v);
  autograd::recordInplace("fill_", *this, {}, {}, [](Ctx&, const GradList&) -> GradList { return {Tensor()}; });
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0); }

Tensor Tensor::contiguous() const {
  requireDefined("contiguous");
  if (isContiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  COHORT_RECORD_OP("clone", *this);
  requireDefined("clone");
  Tensor out = empty(sizes(), {.dtype = dtype(), .device = device()});
  {
    autograd::NoGradGuard ng;
    out.copy_(*this);
  }
  autograd::record("clone", {*this}, {out}, {}, [](Ctx&, const GradList& g) -> GradList { return {g[0]}; });
  return out;
}

Tensor Tensor::to(DType dt) const {
  COHORT_RECORD_OP("to", *this, dt);
  requireDefined("to");
  if (dt == dtype()) return *this;
  Tensor out = empty(sizes(), {.dtype = dt, .device = device()});
  {
    autograd::NoGradGuard ng;
    out.copy_(*this);
  }
  if (isFloating(dt)) {
    DType from = dtype();
    autograd::record("to", {*this}, {out}, {}, [from](Ctx&, const GradList& g) -> GradList { return {g[0].to(from)}; });
  }
  return out;
}

Tensor Tensor::to(Device d) const {
  COHORT_RECORD_OP("to", *this, d);
  requireDefined("to");
  if (d == device()) return *this;
  Tensor src = detach().contiguous();                            // on a device, copy_'s kernel gathers it
  Tensor out = empty(sizes(), {.dtype = dtype(), .device = d});  // throws the clear "no CUDA" errors
  DeviceType rtType = d.isCpu() ? device().type() : d.type();
  DeviceRuntime* rt = deviceRuntime(rtType);
  COHORT_CHECK(rt != nullptr, "to: no runtime for {}", d);
  if (numel() > 0) {
    const char* from = static_cast<const char*>(src.storage()->data()) + src.storageOffset() * elementSize();
    char* into = static_cast<char*>(out.storage()->data());
    rt->copy(into, d, from, device(), nbytes());
  }
  Device from = device();
  autograd::record("to", {*this}, {out}, {}, [from](Ctx&, const GradList& g) -> GradList { return {g[0].to(from)}; });
  return out;
}

// ---- joining -----------------------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t d) {
  COHORT_RECORD_OP("cat", tensors, d);
  COHORT_AUTOCAST("cat", cat, tensors, d);
  if (tensors.empty()) throw ValueError("cat: expects a non-empty list of tensors");
  const Tensor& ref = tensors[0];
  for (const Tensor& t : tensors) {
    if (!t.defined()) throw ValueError("cat: a tensor in the list is undefined");
  }
  int64_t nd = ref.dim();
  if (nd == 0) throw ValueError("cat: zero-dimensional tensors cannot be concatenated; use stack");
  d = wrapDim(d, nd, "cat");
  DType dt = ref.dtype();
  for (const Tensor& t : tensors) dt = promoteTypes(dt, t.dtype());
  Shape out = ref.sizes();
  out[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.dim() != nd)
      throw ValueError(fmt::format("cat: tensor {} has {} dims (shape {}), tensor 0 has {} (shape {})", i, t.dim(),
                                   shapeStr(t.sizes()), nd, shapeStr(ref.sizes())));
    for (int64_t k = 0; k < nd; ++k)
      if (k != d && t.sizes()[k] != ref.sizes()[k])
        throw ValueError(fmt::format("cat: sizes must match except in dim {}; tensor {} has shape {}, tensor 0 has {}",
                                     d, i, shapeStr(t.sizes()), shapeStr(ref.sizes())));
    out[d] += t.sizes()[d];
  }
  Tensor result = empty(out, {.dtype = dt, .device = ref.device()});
  Shape lengths;
  {
    autograd::NoGradGuard ng;
    int64_t pos = 0;
    for (const Tensor& t : tensors) {
      int64_t len = t.sizes()[d];
      if (len > 0) result.narrow(d, pos, len).copy_(t);
      lengths.push_back(len);
      pos += len;
    }
  }
  autograd::record("cat", tensors, {result}, {},
                   [lengths, d](Ctx&, const GradList& g) -> GradList { return g[0].split(lengths, d); });
  return result;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t d) {
  COHORT_RECORD_OP("stack", tensors, d);
  COHORT_AUTOCAST("stack", stack, tensors, d);
  if (tensors.empty()) throw ValueError("stack: expects a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) throw ValueError("stack: a tensor in the list is undefined");
    if (tensors[i].sizes() != tensors[0].sizes())
      throw ValueError(fmt::format("stack: all tensors must have the same shape; tensor {} has {}, tensor 0 has {}", i,
                                   shapeStr(tensors[i].sizes()), shapeStr(tensors[0].sizes())));
  }
  d = wrapDim(d, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(d));
  return cat(parts, d);
}

}  // namespace cohort
