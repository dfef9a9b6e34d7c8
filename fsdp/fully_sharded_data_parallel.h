/*
 * FullyShardedDataParallel (ZeRO stage 3): N ranks train one model while each keeps only 1/N of
 * its parameters, gradients and optimizer state.
 *
 *   auto pg = dist::initProcessGroup();
 *   auto fsdp = std::make_shared<fsdp::FullyShardedDataParallel>(gpt, pg,
 *       fsdp::FSDPOptions{.autoWrapPolicy = fsdp::wrapModuleTypes({"TransformerBlock"})});
 *   optim::AdamW opt(fsdp->parameters(), {.lr = 3e-4});   // the local shards only
 *   for (...) {
 *     opt.zeroGrad();
 *     crossEntropy((*fsdp)(x), y).backward();              // gradients reduce-scattered into shards
 *     fsdp->clipGradNorm(1.0);                              // the global norm over every shard
 *     opt.step();
 *   }
 *
 * Units: the auto-wrap policy picks modules (each TransformerBlock, or every module whose
 * not-yet-wrapped parameters pass a count); each picked module and the root (everything left)
 * becomes a unit that owns one flat parameter (flat_param.h). A parameter shared by two units
 * (tied weights) belongs to the root unit. The wrapped module's parameters become views into the
 * unit's full flat buffer, which exists only while the unit runs; touching them outside forward
 * and backward is an error naming the released storage (gather them with fullStateDict or
 * SummonFullParams).
 *
 * One step: forward gathers the root, then each unit before it runs (its forward pre-hook) and,
 * under FULL_SHARD, frees it after (forward hook). While gathering for a forward with grad mode
 * on, the unit's parameters are registered in the module as fresh views that are the outputs of
 * one autograd node per unit ("FSDPUnitBackward", input: the shard), so autograd itself says when
 * the unit's backward is over: that node runs once every gradient of the unit's parameters has
 * arrived, flattens them, launches the reduce-scatter (average) and frees the full buffer, and
 * returns the shard's gradient, which autograd accumulates into shard().grad (a hook on the shard
 * waits for the collective first; one reduction is in flight at a time). Backward re-gathers a
 * freed unit when the gradient of one of its outputs arrives (a tensor hook: just before the
 * unit's backward). The end of backward (autograd::queueCallback) reduces units that ran forward
 * but got no gradient at all (zeros, so peers are not left waiting), frees everything and puts
 * the resting parameters (leaves viewing the released buffer) back into the module. Prefetch: with forwardPrefetch, a
 * unit's pre-hook starts the next unit's all-gather (the order recorded at the first forward); with
 * BackwardPrefetch::BackwardPre, a unit's pre-backward starts the all-gather of the unit whose
 * backward comes next.
 *
 * Strategies: FULL_SHARD (free after forward), SHARD_GRAD_OP (keep the full parameters from
 * forward until the unit's backward), NO_SHARD (no sharding: gradients all-reduced, like DDP),
 * HYBRID_SHARD (FULL_SHARD inside each node, gradients all-reduced across nodes between ranks
 * with the same local rank; nodes from distributed/topology.h, or given groups).
 *
 * Construction is collective over the group: rank 0's parameters and buffers are copied to every
 * rank first. The wrapped module's parameters stay views of the units' (released) buffers for
 * good, also after the wrapper is destroyed: take fullStateDict (state_dict.h) to get them back. Every rank must run
 * the same units in the same order in each forward and backward (the same model and the same control flow), as with any
 * collective. Threads: one thread drives forward and backward.
 */
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cohort/core/nn/module.h>
#include <cohort/distributed/process_group.h>
#include <cohort/fsdp/flat_param.h>

namespace cohort::fsdp {

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
const char* strategyName(ShardingStrategy s);

enum class BackwardPrefetch { None, BackwardPre };

// Whether to make `module` (at `path`, "" for the root's children joined by '.') a unit, given
// the number of its parameter elements not already in a unit below it. Never asked for the root.
using AutoWrapPolicy = std::function<bool(const nn::Module& module, const std::string& path, int64_t unwrappedNumel)>;
// Wraps modules whose name() (the type name: "TransformerBlock", "Linear") is listed. A listed
// name that matches no module below the root is a ValueError at wrap time listing the type names
// the model has (a misspelt policy would otherwise wrap nothing, silently).
AutoWrapPolicy wrapModuleTypes(std::vector<std::string> typeNames);
// What wrapModuleTypes stores in the policy (FullyShardedDataParallel finds it there to check the
// names against the model).
struct ModuleTypePolicy {
  std::vector<std::string> typeNames;
  bool operator()(const nn::Module& module, const std::string& path, int64_t unwrappedNumel) const;
};
// Wraps every module with at least `minNumel` unwrapped parameter elements (PyTorch's
// size_based_auto_wrap_policy).
AutoWrapPolicy wrapBySize(int64_t minNumel);

// Unset fields keep the module's dtype. The optimizer's shards keep the module's dtype (a float32
// model's shards stay float32 whatever the model computes in); paramDtype is what forward and
// backward compute in, reduceDtype what gradients travel in. A model stored in bfloat16/float16
// gets float32 master weights from its optimizer, as an unwrapped one does: call
// setMasterWeights() on the optimizer built over parameters() (the masters are sharded too).
struct MixedPrecision {
  std::optional<DType> paramDtype{};
  std::optional<DType> reduceDtype{};  // defaults to paramDtype
  std::optional<DType> bufferDtype{};
};

struct FSDPOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  AutoWrapPolicy autoWrapPolicy{};  // null: one unit, the root
  MixedPrecision mixedPrecision{};
  bool forwardPrefetch = false;
  BackwardPrefetch backwardPrefetch = BackwardPrefetch::BackwardPre;
  bool syncModuleStates = true;  // copy rank 0's parameters and buffers to every rank first
  // HYBRID_SHARD: the groups to shard in and replicate across. Both null: found from the node
  // layout (nodeId as in ProcessGroupOptions: empty = COHORT_NODE_ID, else the hostname).
  dist::ProcessGroupPtr shardGroup{};
  dist::ProcessGroupPtr replicateGroup{};
  std::string nodeId{};
};

