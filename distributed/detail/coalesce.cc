#include <cohort/distributed/detail/coalesce.h>

#include <cstring>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>

namespace cohort::dist::detail {
namespace {

bool flatCopyable(const Tensor& t) { return t.device().isCpu() && t.isContiguous(); }

void requireContiguous(const Tensor& t, size_t i, std::string_view what) {
  if (t.numel() > 0 && !flatCopyable(t)) {
    throw ValueError(fmt::format("{}: tensor {} must be a contiguous CPU tensor to be packed, got shape {} with "
                                 "strides {} on {}",
                                 what, i, shapeStr(t.sizes()), shapeStr(t.strides()), t.device()));
  }
}

void checkFlat(const Tensor& flat, const FlatLayout& layout) {
  if (flat.numel() != layout.total || flat.dtype() != layout.dtype) {
    throw ValueError(fmt::format("coalesce: the flat buffer is {} {}, but the layout needs {} elements of {}",
                                 dtypeName(flat.dtype()), shapeStr(flat.sizes()), layout.total,
                                 dtypeName(layout.dtype)));
  }
}

void checkCount(const std::vector<Tensor>& tensors, const FlatLayout& layout) {
  if (tensors.size() != layout.size()) {
    throw ValueError(fmt::format("coalesce: {} tensors for a layout of {} entries", tensors.size(), layout.size()));
  }
}

}  // namespace

FlatLayout FlatLayout::of(const std::vector<Tensor>& tensors, std::string_view what) {
  if (tensors.empty()) throw ValueError(fmt::format("{}: no tensors to coalesce", what));
  FlatLayout l;
  l.shapes.reserve(tensors.size());
  l.offsets.reserve(tensors.size());
  l.numels.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) throw ValueError(fmt::format("{}: tensor {} is undefined", what, i));
    if (i == 0) {
      l.dtype = t.dtype();
      l.device = t.device();
    } else if (t.dtype() != l.dtype) {
      throw ValueError(fmt::format("{}: tensor {} has dtype {}, but tensor 0 has dtype {}", what, i,
                                   dtypeName(t.dtype()), dtypeName(l.dtype)));
    } else if (t.device() != l.device) {
      throw ValueError(fmt::format("{}: tensor {} is on {}, but tensor 0 is on {}", what, i, t.device(), l.device));
    }
    l.shapes.push_back(t.sizes());
    l.offsets.push_back(l.total);
    l.numels.push_back(t.numel());
    l.total += t.numel();
  }
  return l;
}

FlatLayout FlatLayout::ofShapes(const std::vector<Shape>& shapes, DType dtype) {
  FlatLayout l;
  l.dtype = dtype;
  l.shapes = shapes;
  l.offsets.reserve(shapes.size());
  l.numels.reserve(shapes.size());
  for (const Shape& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    l.offsets.push_back(l.total);
    l.numels.push_back(n);
    l.total += n;
  }
  return l;
}

int64_t packedNumel(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

size_t packedBytes(const std::vector<Tensor>& tensors) {
  size_t n = 0;
  for (const Tensor& t : tensors) n += t.nbytes();
  return n;
}

Tensor pack(const std::vector<Tensor>& tensors, const FlatLayout& layout) {
  checkCount(tensors, layout);
  Tensor flat = empty({layout.total}, TensorOptions{.dtype = layout.dtype, .device = layout.device});
  const size_t es = elementSize(layout.dtype);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (layout.numels[i] == 0) continue;  // no room taken, and maybe no data pointer
    if (flatCopyable(t)) {
      std::memcpy(static_cast<char*>(flat.dataPtr()) + layout.offsets[i] * es, t.dataPtr(), t.nbytes());
    } else {
      flat.narrow(0, layout.offsets[i], layout.numels[i]).view(layout.shapes[i]).copy_(t);
    }
  }
  return flat;
}

void unpack(const Tensor& flat, const std::vector<Tensor>& tensors, const FlatLayout& layout) {
  checkFlat(flat, layout);
  checkCount(tensors, layout);
  const size_t es = elementSize(layout.dtype);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (layout.numels[i] == 0) continue;
    if (flatCopyable(t) && flatCopyable(flat)) {
      std::memcpy(t.dataPtr(), static_cast<const char*>(flat.dataPtr()) + layout.offsets[i] * es, t.nbytes());
    } else {
      Tensor dst = t;
      dst.copy_(flat.narrow(0, layout.offsets[i], layout.numels[i]).view(layout.shapes[i]));
    }
  }
}

void packBytes(const std::vector<Tensor>& tensors, void* dst, std::string_view what) {
  auto* out = static_cast<char*>(dst);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const size_t n = t.nbytes();
    if (n == 0) continue;
    requireContiguous(t, i, what);
    std::memcpy(out, t.dataPtr(), n);
    out += n;
  }
}

void unpackBytes(const void* src, const std::vector<Tensor>& tensors, std::string_view what) {
  const auto* in = static_cast<const char*>(src);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const size_t n = t.nbytes();
    if (n == 0) continue;
    requireContiguous(t, i, what);
    std::memcpy(t.dataPtr(), in, n);
    in += n;
  }
}

std::vector<Tensor> views(const Tensor& flat, const FlatLayout& layout) {
  checkFlat(flat, layout);
  std::vector<Tensor> out;
  out.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i)
    out.push_back(flat.narrow(0, layout.offsets[i], layout.numels[i]).view(layout.shapes[i]));
  return out;
}

}  // namespace cohort::dist::detail
