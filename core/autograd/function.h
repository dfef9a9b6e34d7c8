/*
 * How an op records itself for autograd. After computing its outputs without autograd, an op
 * calls record(): if grad mode is on and any input requires grad, a Node is made whose backward
 * is the given lambda, with edges to the inputs and the outputs attached to it.
 *
 *   Tensor mul(const Tensor& a, const Tensor& b) {
 *     Tensor out = mulKernel(a, b);
 *     autograd::record("mul", {a, b}, {out}, {a, b},
 *         [](autograd::Ctx& ctx, const std::vector<Tensor>& g) -> std::vector<Tensor> {
 *           return {g[0] * ctx.saved(1), g[0] * ctx.saved(0)};
 *         });
 *     return out;
 *   }
 *
 * The backward lambda gets one gradient per output (zeros when an output got none) and returns
 * one per input, undefined for inputs with no gradient. Returned gradients that have the shape
 * of a broadcast of the input are summed back to the input's shape, and cast to its dtype, by
 * the node itself: backward formulas never need sumToShape. Backward runs with grad mode off.
 * Non-tensor state the backward needs is captured by value in the lambda.
 */
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>

namespace cohort::autograd {

class Ctx {
 public:
  Ctx(const Node& node, const std::vector<SavedTensor>& saved) : node_(node), saved_(saved) {}
  // The i-th saved tensor (checked against in-place modification since it was saved).
  Tensor saved(size_t i) const;
  // Whether input i needs a gradient from this call (lets backward skip work): false for an input
  // without history, and for the edges a split backward leaves to its other half
  // (split_backward.h: the input half computes only the gradients on a path to its inputs, the
  // weight half only the others). A gradient returned for such an input is dropped.
  bool needsInputGrad(size_t i) const;
  // Where input i's gradient may be written directly: a leaf's .grad or gradient target, when
  // this gradient is the only one the leaf still gets and it has no gradient hooks (engine.cc).
  // A backward that takes a defined sink must fill it (sink.accumulate: add into it; otherwise
  // overwrite it) and return sink.target itself as input i's gradient; nothing else may return
  // it. Undefined target: compute the gradient as usual.
  GradSink gradSink(size_t i) const;
  // Offers input i's gradient to the engine before this backward returns, so that a node that
  // only passes it on (a receive function, which sends it to its worker) may run at once while
  // this backward computes the rest: linear offers its input's gradient before computing its
  // weight's. True when the engine took it: the backward must then return an undefined gradient
  // for input i. False (return it as usual) in every other case.
  bool emit(size_t i, Tensor grad) const;

 private:
  const Node& node_;
  const std::vector<SavedTensor>& saved_;
};

using BackwardFn = std::function<std::vector<Tensor>(Ctx& ctx, const std::vector<Tensor>& grads)>;

// Whether any of `inputs` requires grad and grad mode is on.
bool needsGrad(std::initializer_list<const Tensor*> inputs);
bool needsGrad(const std::vector<Tensor>& inputs);

// Records an op (see above). Undefined inputs are allowed (optional args like bias) and get no
// edge. Outputs must be freshly made by the op (or views of inputs). Returns the node, or null
// when nothing was recorded.
std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const std::vector<Tensor>& saved, BackwardFn backward);

// For in-place ops: `self` was modified in place by op `name` using `others`. Bumps the version
// counter and, when history must be recorded, makes self the output of a new node whose inputs
// are self's previous history and `others`. In-place ops on a leaf that requires grad, or on a
// view of a tensor that requires grad, are errors naming the op (as in PyTorch).
void checkInplace(const char* name, const Tensor& self);
void recordInplace(const char* name, Tensor& self, const std::vector<Tensor>& others, const std::vector<Tensor>& saved,
                   BackwardFn backward);

}  // namespace cohort::autograd
