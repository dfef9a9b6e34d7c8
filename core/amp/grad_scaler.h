/*
 * GradScaler: dynamic loss scaling for float16 mixed precision, with torch.cuda.amp.GradScaler's
 * semantics (1.13) on any device. Small float16 gradients underflow to zero; multiplying the loss
 * by a large scale S before backward keeps them representable, and dividing the gradients by S
 * before the optimizer uses them gives the true gradients back. When S is too large some gradient
 * overflows (inf/NaN): that step is skipped and S shrinks; after growthInterval clean steps in a
 * row S grows again.
 *
 *   amp::GradScaler scaler;                        // {.initScale = 65536, .growthInterval = 2000, ...}
 *   for (...) {
 *     opt.zeroGrad();
 *     scaler.scale(loss).backward();               // gradients are S times too large
 *     scaler.unscale(opt);                         // optional: true gradients, e.g. to clip them
 *     optim::clipGradNorm(model->parameters(), 1.0);
 *     scaler.step(opt);                            // opt.step() unless a gradient was inf/NaN
 *     scaler.update();                             // back off or grow S for the next iteration
 *   }
 *
 * Per optimizer and iteration (between two update() calls): unscale() at most once, then step()
 * at most once (step() unscales when unscale() was not called). unscale() multiplies every
 * gradient of the optimizer's parameters by 1/S in place, computing in float32 (float64 for
 * float64 gradients) and rounding once to the gradient's dtype (float32, bfloat16 or float16), and
 * records whether any unscaled value is inf or NaN; parameters without a gradient are skipped.
 * On CPU this is one fused pass per gradient (check and multiply), split over the intra-op
 * threads for large gradients; on other devices it is composed of existing ops.
 * update() then applies torch's rule (its _amp_update_scale_):
 *   some optimizer found an inf/NaN:  S = S * backoffFactor, tracker = 0
 *   otherwise:                        tracker + 1 == growthInterval ? (S * growthFactor if that is
 *                                     finite, else S unchanged; tracker = 0) : tracker += 1
 * S is kept in float32 (each product is taken in double and rounded to float32), as torch keeps
 * it in a float32 tensor. update(newScale) sets S and leaves the tracker alone.
 *
 * Differences from torch: step() returns whether it stepped; float16 gradients are unscaled
 * rather than refused (as torch's ShardedGradScaler does); an unscaled gradient that overflows
 * its dtype (possible only once S < 1) counts as an inf; misuse is a ValueError, not an
 * assertion.
 *
 * Distributed training: the decision to skip must be the same on every rank, or the ranks'
 * parameters drift apart. Give the scaler a FoundInfReduction: unscale() checks this rank's
 * gradients, then calls it with the local flag; it must combine the flags of every rank (an
 * all-reduce with MAX) and is called once per unscale on every rank, in the same order, like any
 * collective. dist::foundInfAllReduce(pg) (<cohort/distributed/grad_scaler.h>) makes one from a
 * ProcessGroup; fsdp::ShardedGradScaler (<cohort/fsdp/sharded_grad_scaler.h>) uses the FSDP
 * module's group. Under FSDP each rank's optimizer holds only its shards, so only the reduction
 * lets an overflow in one rank's shard skip the step everywhere; under DDP the gradients were
 * already all-reduced, and the reduction costs one small collective per step.
 *
 * Checkpoints: stateDict() is a name -> number map ("scale", "growth_tracker", "growth_factor",
 * "backoff_factor", "growth_interval"; empty for a disabled scaler, as torch's) that
 * io::TrainingState carries as `gradScaler`; io::restoreCheckpoint and fsdp::loadTrainingCheckpoint
 * restore it into RestoreTargets::gradScaler. loadStateDict checks everything first (ValueError
 * naming the entry) and changes nothing on a bad state. Save it after update().
 *
 * A disabled scaler (enabled = false) leaves everything alone: scale() returns the loss, unscale()
 * and update() do nothing, step() is optimizer.step(), getScale() is 1.
 * Threads: not thread-safe; one thread drives a scaler.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include <cohort/core/optim/optimizer.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::amp {

// torch's defaults and meanings.
struct GradScalerOptions {
  double initScale = 65536.0;     // > 0 and finite in float32
  double growthFactor = 2.0;      // > 1, finite
  double backoffFactor = 0.5;     // in (0, 1)
  int64_t growthInterval = 2000;  // >= 1 clean steps in a row before the scale grows
  bool enabled = true;
};

// Combines this rank's found-inf flag with every other rank's and returns the combined flag (a
// collective: see the header comment).
using FoundInfReduction = std::function<bool(bool localFoundInf)>;

// The scaler's state by name (see the header comment).
using GradScalerState = std::map<std::string, double>;

class GradScaler {
 public:
  // ValueError naming the option for bad options.
  explicit GradScaler(GradScalerOptions options = {}, FoundInfReduction reduceFoundInf = {});
  virtual ~GradScaler() = default;
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  // loss * S, differentiable, in the loss's dtype (any shape). ValueError for an undefined or
  // non-floating tensor.
  Tensor scale(const Tensor& loss) const;
  // Divides the optimizer's gradients by S in place and records (after the reduction) whether one
  // was inf/NaN. ValueError when called twice for the optimizer in one iteration, after step(),
  // for an optimizer without parameters or one whose parameters have no gradient at all.
  void unscale(optim::Optimizer& optimizer);
  // unscale() unless done, then optimizer.step() when no gradient was inf/NaN. Returns whether
  // it stepped. ValueError when called twice for the optimizer in one iteration.
  bool step(optim::Optimizer& optimizer);
  // Backs off or grows S (see the header comment) and starts a new iteration. ValueError when no
  // optimizer was unscaled or stepped since the last update.
  void update();
  // Sets S (> 0 and finite in float32, else ValueError) and starts a new iteration; the growth
  // tracker is kept.
  void update(double newScale);

  // S (1 when disabled).
  double getScale() const;
  // Clean steps in a row since the scale last changed by update().
  int64_t growthTracker() const { return growthTracker_; }
  bool isEnabled() const { return opts_.enabled; }
  const GradScalerOptions& options() const { return opts_; }
  // This iteration's verdict for the optimizer (after the reduction); nullopt before unscale().
  std::optional<bool> foundInf(const optim::Optimizer& optimizer) const;
  void setFoundInfReduction(FoundInfReduction reduceFoundInf) { reduce_ = std::move(reduceFoundInf); }
  bool hasFoundInfReduction() const { return static_cast<bool>(reduce_); }

  GradScalerState stateDict() const;
  // ValueError naming what is wrong (a missing, unknown or out-of-range entry, an empty state for
  // an enabled scaler); changes nothing then. A disabled scaler ignores the state, as torch's.
  void loadStateDict(const GradScalerState& state);
  // loadStateDict's checks alone.
  void checkStateDict(const GradScalerState& state) const;

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool foundInf = false;
  };

  GradScalerOptions opts_;
  FoundInfReduction reduce_;
  float scale_;
  int64_t growthTracker_ = 0;
  std::unordered_map<const optim::Optimizer*, PerOptimizer> perOptimizer_;
};

// Checks the options (ValueError naming the first bad one); `where` prefixes the message.
void checkOptions(const GradScalerOptions& options, const char* where = "GradScaler");

namespace detail {
// Multiplies `grad` by invScale in place (float32 math, float64 for float64; one rounding to its
// dtype) and returns whether any result is inf or NaN. fused: the one-pass CPU kernel (CPU tensors
// only); otherwise existing ops, which any device has. Exposed so tests can hold both to the same
// results.
bool unscaleGrad(const Tensor& grad, float invScale, bool fused = true);
}  // namespace detail

}  // namespace cohort::amp
