/*
 * Optimizer: the base of SGD, Adam and AdamW. It holds parameter groups, each with its own
 * hyper-parameters (a name -> number map, e.g. {"lr": 1e-3, "weight_decay": 0.1}: bools are 0/1),
 * and per-parameter state (momentum buffers, Adam moments, step counts) created lazily on the
 * first step that sees a gradient, as PyTorch does.
 *
 *   optim::AdamW opt(model->parameters(), {.lr = 3e-4, .weightDecay = 0.1});
 *   // or groups with their own options, missing ones taken from the defaults:
 *   optim::SGD opt({{.params = decay, .options = {{"weight_decay", 0.1}}}, {.params = noDecay}}, {.lr = 0.1});
 *
 * step() runs without autograd (NoGradGuard) and updates parameters in place, so the module's
 * tensors (and any other handle to them) see the new values. zeroGrad() sets grads to none by
 * default.
 *
 * Checkpoints: stateDict() returns an OptimizerStateDict: every state tensor in one flat
 * name -> Tensor map (for safetensors) and everything else (optimizer type, groups with their
 * options and parameter indices) as plain data with a JSON form. Parameters are numbered by their
 * position over all groups in order (0, 1, ...); a tensor is named "state.<index>.<key>", e.g.
 * "state.3.exp_avg", "state.3.step" (a 0-d float32 tensor, as torch keeps it).
 * loadStateDict checks the type, group count, group sizes and every tensor's shape before it
 * changes anything, and then replaces the state and the group options (lr included).
 *
 * Threads: not thread-safe; step() runs on the calling thread.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::optim {

// Hyper-parameters of one group by torch's names ("lr", "momentum", "weight_decay", "beta1", ...).
using GroupOptions = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params{};
  GroupOptions options{};  // when passed to a constructor: overrides of the optimizer's defaults

  double lr() const;
  void setLr(double lr) { options["lr"] = lr; }
  // The option `key`; ValueError naming it when the group has none.
  double option(const std::string& key) const;
};

// Per-parameter state: a step count and named tensors ("exp_avg", "momentum_buffer", ...).
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;
};

// What an optimizer saves: see the header comment. `groups[i].params` hold parameter indices.
struct OptimizerStateDict {
  struct Group {
    std::vector<int64_t> params;
    GroupOptions options;
  };
  std::string type;  // "SGD", "Adam", "AdamW"
  std::vector<Group> groups;
  std::map<std::string, Tensor> tensors;  // "state.<index>.<key>"

  // {"type": "AdamW", "groups": [{"params": [0, 1], "options": {"lr": 0.001, ...}}, ...]}
  // Numbers are written with 17 significant digits so they read back exactly.
  std::string metadataJson() const;
  // Parses metadataJson()'s output into type and groups (tensors are left as they are).
  // ValueError naming what is wrong for malformed text.
  void setMetadataFromJson(const std::string& json);
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, without autograd.
  void step();
  // The same update with the gradients `gradOf` gives (undefined: the parameter has none this
  // step) instead of .grad: a distributed autograd context's gradients (rpc/autograd.h).
  using GradientLookup = std::function<Tensor(const Tensor& param)>;
  void step(const GradientLookup& gradOf);
  // Clears (setToNone) or zeroes the gradients of every parameter in every group.
  void zeroGrad(bool setToNone = true);

  // Adds a group; options it does not set come from the defaults. A parameter may be in only one
  // group; unknown option names are a ValueError.
  void addParamGroup(ParamGroup group);
  std::vector<ParamGroup>& paramGroups() { return groups_; }
  const std::vector<ParamGroup>& paramGroups() const { return groups_; }
  const GroupOptions& defaults() const { return defaults_; }
  // Sets lr in every group.
  void setLr(double lr);
  // All parameters, group by group.
  std::vector<Tensor> parameters() const;
  const std::string& type() const { return type_; }

  // Float32 master weights for bfloat16/float16 parameters. With them on, the update of each such
  // parameter runs on a float32 copy kept in its state (key "master", created from the parameter
  // at its first step), reading the parameter's low-precision gradient widened to float32, with
  // float32 moments and momentum; the parameter then receives the master rounded once. Without
  // them a half parameter updates in its own precision, and an update smaller than half its
  // rounding step is lost (a bfloat16 weight near 1 ignores any change below 2^-8). Float32 and
  // float64 parameters are unaffected. Call before the first step (ValueError once a half
  // parameter has state). The masters are saved and restored with the state dict; loading a
  // state that has masters into an optimizer without them is a ValueError.
  void setMasterWeights(bool enabled = true);
  bool masterWeights() const { return masterWeights_; }

  // State of one parameter (null before its first step).
  const ParamState* state(const Tensor& param) const;

  OptimizerStateDict stateDict() const;
  void loadStateDict(const OptimizerStateDict& dict);

 protected:
  Optimizer(std::string type, GroupOptions defaults);
  // Validates one group's options (called after defaults were filled in).
  virtual void checkOptions(const GroupOptions& options) const = 0;
  // Updates the parameters of one group (grad mode is off).
  virtual void stepGroup(ParamGroup& group) = 0;
  // (A master weight stands for its parameter in both: its state and its gradient.)
  ParamState& stateFor(const Tensor& param) { return state_[owner(param).impl()]; }
  // The gradient this step applies to `param`: .grad, or the lookup's step(gradOf) was given.
  Tensor gradFor(const Tensor& param) const {
    const Tensor& p = owner(param);
    return gradOf_ != nullptr ? (*gradOf_)(p) : p.grad();
  }

 private:
  std::string type_;
  GroupOptions defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
  const GradientLookup* gradOf_ = nullptr;  // set while step(gradOf) runs
  bool masterWeights_ = false;
  // While a group steps on master weights: each master's parameter.
  std::unordered_map<const TensorImpl*, Tensor> masterOf_;
  const Tensor& owner(const Tensor& t) const {
    if (masterOf_.empty()) return t;
    auto it = masterOf_.find(t.impl());
    return it == masterOf_.end() ? t : it->second;
  }
  void stepWithMasters(ParamGroup& group);
};

// `grad` (param's gradient) made ready for an update: contiguous, with param's dtype, detached.
// ValueError naming `op` when its shape differs from the parameter's. With readsHalf (the fused
// updates, whose step kernels take it), a bfloat16/float16 gradient of a float32 parameter (a
// master weight's) keeps its dtype: the CPU's kernels read it directly instead of through a
// widened copy.
Tensor updateGrad(const Tensor& param, Tensor grad, const char* op, bool readsHalf = false);

// Runs fn.template operator()<T, G>() with T the parameter's element type and G the gradient's
// (G == T, or a half type for a float32 parameter: see updateGrad).
template <typename Fn>
void dispatchUpdate(const Tensor& param, const Tensor& grad, const char* op, Fn&& fn) {
  if (param.dtype() == DType::Float32 && grad.dtype() == DType::BFloat16) {
    fn.template operator()<float, BFloat16>();
  } else if (param.dtype() == DType::Float32 && grad.dtype() == DType::Float16) {
    fn.template operator()<float, Half>();
  } else {
    COHORT_DISPATCH_FLOAT(param.dtype(), op, [&]<typename T>() { fn.template operator()<T, T>(); });
  }
}

}  // namespace cohort::optim
