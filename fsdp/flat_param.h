/*
 * FlatParamHandle: one FSDP unit's parameters as one flat buffer.
 *
 * The unit's parameters (in module traversal order) are laid end to end in a flat buffer of
 * `paddedNumel` elements, padded with zeros to a multiple of the shard group's size S. Rank r of
 * the shard group owns elements [r * shardNumel, (r + 1) * shardNumel): `shard()` is that slice, a
 * leaf tensor of the parameters' own dtype that requires grad and is what the optimizer sees, so
 * optimizer state (float32 master weights of a half-precision model included) is sharded with it.
 *
 * Parameter handles: each module parameter keeps its own TensorImpl for good, so every handle to
 * it (the module's registry, a member the module kept from registerParameter, any other copy of
 * the Tensor) is the same tensor. Wrapping copies its values into the shard and points that
 * TensorImpl at its slice of the unit's full buffer (one Storage, `fullStorage`, in the compute
 * dtype); the storage it had before is released with a note naming the parameter, so a tensor
 * derived from it before wrapping (a view kept aside) fails clearly instead of holding stale
 * values. While the unit runs forward and backward the full buffer holds the gathered values and
 * the parameter is the output of the unit's autograd node (FullyShardedDataParallel records it);
 * between uses the storage is released (Storage::release) and the parameter is a leaf again whose
 * data may not be touched: the values live in the shard. Every tensor autograd saved from a
 * parameter stays a valid object and gets its data back when the unit is gathered again into the
 * same Storage. The gather writes through a separate TensorImpl (its own version counter), so it
 * does not look like an in-place change to autograd's saved-tensor checks. Parameters are marked
 * managed (autograd::setManagedBy), so an optimizer or clipGradNorm given them instead of the
 * shards is an error, not a silent no-op.
 *
 * With S == 1 and compute dtype == shard dtype (NO_SHARD without mixed precision), the full
 * buffer is the shard's own storage: nothing is gathered or freed, the optimizer's in-place update
 * is what the module sees.
 *
 * Gradients: after the unit's backward, the parameters' gradients are copied into a flat gradient
 * buffer (reduce dtype, zero padding), reduce-scattered with Avg over the shard group, all-reduced
 * with Avg over the replicate group (HYBRID_SHARD, NO_SHARD), and handed to autograd as the shard's
 * gradient (shard dtype), which accumulates it into shard().grad.
 *
 * Devices: the unit's parameters are on one device (the CPU or a GPU); the shard, the full buffer
 * and the flat gradients are allocated there, and the group's backend for that device carries them.
 *
 * Threads: the thread driving forward and backward; collectives are issued on it in the same
 * order on every rank.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/nn/module.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/process_group.h>

namespace cohort::fsdp {

// One parameter inside a flat buffer.
struct FlatParamInfo {
  std::string name;                                        // fully qualified, first registration
  std::vector<std::pair<nn::Module*, std::string>> slots;  // every (module, local name) holding it
  std::vector<std::string> names;                          // the fully qualified name of each slot
  Shape shape;
  int64_t offset = 0;  // in the flat buffer, elements
  int64_t numel = 0;
  // The module's own parameter (the one TensorImpl every handle shares). Before wrapping it holds
  // the values to shard; after, it views its slice of the full buffer (see the comment above).
  Tensor param;
};

struct FlatParamGroups {
  dist::ProcessGroupPtr shard;      // null: size 1 (the shard is the whole buffer)
  dist::ProcessGroupPtr replicate;  // null: no replication across groups
};

class FlatParamHandle {
 public:
  // `params` carry name, slots, shape and `param`; offsets are assigned here. The parameters'
  // values are copied into the shard, then each parameter is pointed at the full buffer.
  FlatParamHandle(std::string label, std::vector<FlatParamInfo> params, FlatParamGroups groups, DType shardDtype,
                  DType computeDtype, DType reduceDtype);
  ~FlatParamHandle();
  FlatParamHandle(const FlatParamHandle&) = delete;
  FlatParamHandle& operator=(const FlatParamHandle&) = delete;

  const std::string& label() const { return label_; }
  const std::vector<FlatParamInfo>& params() const { return params_; }
  int64_t numel() const { return numel_; }
  int64_t paddedNumel() const { return paddedNumel_; }
  int64_t shardNumel() const { return shardNumel_; }
  int shardSize() const;
  int shardRank() const;
  Tensor& shard() { return shard_; }
  const Tensor& shard() const { return shard_; }
  bool aliased() const { return aliased_; }  // full buffer == shard storage (never freed)
  bool gathered() const { return gathered_; }
  bool gatherInFlight() const { return pending_ != nullptr; }
  DType computeDtype() const { return computeDtype_; }

  // Starts the all-gather into the full buffer (no-op when gathered or in flight).
  void startGather();
  // Completes it (starting it first when needed); the module's parameters hold the full values.
  void waitGather();
  // Frees the full buffer (no-op when aliased or not gathered).
  void release();
  // Copies this rank's slice of the gathered full buffer into the shard (after the full
  // parameters were changed in place; no-op when aliased).
  void writeBackShard();

  // Throws ValueError naming the parameter when one is no longer what this unit wrapped: replaced
  // in a module slot (replaceParameter) or re-pointed at other memory (Module::to, say) after
  // wrapping. FSDP checks before each forward, so such a parameter is never trained silently wrong.
  void checkParams() const;
  // Makes every parameter a leaf again (after a backward, or a forward that had none).
  void restParams();

  // Backward: flattens `grads` (one per parameter; undefined = none) into a flat gradient buffer
  // and launches its reduction. Returns the tensor that holds the shard's gradient (shard dtype)
  // once finishReduce() has run; until then its contents are not ready.
  Tensor startReduce(const std::vector<Tensor>& grads);
  void finishReduce();
  bool reduced() const { return reduced_; }
  bool reduceInFlight() const { return reducePending_ != nullptr; }
  void resetIteration();

  bool ranForward = false;
  bool backwardGathered = false;

 private:
  std::string label_;
  std::vector<FlatParamInfo> params_;
  FlatParamGroups groups_;
  DType shardDtype_, computeDtype_, reduceDtype_;
  Device device_;  // the parameters' device: the shard, the full buffer and the gradients live there
  int64_t numel_ = 0, paddedNumel_ = 0, shardNumel_ = 0;
  Tensor shard_;
  std::shared_ptr<Storage> fullStorage_;
  Tensor fullFlat_;  // own TensorImpl over fullStorage_: the gather's output
  bool aliased_ = false;
  bool gathered_ = false;
  dist::WorkPtr pending_;
  // While the profiler records: when the running gather and reduce started (0: not recorded).
  int64_t gatherStartNs_ = 0, reduceStartNs_ = 0;
  void recordFsdp(const char* what, int64_t startNs) const;
  Tensor gatherInput_;  // keeps a cast shard alive while the gather runs

  bool reduced_ = false;
  dist::WorkPtr reducePending_;
  bool reducePendingIsShard_ = false;  // the in-flight op is the reduce-scatter (else the all-reduce)
  Tensor flatGrad_, gradShard_, gradOut_;
};

// A tensor viewing `storage` at `offset` (elements) with `shape`, with its own TensorImpl and
// version counter.
Tensor viewOfStorage(const std::shared_ptr<Storage>& storage, int64_t offset, const Shape& shape, DType dtype);

}  // namespace cohort::fsdp
