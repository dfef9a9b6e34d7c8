/*
 * Adam and AdamW, exactly torch.optim.Adam / AdamW (1.13, single-tensor path) in their math:
 *   step += 1
 *   AdamW: p *= 1 - lr * weight_decay          Adam: g = grad + weight_decay * p
 *   m = beta1 * m + (1 - beta1) * g
 *   v = beta2 * v + (1 - beta2) * g * g
 *   amsgrad: vmax = max(vmax, v), used for v below
 *   denom = sqrt(v) / sqrt(1 - beta2^step) + eps
 *   p -= lr / (1 - beta1^step) * m / denom
 * with the bias corrections computed in double and each tensor-scalar product in the parameter's
 * compute type, in torch's order. One fused pass per parameter, no allocation after the first
 * step (float16/bfloat16 compute in float and round once on store, which is slightly more exact
 * than torch's per-op rounding in those types).
 * State: "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad) and the step count.
 * Option names: lr, beta1, beta2, eps, weight_decay, amsgrad, maximize.
 */
#pragma once

#include <cohort/core/optim/optimizer.h>

namespace cohort::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;  // AdamW's default is 1e-2 (see AdamWOptions)
  bool amsgrad = false;
  bool maximize = false;
  GroupOptions toMap() const;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  GroupOptions toMap() const;
};

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  explicit Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});

 protected:
  Adam(std::string type, GroupOptions defaults, bool decoupled)
      : Optimizer(std::move(type), std::move(defaults)), decoupled_(decoupled) {}
  void checkOptions(const GroupOptions& options) const override;
  void stepGroup(ParamGroup& group) override;

 private:
  bool decoupled_ = false;  // AdamW
};

// Adam with decoupled weight decay (Loshchilov & Hutter).
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace cohort::optim
