// What the pipeline tests share: a small model cut into stages, the batches it trains on, and
// one process training it whole (the reference every pipeline run must equal).
#pragma once

#include <utility>
#include <vector>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>

namespace cohort::pipeline::testing {

constexpr int64_t kWidth = 8, kOut = 3;
constexpr int kSteps = 10;
constexpr double kLr = 0.1;

// Stage k of an S-stage model: Linear + Tanh, the last one a Linear to kOut (same weights in
// every process: one generator, stages made in order).
inline std::vector<nn::ModulePtr> makeStages(int S) {
  Generator g(1234);
  std::vector<nn::ModulePtr> out;
  for (int k = 0; k < S; ++k) {
    if (k + 1 < S) out.push_back(std::make_shared<nn::Sequential>(nn::Linear(kWidth, kWidth, true, &g), nn::Tanh()));
    else out.push_back(std::make_shared<nn::Linear>(kWidth, kOut, true, &g));
  }
  return out;
}

// Step k's batch: its size changes every step and is not a multiple of m.
// `replicas` x that many rows when several pipeline replicas share the batch.
inline std::pair<Tensor, Tensor> batch(int k, int m, int replicas = 1) {
  Generator g(100 + static_cast<uint64_t>(k));
  const int64_t n = (2 * m + 1 + k % 3) * replicas;
  return {randn({n, kWidth}, {}, &g), randn({n, kOut}, {}, &g)};
}

inline Tensor mse(const Tensor& out, const Tensor& target) { return nn::functional::mseLoss(out, target); }

struct Reference {
  std::vector<double> losses;
  std::vector<std::vector<Tensor>> params;  // per stage
};

// With `accumulate` > 1 the optimizer steps after every `accumulate` steps' gradients.
inline Reference oneProcess(int S, int m, int replicas = 1, int accumulate = 1) {
  auto stages = makeStages(S);
  std::vector<Tensor> params;
  for (auto& s : stages)
    for (auto& p : s->parameters()) params.push_back(p);
  optim::SGD opt(params, {.lr = kLr});
  Reference ref;
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, m, replicas);
    if (k % accumulate == 0) opt.zeroGrad();
    Tensor h = x;
    for (auto& s : stages) h = (*s)(h);
    Tensor loss = mse(h, y);
    loss.backward();
    ref.losses.push_back(loss.itemDouble());
    if ((k + 1) % accumulate == 0) opt.step();
  }
  for (auto& s : stages) ref.params.push_back(s->parameters());
  return ref;
}

}  // namespace cohort::pipeline::testing
