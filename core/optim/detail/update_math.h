/*
 * The per-element arithmetic of the fused SGD and Adam/AdamW steps, shared by the CPU loops
 * (sgd.cc, adam.cc) and the CUDA kernels (core/cuda/optim.cu), so both round the same values in
 * the same order and give bit-identical parameters and state. Plain C++ with no cohort headers:
 * nvcc compiles it for the device (constexpr functions are callable there with
 * --expt-relaxed-constexpr).
 *
 * A is the compute type (float for float16/bfloat16 parameters). M supplies IEEE operations,
 * each correctly rounded: fma(a, b, c) = a * b + c rounded once, mul, div, add, sqrt. Every
 * product that meets a sum goes through M::fma. Compilers contract a separate multiply and add
 * into an FMA whenever they like (GCC does with FMA hardware, i.e. x86-64-v3; nvcc always), and
 * which ones they pick cannot be reproduced on another device; written this way there is nothing
 * left to contract, so every compiler computes exactly these roundings.
 */
#pragma once

#include <cmath>
#include <cstdint>

namespace cohort::optim::detail {

// SGD's options for one step of one parameter group (see sgd.h).
struct SgdScalars {
  double lr = 0, momentum = 0, dampening = 0, weightDecay = 0;
  bool nesterov = false, maximize = false;
  bool firstStep = false;  // the momentum buffer starts as the first direction
};

// Adam's per-step scalars (see adam.h), bias corrections computed in double.
struct AdamScalars {
  double decay = 1;  // AdamW: 1 - lr * weight_decay
  double wd = 0;     // Adam: coupled weight decay
  double beta1 = 0, oneMinusBeta1 = 1, beta2 = 0, oneMinusBeta2 = 1;
  double bc2Sqrt = 1;  // sqrt(1 - beta2^step)
  double eps = 0;
  double negStepSize = 0;  // -lr / (1 - beta1^step)
  bool decoupled = false;  // AdamW
  bool amsgrad = false;
  bool maximize = false;
};

// The CPU's M.
struct HostMath {
  static float fma(float a, float b, float c) { return std::fma(a, b, c); }
  static double fma(double a, double b, double c) { return std::fma(a, b, c); }
  template <typename A>
  static A mul(A a, A b) {
    return a * b;
  }
  template <typename A>
  static A div(A a, A b) {
    return a / b;
  }
  template <typename A>
  static A add(A a, A b) {
    return a + b;
  }
  static float sqrt(float a) { return std::sqrt(a); }
  static double sqrt(double a) { return std::sqrt(a); }
};

// ---- SGD: d = sign * g + wd * p; buf = momentum * buf + (1 - dampening) * d (d on the first
// step); update = nesterov ? d + momentum * buf : buf (d without momentum); p += -lr * update.

template <typename M, typename A>
constexpr A sgdDirection(A g, A p, A sign, A wd) {
  return M::fma(wd, p, M::mul(sign, g));
}
template <typename M, typename A>
constexpr A sgdBuffer(A buf, A d, A momentum, A oneMinusDampening) {
  return M::fma(buf, momentum, M::mul(oneMinusDampening, d));
}
template <typename M, typename A>
constexpr A sgdNesterov(A d, A buf, A momentum) {
  return M::fma(momentum, buf, d);
}
template <typename M, typename A>
constexpr A sgdApply(A p, A negLr, A update) {
  return M::fma(negLr, update, p);
}

// ---- Adam: g = sign * grad (+ wd * p for Adam); m = beta1 * m + (1 - beta1) * g;
// v = beta2 * v + (1 - beta2) * g * g; denom = sqrt(v or vmax) / sqrt(bc2) + eps;
// p = p * decay (AdamW) + (-step * m) / denom.

template <typename M, typename A>
constexpr A adamGrad(A g, A p, A sign, A wd, bool decoupled) {
  return decoupled ? M::mul(sign, g) : M::fma(wd, p, M::mul(sign, g));
}
template <typename M, typename A>
constexpr A adamExpAvg(A m, A g, A beta1, A oneMinusBeta1) {
  return M::fma(m, beta1, M::mul(oneMinusBeta1, g));
}
template <typename M, typename A>
constexpr A adamExpAvgSq(A v, A g, A beta2, A oneMinusBeta2) {
  return M::fma(v, beta2, M::mul(M::mul(oneMinusBeta2, g), g));
}
template <typename A>
constexpr A adamMax(A vmax, A v) {
  return vmax > v ? vmax : v;
}
template <typename M, typename A>
constexpr A adamDenom(A v, A bc2Sqrt, A eps) {
  return M::add(M::div(M::sqrt(v), bc2Sqrt), eps);
}
template <typename M, typename A>
constexpr A adamApply(A p, A m, A denom, A negStepSize, A decay, bool decoupled) {
  const A update = M::div(M::mul(negStepSize, m), denom);
  return decoupled ? M::fma(p, decay, update) : M::add(p, update);
}

}  // namespace cohort::optim::detail
