/*
 * Split backward: one backward in two halves, as zero-bubble pipeline schedules run a stage's
 * backward. The input half computes the gradients of some tensors the graph was built from (the
 * stage's received activations), so that they can be sent on at once; the weight half, run
 * later, does the rest (the weight gradients).
 *
 *   WeightBackward rest;
 *   std::vector<Tensor> dx = backwardInput({out}, {dout}, {x}, rest);  // send dx upstream
 *   ...
 *   rest.run();  // parameters' gradients, hooks (DDP's), as out.backward(dout) would
 *
 * Input half. A node runs in it when it lies on a path from the roots to an input, and computes
 * only the gradients of the edges on such a path: Ctx::needsInputGrad is false for the others
 * (linear computes dX, not dW; mul(x, w) computes g*w only; layerNorm dX only). A node that has
 * edges left for the weight half keeps its saved tensors (even without retainGraph) and the
 * gradients it was given; every other node of the graph waits for the weight half. Hooks on
 * tensors made by input-path nodes run in the input half; every hook runs once in all.
 * The inputs' gradients stop there: they are returned as they reach the inputs (before any hook
 * of the input itself), never accumulated into an input's .grad (in either half). An input that
 * is not a leaf still hands its gradient on into its own history in the weight half, as
 * backward() would, so leaves behind it get theirs.
 *
 * Weight half (WeightBackward::run). Applies the kept nodes again to the same gradients for their
 * remaining edges only, and runs every other node, in the engine's usual order, so every leaf but
 * the inputs ends with the gradient one backward(roots, grads) would have given it (the same
 * values, up to float rounding where gradients are summed in another order), with the same
 * hooks, into the GradStore current when run() is called (engine.h) or else .grad. Saved tensors
 * are freed as nodes finish, unless retainGraph.
 *
 * Callbacks that hooks queue (queueCallback) run at the end of the half that queued them, or,
 * when that half runs inside another backward on this thread, at the end of that one. Each half
 * runs on the calling thread, like backward().
 */
#pragma once

#include <memory>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::autograd {

namespace detail {
class SplitTask;
}

class WeightBackward;

// The input half (see above). `roots` and `grads` as backward() takes them (undefined grad: ones
// for a one-element root). Returns one gradient per input, undefined for an input no gradient
// reached (allow_unused semantics: an input that requires grad but is not in the graph is not an
// error). ValueError for an undefined input or one that does not require grad, and when `rest`
// still holds an earlier weight half. Leaves the weight half in `rest` (rest.pending() is false
// when it has nothing to do).
std::vector<Tensor> backwardInput(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& inputs, WeightBackward& rest, bool retainGraph = false);

// The postponed weight half of a backwardInput. Movable, not copyable.
class WeightBackward {
 public:
  WeightBackward();
  ~WeightBackward();  // a weight half never run is dropped: its kept gradients and (without
                      // retainGraph) the saved tensors it kept are freed
  WeightBackward(WeightBackward&& other) noexcept;
  WeightBackward& operator=(WeightBackward&& other) noexcept;  // drops a pending half first
  WeightBackward(const WeightBackward&) = delete;
  WeightBackward& operator=(const WeightBackward&) = delete;

  // Whether run() has work left.
  bool pending() const { return task_ != nullptr; }
  // Runs the weight half (see above); afterwards pending() is false, also when it throws. Running
  // it again does nothing.
  void run();

 private:
  friend std::vector<Tensor> backwardInput(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                           const std::vector<Tensor>&, WeightBackward&, bool);
  std::unique_ptr<detail::SplitTask> task_;
};

}  // namespace cohort::autograd
