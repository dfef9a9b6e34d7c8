/*
 * Coalescing: many tensors laid end to end in one flat buffer, so that a collective runs once over
 * all of them (the backends' coalesced all-reduce and all-gather, DDP's buckets and parameter
 * broadcast, PowerSGD's packed factors).
 *
 * FlatLayout is the bookkeeping: each tensor's shape, element offset and element count in the flat
 * buffer, the total, the one dtype and device. Building it from tensors checks them and throws a
 * ValueError naming the first tensor (by index) whose dtype or device differs from tensor 0's.
 *
 * Three ways to use a layout:
 *  - pack / unpack copy tensors into a new flat tensor and back (any strides);
 *  - packBytes / unpackBytes copy contiguous tensors into or out of raw memory the caller owns (a
 *    scratch vector, shared memory, an MPI buffer), `nbytes()` of it;
 *  - views returns tensors shaped like the layout's entries that alias an existing flat buffer
 *    (DDP's bucket): writing a view writes the buffer, nothing is copied.
 * Zero-element tensors take no room and are never dereferenced (they may have no data pointer).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <cohort/core/tensor/device.h>
#include <cohort/core/tensor/dtype.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::dist::detail {

struct FlatLayout {
  DType dtype{DType::Float32};
  Device device{Device::cpu()};
  std::vector<Shape> shapes{};     // entry i's shape
  std::vector<int64_t> offsets{};  // entry i's first element in the flat buffer
  std::vector<int64_t> numels{};   // entry i's element count
  int64_t total{0};                // elements in the flat buffer

  size_t size() const { return shapes.size(); }
  size_t nbytes() const { return static_cast<size_t>(total) * elementSize(dtype); }

  // The layout of `tensors` (all defined, one dtype and device; at least one). `what` names the
  // caller in errors: "<what>: tensor 3 has dtype int64, but tensor 0 has dtype float32".
  static FlatLayout of(const std::vector<Tensor>& tensors, std::string_view what);
  // The layout of entries with these shapes, in dtype on the CPU.
  static FlatLayout ofShapes(const std::vector<Shape>& shapes, DType dtype);
};

// The elements and bytes of `tensors` laid end to end.
int64_t packedNumel(const std::vector<Tensor>& tensors);
size_t packedBytes(const std::vector<Tensor>& tensors);

// A new flat tensor (on layout.device) of layout.total elements holding `tensors` end to end.
Tensor pack(const std::vector<Tensor>& tensors, const FlatLayout& layout);
// Copies `flat` (layout.total elements) back into `tensors`.
void unpack(const Tensor& flat, const std::vector<Tensor>& tensors, const FlatLayout& layout);

// Copies contiguous CPU `tensors` end to end into `dst` (their total bytes), and back from `src`.
// A non-contiguous tensor is a ValueError naming its index and `what`.
void packBytes(const std::vector<Tensor>& tensors, void* dst, std::string_view what);
void unpackBytes(const void* src, const std::vector<Tensor>& tensors, std::string_view what);

// Tensors shaped like layout's entries that alias `flat` (contiguous, layout.total elements of
// layout.dtype): entry i is flat[offsets[i], offsets[i] + numels[i]) viewed as shapes[i].
std::vector<Tensor> views(const Tensor& flat, const FlatLayout& layout);

}  // namespace cohort::dist::detail
