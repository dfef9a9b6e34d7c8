/*
 * The backward engine: runs the graph from roots to leaves on the calling thread.
 * Nodes run when every gradient they will receive has arrived (dependency counting); among
 * ready nodes the most recently created runs first, so gradients of the last layers reach their
 * leaves (and DDP's hooks) first. Each node runs with grad mode off.
 */
#pragma once

#include <functional>
#include <vector>

#include <cohort/core/autograd/node.h>

namespace cohort::autograd {

// Backward from `roots` with the given gradients (same length; undefined = ones for one-element
// roots). Without retainGraph, saved tensors are freed as nodes run.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph = false);

// Called from a hook while backward runs: `fn` runs on the same thread once the current backward
// has run every node, before backward() returns (callbacks queued by callbacks run too, in order).
// An exception from `fn` propagates out of backward(). When backward fails before the end, queued
// callbacks are dropped. DDP waits for its last bucket here. Outside backward: a ValueError.
void queueCallback(std::function<void()> fn);
bool inBackward();  // whether this thread is running backward()

// Gives the leaf `leaf` a gradient target: while its .grad is undefined, the next backward writes
// the leaf's gradient into `target` (same shape and dtype, contiguous) and makes it .grad, instead
// of allocating one. DDP points each parameter at its slice of the bucket, so that backward writes
// gradients straight into the memory the all-reduce reads. An undefined `target` clears it.
// Throws ValueError for a tensor that is not a leaf requiring grad, or a target that does not fit.
void setGradTarget(const Tensor& leaf, const Tensor& target);

namespace detail {
// The sink for the gradient flowing along `e` from the node now running (Ctx::gradSink).
GradSink gradSinkFor(const Edge& e);
}  // namespace detail

}  // namespace cohort::autograd