class FullyShardedDataParallel : public nn::Module {
 public:
  FullyShardedDataParallel(nn::ModulePtr module, dist::ProcessGroupPtr pg = nullptr, FSDPOptions options = {});
  ~FullyShardedDataParallel() override;

  nn::TensorList forwardMulti(const nn::TensorList& inputs) override;
  // The wrapper's own registry holds the flat shards, not the model's keys: both raise
  // NotSupportedError naming fsdp::fullStateDict / loadFullStateDict and the sharded checkpoints
  // (fsdp/state_dict.h) instead of returning a dict no plain model can load.
  nn::StateDict stateDict() const override;
  nn::LoadStateDictResult loadStateDict(const nn::StateDict& dict, bool strict = true) override;
  Module& train(bool on = true) override;

  // The wrapped module (its parameters are views into released buffers outside forward/backward).
  nn::Module& module() { return *module_; }
  const nn::ModulePtr& modulePtr() const { return module_; }
  dist::ProcessGroup& processGroup() { return *pg_; }
  const FSDPOptions& options() const { return opts_; }
  const FlatParamGroups& groups() const { return groups_; }

  // Units: index 0 is the root when it has parameters of its own; then the wrapped modules in
  // pre-order. unitPath(i): "" for the root.
  size_t numUnits() const { return units_.size(); }
  FlatParamHandle& unit(size_t i) { return *units_[i].handle; }
  const FlatParamHandle& unit(size_t i) const { return *units_[i].handle; }
  const std::string& unitPath(size_t i) const { return units_[i].path; }

  // What the last forward and backward did (tests and the benchmark read it): units reduced from
  // their gradient hooks while backward ran vs. at its end, and the most units whose full buffers
  // were allocated (gathered or being gathered) at once, root included.
  struct StepStats {
    size_t reducedInBackward = 0;
    size_t reducedAtEnd = 0;
    size_t peakGatheredUnits = 0;
  };
  const StepStats& lastStepStats() const { return stats_; }

  // Clips the shards' gradients by the norm over the whole model (collective over the shard
  // group); returns that norm before clipping. normType: any p > 0 or infinity.
  double clipGradNorm(double maxNorm, double normType = 2.0);

  // Gathers every unit's full parameters while alive (collective), e.g. to read or write them
  // from outside forward; on destruction, writes them back to the shards when `writeback` (each
  // rank its own slice) and frees them. Forward under no_grad inside the scope (evaluation on
  // one rank, say) keeps the units gathered and needs no collective.
  class SummonFullParams {
   public:
    SummonFullParams(FullyShardedDataParallel& fsdp, bool writeback = false);
    ~SummonFullParams();
    SummonFullParams(const SummonFullParams&) = delete;
    SummonFullParams& operator=(const SummonFullParams&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
    bool writeback_;
  };

  std::string extraRepr() const override;

 private:
  struct Unit {
    std::string path;
    nn::Module* module = nullptr;  // null for the root unit (driven by forwardMulti)
    std::unique_ptr<FlatParamHandle> handle;
    std::vector<nn::HookHandle> hooks;
    int shardHook = 0;  // on the shard leaf: completes the unit's reduction before it accumulates
  };

  void buildGroups();
  void checkPolicy();
  void buildUnits();
  void preForward(size_t u);
  void postForward(size_t u, nn::TensorList& outputs);
  void preBackward(size_t u);
  void installLiveParams(size_t u);
  void restoreRestingParams();
  void releaseOldStorage(const std::vector<std::pair<std::shared_ptr<Storage>, std::string>>& before);
  Tensor onUnitBackward(size_t u, const std::vector<Tensor>& grads);
  void onShardGrad(size_t u);
  void queueEndOfBackward();
  void endOfBackward();
  void finishInFlightReduce();
  bool reshardAfterForward(size_t u) const;
  void releaseAll();
  void noteGathered();

  nn::ModulePtr module_;
  dist::ProcessGroupPtr pg_;
  FSDPOptions opts_;
  FlatParamGroups groups_;
  std::vector<Unit> units_;
  bool hasRootUnit_ = false;
  std::vector<size_t> forwardOrder_;  // units in the order the first forward ran them
  bool orderKnown_ = false;
  bool endQueued_ = false;
  std::optional<size_t> inFlightReduce_;
  StepStats stats_;
  int summoned_ = 0;  // SummonFullParams scopes alive: forward then leaves units gathered
};

}  // namespace cohort::fsdp
