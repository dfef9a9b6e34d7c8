/*
 * Op dispatch by device. Every op reaches its kernel here: kernels register themselves under the
 * op's name, a kernel signature and a device type (the CPU kernels next to their ops in
 * core/ops/, the CUDA kernels in core/cuda/), and an op looks up the kernel for its tensors' device
 * and calls it. A device build adds kernels without touching the op's code, and core code never
 * tests for a device backend with #if. An op with no kernel for a device is a NotSupportedError
 * naming the op and the device.
 *
 * Some ops have a composite path: on a device without a kernel of their own (conv2d and pooling,
 * attention, linear's fused bias, mseLoss, ...), dispatch::find answers null and the op is built
 * from other ops.
 *
 * Kernel signatures shared by whole families of ops (elementwise, reductions) are below; an op with
 * its own shape of arguments declares its signature next to its code. Lookups key on the op name
 * and the signature type, so a kernel registered with the wrong signature is never called.
 *
 * A lookup takes no lock and allocates nothing (a hash of the name and a probe of a table that
 * only grows): ops on small CPU tensors pay a few nanoseconds for it.
 */
#pragma once

#include <string>
#include <string_view>
#include <typeindex>
#include <vector>

#include <cohort/core/tensor/device.h>
#include <cohort/core/tensor/scalar.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::dispatch {

// Elementwise families: `out` is allocated by the op (result dtype and broadcast shape), inputs
// are already converted to out's dtype and may be broadcast views or non-contiguous. `out` may be
// the first input (the in-place updates).
using UnaryKernel = void(Tensor& out, const Tensor& a);
using BinaryKernel = void(Tensor& out, const Tensor& a, const Tensor& b);
using BinaryScalarKernel = void(Tensor& out, const Tensor& a, const Tensor& b, Scalar s);
using ScalarKernel = void(Tensor& out, const Tensor& a, Scalar s);
// Matrix products (core/ops/linalg.cc): c = alpha * a @ b + beta * c for 2-D a [m,k], b [k,n] and a
// contiguous c [m,n] of one floating dtype ("matmul"); a batch of them, c = a @ b, for 3-D ("bmm").
using GemmKernel = void(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta);
using BatchedGemmKernel = void(const Tensor& a, const Tensor& b, Tensor& c);

// A small integer naming a kernel signature, the same in every shared object of the process.
int signatureId(const std::type_info& signature);
template <typename Fn>
int signatureIdOf() {
  static const int kId = signatureId(typeid(Fn));
  return kId;
}

void registerRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn);
void* findRaw(int signature, std::string_view op, DeviceType device);
// The ops with a kernel of any signature for `device`, sorted (for error messages and tests).
std::vector<std::string> opsWithKernels(DeviceType device);

// The kernel of `op` for `device`, or null.
template <typename Fn>
Fn* find(std::string_view op, Device device) {
  return reinterpret_cast<Fn*>(findRaw(signatureIdOf<Fn>(), op, device.type()));
}

[[noreturn]] void throwNoKernel(std::string_view op, Device device);

// The kernel of `op` for `device`; NotSupportedError naming both when there is none.
template <typename Fn>
Fn* kernel(std::string_view op, Device device) {
  Fn* fn = find<Fn>(op, device);
  if (fn == nullptr) throwNoKernel(op, device);
  return fn;
}

// Sets the kernel of `op` for `device` to `fn` (null removes it) and returns the one it replaces
// (null if none): a user's own kernel in place of a built-in one, or a test's wrapper that counts
// calls. Calls already looking the kernel up may still run the previous one.
void* replaceRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn);
template <typename Fn>
Fn* replace(std::string_view op, DeviceType device, Fn* fn) {
  return reinterpret_cast<Fn*>(replaceRaw(std::type_index(typeid(Fn)), op, device, reinterpret_cast<void*>(fn)));
}

// Registers at load time: `const dispatch::Register<dispatch::UnaryKernel> r{"exp", DeviceType::CUDA, &expCuda};`
template <typename Fn>
struct Register {
  Register(const char* op, DeviceType device, Fn* fn) {
    registerRaw(std::type_index(typeid(Fn)), op, device, reinterpret_cast<void*>(fn));
  }
};

}  // namespace cohort::dispatch
