/*
 * SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay: exactly
 * torch.optim.SGD's algorithm (1.13):
 *   g = grad + weight_decay * p
 *   buf = g on the first step, else momentum * buf + (1 - dampening) * g
 *   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
 *   p -= lr * g
 * The update is one fused pass per parameter (contiguous; float16/bfloat16 compute in float and
 * round once on store). State: "momentum_buffer" (only when momentum != 0).
 */
#pragma once

#include <cohort/core/optim/optimizer.h>

namespace cohort::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  GroupOptions toMap() const;
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  explicit SGD(std::vector<ParamGroup> groups, SGDOptions defaults = {});

 protected:
  void checkOptions(const GroupOptions& options) const override;
  void stepGroup(ParamGroup& group) override;
};

}  // namespace cohort::optim
