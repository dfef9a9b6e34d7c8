/*
 * Learning-rate schedules. A scheduler remembers each group's base lr when it is made, sets the
 * group's lr for step 0 at once (as torch's schedulers do), and each step() moves to the next
 * step and sets lr = lrAt(step, baseLr) in every group. Call it once per optimizer step, after
 * optimizer.step().
 *
 *   optim::AdamW opt(model->parameters(), {.lr = 6e-4});
 *   optim::CosineWithWarmup sched(opt, {.warmupSteps = 100, .totalSteps = 5000, .minLr = 6e-5});
 *   for (...) { ...; opt.step(); sched.step(); }
 *
 * Schedules are closed-form in the step count, so state() (the step count and base lrs) is all a
 * checkpoint needs; loadState() restores it and sets the lrs for that step.
 * The scheduler keeps a reference to the optimizer, which must outlive it.
 */
#pragma once

#include <cstdint>
#include <vector>

#include <cohort/core/optim/optimizer.h>

namespace cohort::optim {

struct SchedulerState {
  int64_t lastStep = 0;
  std::vector<double> baseLrs;
};

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and sets every group's lr.
  void step();
  // The step whose lrs are set now (0 right after construction).
  int64_t lastStep() const { return lastStep_; }
  // The lr of each group as last set.
  std::vector<double> lastLr() const;
  const std::vector<double>& baseLrs() const { return baseLrs_; }
  // The lr for `step` of a group whose base lr is `baseLr`.
  virtual double lrAt(int64_t step, double baseLr) const = 0;

  SchedulerState state() const { return {lastStep_, baseLrs_}; }
  // ValueError when the number of base lrs differs from the optimizer's group count.
  void loadState(const SchedulerState& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Sets the lrs for lastStep_; derived constructors call it once their fields are set.
  void apply();

 private:
  Optimizer& opt_;
  std::vector<double> baseLrs_;
  int64_t lastStep_ = 0;
};

// lr = base * gamma^floor(step / stepSize)   (torch.optim.lr_scheduler.StepLR)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t stepSize, double gamma = 0.1);
  double lrAt(int64_t step, double baseLr) const override;

 private:
  int64_t stepSize_;
  double gamma_;
};

// lr = base * (step + 1) / warmupSteps for step < warmupSteps, then base. (torch's
// LinearLR(start_factor = 1/warmupSteps, end_factor = 1, total_iters = warmupSteps - 1).)
class LinearWarmup : public LRScheduler {
 public:
  LinearWarmup(Optimizer& optimizer, int64_t warmupSteps);
  double lrAt(int64_t step, double baseLr) const override;

 private:
  int64_t warmup_;
};

struct CosineWithWarmupOptions {
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1;
  double minLr = 0.0;
};

// Linear warmup as LinearWarmup, then half a cosine from base down to minLr, reached at
// totalSteps and kept after it:
//   step < warmup:            base * (step + 1) / warmup
//   warmup <= step < total:   minLr + 0.5 * (1 + cos(pi * (step - warmup) / max(1, total - warmup))) * (base - minLr)
//   step >= total:            minLr
// (the schedule of tests/parity/torch_reference.py and nanoGPT's get_lr).
class CosineWithWarmup : public LRScheduler {
 public:
  CosineWithWarmup(Optimizer& optimizer, CosineWithWarmupOptions options);
  double lrAt(int64_t step, double baseLr) const override;

 private:
  CosineWithWarmupOptions o_;
};

}  // namespace cohort::optim
