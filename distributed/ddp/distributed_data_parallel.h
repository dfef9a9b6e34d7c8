/*
 * DistributedDataParallel: wraps a module so that N ranks, each training on its own slice of the
 * batch, end every step with the same parameters a single process would reach on the whole batch.
 *
 *   auto pg = dist::initProcessGroup();
 *   auto ddp = std::make_shared<dist::DistributedDataParallel>(model, pg);
 *   optim::SGD opt(ddp->parameters(), {.lr = 0.1});
 *   for (auto& [x, y] : loader) {
 *     opt.zeroGrad();
 *     nn::functional::crossEntropy((*ddp)(x), y).backward();   // gradients averaged over ranks
 *     opt.step();
 *   }
 *
 * Construction (collective over the group): checks that every rank has the same parameters
 * (names, shapes, dtypes; a mismatch names the first differing parameter and the ranks) and copies
 * rank 0's parameters and buffers to everyone. Forward runs the wrapped module (registered as the
 * child "module", so state dicts read "module.<name>" as PyTorch's DDP does); the backward that
 * follows all-reduces gradients bucket by bucket while it runs (reducer.h) and returns with every
 * parameter's .grad averaged over the group. With broadcastBuffers, rank 0's buffers are copied
 * to every rank at each forward.
 *
 * .grad of each parameter is a view into its bucket (gradient as bucket view): no copy on the
 * hot path; zeroGrad(false) keeps the view, zeroGrad(true) drops it and the next backward copies
 * the gradient back into the bucket once.
 *
 * With RPC (rpc/autograd.h): a DDP module may be one part of a model whose other parts live on
 * other workers. Run its forward inside an rpc::autograd::Context and call ctx.backward({loss}):
 * the distributed backward drives the same bucketed all-reduce, but gradients go to the context
 * instead of .grad (the reducer reads and writes them through autograd::gradOf/setGradOf), and
 * when backward returns the context holds the averaged gradients; .grad is left alone. Step with
 * an rpc::DistributedOptimizer (or Optimizer::step(gradOf) with the context's gradients).
 *
 * Devices: the module lives on one device, the CPU or one GPU per rank (Module::to before
 * wrapping), and the group needs a backend for it ("auto" gives CUDA tensors to "nccl"): the
 * buckets are on that device and reduce there. Parameters on two devices are a NotSupportedError.
 * On a GPU, backward returns once the GPU has reduced every bucket (the host waits for it).
 *
 * Threads: one thread drives forward and backward (as with any module); every rank must run the
 * same sequence of synchronised iterations. Uneven data: see join.h.
 */
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <cohort/core/nn/module.h>
#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/ddp/reducer.h>
#include <cohort/distributed/process_group.h>

namespace cohort::dist {

class Join;

struct DDPOptions {
  double bucketCapMb = 25.0;      // bucket size (MiB) after the first
  double firstBucketCapMb = 1.0;  // the first bucket is small so communication starts early
  // Parameters that get no gradient in some iterations are found at each forward (a graph walk)
  // and reduced as zeros; parameters no rank used keep .grad undefined.
  bool findUnusedParameters = false;
  // The set of used parameters and the bucket order never change: unused parameters are found
  // once, at the first forward.
  bool staticGraph = false;
  bool broadcastBuffers = true;  // copy rank 0's buffers to every rank at each forward
  // true (cohort's default): each parameter's .grad is a view into its gradient bucket, which
  // saves a gradient-sized copy of memory and two copies per step; .grad must then not be
  // replaced by a tensor of another shape or detached in place. false: .grad is a tensor of its
  // own, copied into the bucket when ready and back after the all-reduce (PyTorch's default).
  bool gradientAsBucketView = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  // `pg` null: the default group (initProcessGroup). Collective over the group.
  explicit DistributedDataParallel(nn::ModulePtr module, ProcessGroupPtr pg = nullptr, DDPOptions options = {});
  ~DistributedDataParallel() override;

  nn::TensorList forwardMulti(const nn::TensorList& inputs) override;

  nn::Module& module() { return *module_; }
  const nn::ModulePtr& modulePtr() const { return module_; }
  ProcessGroup& processGroup() { return *pg_; }
  const DDPOptions& options() const { return opts_; }
  Reducer& reducer() { return *reducer_; }

  // Gradient accumulation: forward/backward inside the scope only accumulate local gradients;
  // the first synchronised backward after it reduces the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp), prev_(ddp.requireSync_) {
      ddp.requireSync_ = false;
    }
    ~NoSyncGuard() {
      if (ddp_) ddp_->requireSync_ = prev_;
    }
    NoSyncGuard(NoSyncGuard&& o) noexcept : ddp_(o.ddp_), prev_(o.prev_) { o.ddp_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard noSync() { return NoSyncGuard(*this); }
  bool requireSync() const { return requireSync_; }

  // Replaces the default all-reduce; before the first backward.
  void registerCommHook(CommHookPtr hook);

  std::string extraRepr() const override;

 private:
  friend class Join;
  struct JoinState;

  void verifyParameters(const std::vector<std::string>& names);
  void broadcastState(int root);  // parameters and buffers from `root`
  void broadcastBuffers(int root);
  // Join: one notify round. Returns (ranks still with data, whether they synchronise); the first
  // rank with data is where buffers come from.
  struct JoinRound {
    int active = 0;
    bool sync = false;
    int firstActive = 0;
  };
  JoinRound joinNotify(bool active, bool sync);
  void joinShadowUntilAllJoined();

  nn::ModulePtr module_;
  ProcessGroupPtr pg_;
  DDPOptions opts_;
  std::vector<Tensor> params_;  // parameters that require grad, each once, registration order
  Device control_;              // where the model check and Join's flags go (reducer.h: controlDevice)
  std::unique_ptr<Reducer> reducer_;
  bool requireSync_ = true;
  std::unique_ptr<JoinState> join_;  // set while a Join scope is active
};

// Copies `tensors` from `root` to every rank of `pg`: one broadcast per dtype over a flat buffer.
void broadcastCoalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root);

}  // namespace cohort::dist
