/*
 * Activation checkpointing: trade compute for memory by not keeping a region's activations for
 * backward, and recomputing them when backward reaches the region.
 *
 *   Tensor h = checkpoint([&](const Tensor& x) { return (*block)(x); }, x);
 *
 * Forward. fn runs with grad mode off, so nothing inside it is recorded or saved; one node is
 * recorded instead, with edges to the inputs that require grad, which keeps only the inputs (as
 * saved tensors, checked against in-place changes) and the state of the default generator
 * (defaultGenerator()) at the call. With grad mode off, checkpoint is just fn(inputs).
 *
 * Backward. The node restores that generator state (and puts the current one back afterwards),
 * runs fn again with grad mode on, on detached aliases of the saved inputs, and runs a backward
 * of its own through the recomputed graph from the outputs with the gradients they got. That
 * nested backward accumulates the gradients of the parameters fn uses (leaves it reaches, into
 * the GradStore of the backward it runs in, or .grad; their hooks run, DDP's included), and the
 * node returns the inputs' gradients. Callbacks hooks queue in it run when the outer backward
 * ends. So inputs and parameters get the gradients they would get without checkpointing (the
 * same values, up to float rounding where a parameter's gradient is summed in another order),
 * dropout masks included. Inside a split backward's input half (split_backward.h) the node splits
 * its nested backward too and leaves its weight gradients to the weight half.
 *
 * Requirements and limits:
 *  - fn must compute the same thing when called again: same ops, same shapes (checked: a
 *    recomputation with other output shapes is an Error), randomness only from the default
 *    generator. A Generator of one's own (e.g. Dropout(p, &gen)) is not restored.
 *  - Every tensor fn uses that requires grad and has history must be passed in `inputs`; fn
 *    reaching one through its closure is an Error when backward recomputes. Parameters (leaves)
 *    may be captured.
 *  - fn is called again during backward: whatever it captures must still be alive then.
 *  - Floating-point outputs require grad whenever grad mode is on, even when nothing fn uses
 *    does: without recording fn, the forward cannot tell (backward through them then computes
 *    nothing).
 *  - Parameters used only inside fn are not in the forward's graph: DDP's findUnusedParameters
 *    (and staticGraph's first iteration) would count them unused. A parameter used both inside
 *    and outside fn gets its gradient in two parts (its hooks run twice), which DDP rejects.
 *  - Backward twice through a checkpoint needs retainGraph on the first, as for any node.
 */
#pragma once

#include <functional>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::autograd {

std::vector<Tensor> checkpoint(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                               const std::vector<Tensor>& inputs);
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace cohort::autograd
