/*
 * Op dispatch by device. Kernels for devices other than the CPU register themselves here under the
 * op's name and a kernel signature; an op whose tensors live on such a device looks its kernel up
 * and calls it. A device build (CUDA) adds kernels without touching the op's code, and core code
 * never tests for a device backend with #if. An op with no kernel for a device is a
 * NotSupportedError naming the op and the device.
 *
 * The CPU kernels are called directly by the op (they are templates over the element type and the
 * functor, inlined into the op); the table holds the other devices' kernels.
 *
 * Kernel signatures shared by whole families of ops (elementwise, reductions) are below; an op with
 * its own shape of arguments declares its signature next to its code. Lookups key on the op name
 * and the signature type, so a kernel registered with the wrong signature is never called.
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
// are already converted to out's dtype and may be broadcast views or non-contiguous.
using UnaryKernel = void(Tensor& out, const Tensor& a);
using BinaryKernel = void(Tensor& out, const Tensor& a, const Tensor& b);
using BinaryScalarKernel = void(Tensor& out, const Tensor& a, const Tensor& b, Scalar s);
using ScalarKernel = void(Tensor& out, const Tensor& a, Scalar s);
// Matrix products (core/ops/linalg.cc): c = alpha * a @ b + beta * c for 2-D a [m,k], b [k,n] and a
// contiguous c [m,n] of one floating dtype ("matmul"); a batch of them, c = a @ b, for 3-D ("bmm").
using GemmKernel = void(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta);
using BatchedGemmKernel = void(const Tensor& a, const Tensor& b, Tensor& c);

void registerRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn);
void* findRaw(std::type_index signature, std::string_view op, DeviceType device);
// The ops with a kernel of any signature for `device`, sorted (for error messages and tests).
std::vector<std::string> opsWithKernels(DeviceType device);

// The kernel of `op` for `device`, or null.
template <typename Fn>
Fn* find(std::string_view op, Device device) {
  return reinterpret_cast<Fn*>(findRaw(std::type_index(typeid(Fn)), op, device.type()));
}

[[noreturn]] void throwNoKernel(std::string_view op, Device device);

// The kernel of `op` for `device`; NotSupportedError naming both when there is none.
template <typename Fn>
Fn* kernel(std::string_view op, Device device) {
  Fn* fn = find<Fn>(op, device);
  if (fn == nullptr) throwNoKernel(op, device);
  return fn;
}

// Registers at load time: `const dispatch::Register<dispatch::UnaryKernel> r{"exp", DeviceType::CUDA, &expCuda};`
template <typename Fn>
struct Register {
  Register(const char* op, DeviceType device, Fn* fn) {
    registerRaw(std::type_index(typeid(Fn)), op, device, reinterpret_cast<void*>(fn));
  }
};

}  // namespace cohort::dispatch
