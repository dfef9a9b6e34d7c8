// What the autograd tests share: comparing one backward's gradients against another's, and a
// gradient store.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::autograd::testing {

// Both undefined, or the same shape and equal within tol (relative above 1).
inline void expectSameGrad(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-6) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  std::vector<double> g = got.to(DType::Float64).contiguous().toVector<double>();
  std::vector<double> w = want.to(DType::Float64).contiguous().toVector<double>();
  for (size_t i = 0; i < w.size(); ++i)
    ASSERT_LE(std::abs(g[i] - w[i]), tol * std::max(1.0, std::abs(w[i]))) << what << " element " << i;
}

inline std::vector<Tensor> gradsOf(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
  return out;
}
inline void clearGrads(const std::vector<Tensor>& ts) {
  for (Tensor t : ts) t.setGrad(Tensor());
}

// A GradStore that keeps each leaf's gradient in a map (a distributed autograd context's, in
// miniature).
struct MapStore final : GradStore {
  std::map<const TensorImpl*, std::pair<std::shared_ptr<TensorImpl>, Tensor>> grads;
  Tensor get(const TensorImpl& leaf) const override {
    auto it = grads.find(&leaf);
    return it == grads.end() ? Tensor() : it->second.second;
  }
  void set(const std::shared_ptr<TensorImpl>& leaf, Tensor g) override { grads[leaf.get()] = {leaf, g}; }
};

}  // namespace cohort::autograd::testing
