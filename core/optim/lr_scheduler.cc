#include <cohort/core/optim/lr_scheduler.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace cohort::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : opt_(optimizer) {
  for (const ParamGroup& g : opt_.paramGroups()) baseLrs_.push_back(g.lr());
}

void LRScheduler::apply() {
  auto& groups = opt_.paramGroups();
  if (groups.size() != baseLrs_.size())
    throw ValueError(fmt::format("LRScheduler: the optimizer has {} parameter groups, the scheduler knows {}",
                                 groups.size(), baseLrs_.size()));
  for (size_t i = 0; i < groups.size(); ++i) groups[i].setLr(lrAt(lastStep_, baseLrs_[i]));
}

void LRScheduler::step() {
  ++lastStep_;
  apply();
}

std::vector<double> LRScheduler::lastLr() const {
  std::vector<double> out;
  for (const ParamGroup& g : opt_.paramGroups()) out.push_back(g.lr());
  return out;
}

void LRScheduler::loadState(const SchedulerState& state) {
  if (state.baseLrs.size() != opt_.paramGroups().size())
    throw ValueError(fmt::format("LRScheduler.loadState: the state has {} base lrs, the optimizer {} groups",
                                 state.baseLrs.size(), opt_.paramGroups().size()));
  if (state.lastStep < 0) throw ValueError(fmt::format("LRScheduler.loadState: negative step {}", state.lastStep));
  baseLrs_ = state.baseLrs;
  lastStep_ = state.lastStep;
  apply();
}

StepLR::StepLR(Optimizer& optimizer, int64_t stepSize, double gamma)
    : LRScheduler(optimizer), stepSize_(stepSize), gamma_(gamma) {
  if (stepSize < 1) throw ValueError(fmt::format("StepLR: step size must be >= 1, got {}", stepSize));
  apply();
}

double StepLR::lrAt(int64_t step, double baseLr) const {
  return baseLr * std::pow(gamma_, static_cast<double>(step / stepSize_));
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmupSteps) : LRScheduler(optimizer), warmup_(warmupSteps) {
  if (warmupSteps < 1) throw ValueError(fmt::format("LinearWarmup: warmup steps must be >= 1, got {}", warmupSteps));
  apply();
}

double LinearWarmup::lrAt(int64_t step, double baseLr) const {
  if (step >= warmup_) return baseLr;
  return baseLr * static_cast<double>(step + 1) / static_cast<double>(warmup_);
}

CosineWithWarmup::CosineWithWarmup(Optimizer& optimizer, CosineWithWarmupOptions options)
    : LRScheduler(optimizer), o_(options) {
  if (o_.warmupSteps < 0 || o_.totalSteps < 1 || o_.warmupSteps > o_.totalSteps)
    throw ValueError(fmt::format("CosineWithWarmup: need 0 <= warmupSteps <= totalSteps and totalSteps >= 1, got {} "
                                 "and {}",
                                 o_.warmupSteps, o_.totalSteps));
  if (!(o_.minLr >= 0.0)) throw ValueError(fmt::format("CosineWithWarmup: minLr must be >= 0, got {}", o_.minLr));
  apply();
}

double CosineWithWarmup::lrAt(int64_t step, double baseLr) const {
  if (step < o_.warmupSteps) return baseLr * static_cast<double>(step + 1) / static_cast<double>(o_.warmupSteps);
  if (step >= o_.totalSteps) return o_.minLr;
  double ratio = static_cast<double>(step - o_.warmupSteps) /
                 static_cast<double>(std::max<int64_t>(1, o_.totalSteps - o_.warmupSteps));
  return o_.minLr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (baseLr - o_.minLr);
}

}  // namespace cohort::optim
