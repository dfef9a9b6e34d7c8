/*
 * DistributedOptimizer: one optimizer over parameters that live on several workers, stepping with
 * the gradients of a distributed autograd context (autograd.h).
 *
 *   std::vector<rpc::RRef<Tensor>> params = ...;   // rpc::makeRRef(p) on each owner, or remote()
 *   rpc::DistributedOptimizer opt("SGD", params, {{"lr", 0.05}});
 *   for (...) {
 *     rpc::autograd::Context ctx;
 *     ... forward over RPC ...; ctx.backward({loss});
 *     opt.step(ctx);
 *   }
 *
 * The constructor asks every worker that owns some of the parameters to build one local optimizer
 * of the given type (optim::makeOptimizer's names: "SGD", "Adam", "AdamW" or a registered one)
 * with the given options over the parameters it owns. step(ctx) asks all of them at once
 * (asynchronous RPCs) to apply the context's gradients on that worker (Optimizer::step with the
 * context's gradients; a parameter that got none is left alone) and returns when all are done.
 * The local optimizers on one worker step one at a time (one lock per worker): trainers sharing a
 * parameter server each have their own local optimizer there over the same tensors, and two steps
 * of one tensor at once would lose updates. (PyTorch's local optimizers share one lock too.)
 * Destroying the DistributedOptimizer destroys the remote optimizers; those
 * of a creator that died without destroying them stay on their owners until the owner's agent
 * shuts down.
 *
 * Errors: parameters that are not tensors requiring grad, an unknown type or option, and a failed
 * step (for example a context that never reached the owner) raise RpcError naming the worker;
 * step reports every failed owner, after all have answered.
 *
 * Threads: step() may run from several threads at once, each with its own context.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cohort/core/optim/optimizer.h>
#include <cohort/rpc/autograd.h>
#include <cohort/rpc/rpc.h>

namespace cohort::rpc {

// Parameters with options of their own (overriding the optimizer's), as optim::ParamGroup.
struct DistributedParamGroup {
  std::vector<RRef<Tensor>> params{};
  optim::GroupOptions options{};
};

class DistributedOptimizer {
 public:
  DistributedOptimizer(const std::string& type, const std::vector<RRef<Tensor>>& params,
                       const optim::GroupOptions& options = {});
  // Groups: each owner's optimizer gets, per group, the group's parameters it owns, with the
  // group's options over `options`.
  DistributedOptimizer(const std::string& type, const std::vector<DistributedParamGroup>& groups,
                       const optim::GroupOptions& options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  void step(const autograd::Context& ctx);
  void step(autograd::ContextId ctx);
  // The workers holding one of this optimizer's local optimizers.
  std::vector<std::string> owners() const;

 private:
  struct Owner {
    std::string name;
    int64_t id = 0;  // the local optimizer's number on that worker
  };
  void destroyRemotes() noexcept;
  std::vector<Owner> owners_;
  std::weak_ptr<RpcAgent> agent_;
};

}  // namespace cohort::rpc
