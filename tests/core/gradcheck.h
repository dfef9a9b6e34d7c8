/*
 * Finite-difference gradient checking for tests (float64). gradcheck(fn, inputs) compares the
 * analytic gradient of sum(fn(inputs) * w) (w a fixed random weight, so every output element
 * matters) with central differences, for every input that requires grad. Inputs may be
 * non-contiguous (transposed, sliced, expanded views): perturbations go through the view.
 */
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <cohort/cohort.h>

namespace cohort::testing {

inline ::testing::AssertionResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                            std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-5,
                                            double rtol = 1e-4) {
  Tensor out0;
  {
    autograd::NoGradGuard ng;
    out0 = fn(inputs);
  }
  Generator g(1234);
  Tensor w = randn(out0.sizes(), {.dtype = DType::Float64}, &g);
  auto scalarOf = [&](const std::vector<Tensor>& in) {
    autograd::NoGradGuard ng;
    Tensor o = fn(in);
    return (o.to(DType::Float64) * w).sum().item<double>();
  };
  for (auto& t : inputs)
    if (t.defined() && t.requiresGrad()) t.setGrad(Tensor());
  Tensor out = fn(inputs);
  (out.to(DType::Float64) * w).sum().backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.defined() || !x.requiresGrad()) continue;
    Tensor analytic = x.grad();
    if (!analytic.defined()) analytic = zerosLike(x);
    // Perturb through a contiguous flat copy, written back into x's own layout.
    std::vector<double> an = analytic.to(DType::Float64).toVector<double>();
    Tensor base = x.detach().clone();
    std::vector<double> vals = base.to(DType::Float64).toVector<double>();
    for (size_t k = 0; k < vals.size(); ++k) {
      auto eval = [&](double v) {
        std::vector<double> pert = vals;
        pert[k] = v;
        {
          autograd::NoGradGuard ng;
          x.detach().copy_(fromVector<double>(pert, x.sizes()));
        }
        double r = scalarOf(inputs);
        return r;
      };
      double num = (eval(vals[k] + eps) - eval(vals[k] - eps)) / (2 * eps);
      {
        autograd::NoGradGuard ng;
        x.detach().copy_(base);
      }
      if (std::abs(num - an[k]) > atol + rtol * std::abs(num))
        return ::testing::AssertionFailure()
               << "input " << i << " element " << k << ": analytic " << an[k] << " vs numeric " << num;
    }
  }
  return ::testing::AssertionSuccess();
}

// A float64 tensor of the given shape with values in [-1, 1) that requires grad.
inline Tensor randArg(const Shape& shape, uint64_t seed = 7) {
  Generator g(seed);
  Tensor t = rand(shape, {.dtype = DType::Float64}, &g) * 2.0 - 1.0;
  return t.detach().setRequiresGrad();
}

}  // namespace cohort::testing
