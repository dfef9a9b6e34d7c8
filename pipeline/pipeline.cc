#include <cohort/pipeline/pipeline.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include <fmt/format.h>

#include <cohort/core/autograd/checkpoint.h>
#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/split_backward.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>

namespace cohort::pipeline {

// What one stage keeps of one micro-batch between its actions.
struct Pipeline::MicroState {
  Tensor input;    // the stage's input (a leaf requiring grad when it is floating point and not stage 0's)
  Tensor output;   // forward's result (the last stage: its weighted loss)
  Tensor gradOut;  // the gradient of `output`, received or handed over
  Tensor gradIn;   // the gradient of `input`, to send or hand over
  autograd::WeightBackward rest;  // the postponed weight half of a split backward
  void clear() {
    input = output = gradOut = gradIn = Tensor();
    rest = autograd::WeightBackward();
  }
};

namespace {

int localIndex(const std::vector<int>& ids, int stage) {
  auto it = std::lower_bound(ids.begin(), ids.end(), stage);
  return static_cast<int>(it - ids.begin());
}

// Rethrows the current exception with `where` in front of its message, keeping its type.
[[noreturn]] void rethrowAt(const std::string& where) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + e.what());
  } catch (const RpcTimeoutError& e) {
    throw RpcTimeoutError(where + e.what());
  } catch (const PeerError& e) {
    throw PeerError(where + e.what());
  } catch (const DistError& e) {
    throw DistError(where + e.what());
  } catch (const RpcError& e) {
    throw RpcError(where + e.what());
  } catch (const ValueError& e) {
    throw ValueError(where + e.what());
  } catch (const std::exception& e) {
    throw Error(where + e.what());
  }
}

}  // namespace

Shape microbatchSizes(int64_t rows, int microbatches) {
  Shape sizes;
  for (int i = 0; i < microbatches; ++i) sizes.push_back(rows / microbatches + (i < rows % microbatches ? 1 : 0));
  return sizes;
}

Pipeline::Pipeline(std::vector<std::shared_ptr<nn::Module>> stages, TransportPtr transport, LossFn loss,
                   PipelineOptions options)
    : Pipeline(std::move(stages), transport, std::move(loss),
               makeSchedule(options.schedule, transport ? transport->size() : 1, options.microbatches, options.chunks,
                            options.lookahead),
               options) {}

Pipeline::Pipeline(std::vector<std::shared_ptr<nn::Module>> stages, TransportPtr transport, LossFn loss,
                   Schedule schedule, PipelineOptions options)
    : stages_(std::move(stages)), transport_(std::move(transport)), loss_(std::move(loss)), options_(options) {
  if (!transport_) throw ValueError("Pipeline: the transport is null");
  if (!loss_) throw ValueError("Pipeline: no loss function");
  if (schedule.ranks != transport_->size())
    throw ScheduleError(fmt::format("Pipeline: schedule '{}' is for {} ranks, the transport ({}) has {}", schedule.name,
                                    schedule.ranks, transport_->name(), transport_->size()));
  if (options.splitTail != 0) schedule = splitTail(schedule, options.splitTail);
  check(schedule);  // ScheduleError before anything runs
  schedule_ = withCommunication(schedule);
  options_.microbatches = schedule_.microbatches;
  stageIds_ = schedule_.stagesOf(transport_->rank());
  if (stages_.size() != stageIds_.size())
    throw ValueError(fmt::format("Pipeline: schedule '{}' places {} stage(s) on rank {} ({}), {} module(s) given",
                                 schedule_.name, stageIds_.size(), transport_->rank(), fmt::join(stageIds_, ", "),
                                 stages_.size()));
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (!stages_[i]) throw ValueError(fmt::format("Pipeline: the module of stage {} is null", stageIds_[i]));
    // Activations and gradients arrive on the transport's device: the stage must be there too.
    for (const auto& [name, p] : stages_[i]->namedParameters())
      if (p.device() != transport_->device())
        throw ValueError(fmt::format("Pipeline: stage {}'s parameter '{}' is on {}, but the transport ({}) places "
                                     "what it receives on {}; build the transport with the stage's device",
                                     stageIds_[i], name, p.device().str(), transport_->name(),
                                     transport_->device().str()));
  }
  for (int s : options_.checkpointStages)
    if (s < 0 || s >= schedule_.stages)
      throw ValueError(
          fmt::format("Pipeline: checkpointStages names stage {}, outside 0..{}", s, schedule_.stages - 1));
  for (const TiedParameter& t : options_.tied) {
    Tie tie;
    for (const auto& [stage, name] : t.copies) {
      if (stage < 0 || stage >= schedule_.stages)
        throw ValueError(fmt::format("Pipeline: tied parameter '{}' names stage {}, outside 0..{}", name, stage,
                                     schedule_.stages - 1));
      const int r = schedule_.rankOf(stage);
      if (std::find(tie.ranks.begin(), tie.ranks.end(), r) == tie.ranks.end()) tie.ranks.push_back(r);
      if (r != transport_->rank()) continue;
      // Names are the stage module's own (inside a DistributedDataParallel, its wrapped module's).
      nn::Module* m = stages_[static_cast<size_t>(localIndex(stageIds_, stage))].get();
      if (auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(m)) m = &ddp->module();
      auto params = m->namedParameters();
      if (!params.contains(name))
        throw ValueError(fmt::format("Pipeline: tied parameter '{}' is not a parameter of stage {}", name, stage));
      Tensor p = params[name];
      bool seen = false;
      for (const Tensor& q : tie.local) seen |= q.impl() == p.impl();
      if (!seen) tie.local.push_back(p);
    }
    std::sort(tie.ranks.begin(), tie.ranks.end());
    tie.primary = !tie.ranks.empty() && tie.ranks.front() == transport_->rank();
    if (tie.ranks.size() > 1 && !tie.local.empty()) ties_.push_back(std::move(tie));
  }
  const int64_t tags = clipTag() + 1;
  if (tags - 1 > transport_->maxTag())
    throw ValueError(fmt::format("Pipeline: {} stages x {} micro-batches need {} tags; the {} transport carries {}",
                                 schedule_.stages, schedule_.microbatches, tags, transport_->name(),
                                 transport_->maxTag() + 1));
  states_.resize(stageIds_.size() * static_cast<size_t>(schedule_.microbatches));
  // Stages under DDP: the position of each one's last backward (B, or W when split), before which
  // DDP's reducer is armed.
  const auto& mine = schedule_.actions[static_cast<size_t>(transport_->rank())];
  lastBackward_.assign(stageIds_.size(), -1);
  for (size_t k = 0; k < mine.size(); ++k)
    if (mine[k].kind == ActionKind::Backward || mine[k].kind == ActionKind::BackwardWeight)
      lastBackward_[static_cast<size_t>(localIndex(stageIds_, mine[k].stage))] = static_cast<int>(k);
}

Pipeline::~Pipeline() = default;

bool Pipeline::holdsFirstStage() const { return !stageIds_.empty() && stageIds_.front() == 0; }
bool Pipeline::holdsLastStage() const { return !stageIds_.empty() && stageIds_.back() == schedule_.stages - 1; }

std::vector<Tensor> Pipeline::parameters() const {
  std::vector<Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& m : stages_)
    for (Tensor& p : m->parameters())
      if (seen.insert(p.impl()).second) out.push_back(p);
  return out;
}

// Tags: 0 .. 2 S m - 1 the activations and gradients (tag()), then the loss sent to each rank,
// then one per tied parameter, then clipGradNorm's.
int64_t Pipeline::tag(bool gradient, int stage, int microbatch) const {
  return (static_cast<int64_t>(microbatch) * schedule_.stages + stage) * 2 + (gradient ? 1 : 0);
}
int64_t Pipeline::lossTagBase() const { return 2LL * schedule_.stages * schedule_.microbatches; }
int64_t Pipeline::tieTagBase() const { return lossTagBase() + schedule_.ranks; }
int64_t Pipeline::clipTag() const { return tieTagBase() + static_cast<int64_t>(options_.tied.size()); }

Pipeline::MicroState& Pipeline::state(int stage, int microbatch) {
  return states_[static_cast<size_t>(localIndex(stageIds_, stage)) * static_cast<size_t>(schedule_.microbatches) +
                 static_cast<size_t>(microbatch)];
}

Tensor Pipeline::step(const Tensor& input, const Tensor& target) {
  const int m = schedule_.microbatches;
  std::vector<Tensor> inputs, targets;
  lossScale_.assign(static_cast<size_t>(m), 1.0);
  auto cut = [&](const Tensor& batch, const char* what) {
    if (!batch.defined())
      throw ValueError(fmt::format("Pipeline::step: rank {} holds the {} stage but got no {}", rank(),
                                   std::string(what) == "input" ? "first" : "last", what));
    if (batch.dim() == 0 || batch.size(0) < m)
      throw ValueError(fmt::format("Pipeline::step: the {} has {} rows along dim 0, fewer than the {} micro-batches",
                                   what, batch.dim() == 0 ? 0 : batch.size(0), m));
    const int64_t n = batch.size(0);
    return std::pair{batch.split(microbatchSizes(n, m), 0), n};
  };
  // Micro-batches move to this rank's device (a no-op when the batch is there already).
  const Device device = transport_->device();
  if (holdsFirstStage()) inputs = cut(input.defined() ? input.to(device) : input, "input").first;
  if (holdsLastStage()) {
    auto [parts, n] = cut(target.defined() ? target.to(device) : target, "target");
    targets = std::move(parts);
    if (options_.lossReduction == LossReduction::Mean)
      for (int i = 0; i < m; ++i) lossScale_[i] = static_cast<double>(targets[i].size(0)) / static_cast<double>(n);
  }
  lossSum_ = 0;
  timing_ = StepTiming{};
  for (Tie& t : ties_) {
    t.before.clear();
    for (const Tensor& p : t.local) t.before.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto secondsSince = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t - t0).count();
  };
  const auto& mine = schedule_.actions[static_cast<size_t>(rank())];
  try {  // every receive of the step, announced up front (transport.h: expect)
    for (const Action& a : mine) {
      if (a.kind == ActionKind::RecvActivation)
        transport_->expect(schedule_.rankOf(a.stage - 1), tag(false, a.stage, a.microbatch));
      if (a.kind == ActionKind::RecvGradient)
        transport_->expect(schedule_.rankOf(a.stage + 1), tag(true, a.stage, a.microbatch));
    }
  } catch (...) {
    rethrowAt(fmt::format("pipeline '{}' {}: posting the step's receives failed: ", schedule_.name,
                          transport_->describe(rank())));
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    const Action& a = mine[k];
    const auto start = std::chrono::steady_clock::now();
    try {
      const auto local = static_cast<size_t>(localIndex(stageIds_, a.stage));
      if (requireSync_ && static_cast<int>(k) == lastBackward_[local]) {
        // DDP reduces the gradients the stage accumulated over every micro-batch once, during
        // its last backward (every forward ran under noSync).
        if (auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(stages_[local].get())) {
          const Tensor& out = state(a.stage, a.microbatch).output;
          ddp->reducer().prepareForBackward(out.defined() ? std::vector<Tensor>{out} : std::vector<Tensor>{}, true);
        }
      }
      run(a, inputs, targets);
    } catch (...) {
      for (auto& s : states_) s.clear();
      rethrowAt(fmt::format("pipeline '{}' {} (stage {}): {} failed: ", schedule_.name, transport_->describe(rank()),
                            a.stage, a.str()));
    }
    const auto end = std::chrono::steady_clock::now();
    timing_.actions.push_back({a, secondsSince(start), secondsSince(end)});
    if (isCompute(a.kind)) timing_.busy += secondsSince(end) - secondsSince(start);
  }
  // The batch's loss to every rank, from the last stage's.
  const int lastRank = schedule_.rankOf(schedule_.stages - 1);
  const int64_t lossTag = lossTagBase();
  Tensor loss;
  try {
    syncTied();
    if (rank() == lastRank) {
      loss = scalarTensor(lossSum_, {.dtype = DType::Float64});
      for (int r = 0; r < transport_->size(); ++r)
        if (r != rank()) transport_->send(loss, r, lossTag + r);
    } else {
      loss = transport_->recv(lastRank, lossTag + rank(), options_.timeout).to(Device::cpu());
    }
    transport_->flush(options_.timeout);
  } catch (...) {
    rethrowAt(
        fmt::format("pipeline '{}' {}: the end of the step failed: ", schedule_.name, transport_->describe(rank())));
  }
  timing_.seconds = secondsSince(std::chrono::steady_clock::now());
  for (auto& s : states_) s.clear();
  return loss;
}

double Pipeline::clipGradNorm(double maxNorm) {
  if (!(maxNorm > 0))
    throw ValueError(fmt::format("Pipeline::clipGradNorm: maxNorm must be positive, got {}", maxNorm));
  std::unordered_set<const void*> skip;  // tied copies another rank counts
  for (const Tie& t : ties_)
    if (!t.primary)
      for (const Tensor& p : t.local) skip.insert(p.impl());
  std::vector<Tensor> params = parameters(), counted;
  for (const Tensor& p : params)
    if (!skip.contains(p.impl())) counted.push_back(p);
  const double localNorm = optim::gradNorm(counted);
  const double local = localNorm * localNorm;
  const int64_t tag = clipTag();
  double total = 0;
  try {
    Tensor mine = scalarTensor(local, {.dtype = DType::Float64});
    for (int r = 0; r < transport_->size(); ++r)
      if (r != rank()) transport_->send(mine, r, tag);
    for (int r = 0; r < transport_->size(); ++r)  // in rank order: the same sum everywhere
      total += r == rank() ? local : transport_->recv(r, tag, options_.timeout).itemDouble();
    transport_->flush(options_.timeout);
  } catch (...) {
    rethrowAt(fmt::format("pipeline '{}' {}: clipGradNorm failed: ", schedule_.name, transport_->describe(rank())));
  }
  const double norm = std::sqrt(total);
  const double coef = maxNorm / (norm + 1e-6);
  if (coef < 1.0) {
    autograd::NoGradGuard ng;
    for (Tensor& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  return norm;
}

void Pipeline::syncTied() {
  const int64_t base = tieTagBase();
  for (size_t k = 0; k < ties_.size(); ++k) {
    Tie& t = ties_[k];
    // This step's gradient of this rank's copies (a copy the step did not reach adds nothing).
    Tensor mine = zerosLike(t.local[0]);
    for (size_t j = 0; j < t.local.size(); ++j) {
      Tensor g = t.local[j].grad();
      if (!g.defined()) continue;
      mine = t.before[j].defined() ? mine + (g - t.before[j]) : mine + g;
    }
    for (int r : t.ranks)
      if (r != rank()) transport_->send(mine, r, base + static_cast<int64_t>(k));
    // Every rank adds the contributions in rank order, so every copy gets the same bits.
    Tensor total;
    for (int r : t.ranks) {
      Tensor part = r == rank() ? mine : transport_->recv(r, base + static_cast<int64_t>(k), options_.timeout);
      total = total.defined() ? total + part : part;
    }
    for (size_t j = 0; j < t.local.size(); ++j) {
      Tensor g = t.before[j].defined() ? t.before[j] + total : total.clone();
      autograd::NoGradGuard ng;
      if (t.local[j].grad().defined()) t.local[j].grad().copy_(g);
      else t.local[j].setGrad(g);
    }
  }
}

void Pipeline::run(const Action& a, const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  const int s = a.stage, i = a.microbatch, last = schedule_.stages - 1;
  MicroState& st = state(s, i);
  auto asLeaf = [](const Tensor& t) {
    Tensor leaf = t.detach();
    if (isFloating(leaf.dtype())) leaf.setRequiresGrad(true);
    return leaf;
  };
  auto local = [&](int stage) { return schedule_.rankOf(stage) == rank(); };
  auto roots = [&](std::vector<Tensor>& r, std::vector<Tensor>& g) {
    r = {st.output};
    g = {s == last ? Tensor() : st.gradOut};
    if (s != last && !st.gradOut.defined())
      throw Error(fmt::format("no gradient for the output of stage {} micro-batch {}", s, i));
  };
  auto handOverGradient = [&] {
    if (s > 0 && st.input.defined() && st.input.requiresGrad() && !st.gradIn.defined())
      st.gradIn = zerosLike(st.input);  // the input did not reach the loss
    if (s > 0 && local(s - 1)) state(s - 1, i).gradOut = st.gradIn;
  };
  switch (a.kind) {
    case ActionKind::RecvActivation:
      st.input = asLeaf(transport_->recv(schedule_.rankOf(s - 1), tag(false, s, i), options_.timeout));
      break;
    case ActionKind::RecvGradient:
      st.gradOut = transport_->recv(schedule_.rankOf(s + 1), tag(true, s, i), options_.timeout);
      break;
    case ActionKind::SendActivation: transport_->send(st.output, schedule_.rankOf(s + 1), tag(false, s + 1, i)); break;
    case ActionKind::SendGradient: transport_->send(st.gradIn, schedule_.rankOf(s - 1), tag(true, s - 1, i)); break;
    case ActionKind::Forward: {
      if (s == 0) st.input = inputs.at(static_cast<size_t>(i));
      else if (local(s - 1)) st.input = asLeaf(state(s - 1, i).output);
      autograd::EnableGradGuard grad;
      nn::Module& module = *stages_[static_cast<size_t>(localIndex(stageIds_, s))];
      Tensor out;
      auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(&module);
      if (std::find(options_.checkpointStages.begin(), options_.checkpointStages.end(), s) !=
          options_.checkpointStages.end()) {
        nn::Module* inner = ddp ? &ddp->module() : &module;
        out = autograd::checkpoint([inner](const Tensor& x) { return (*inner)(x); }, st.input);
      } else if (ddp) {
        auto noSync = ddp->noSync();
        out = module(st.input);
      } else {
        out = module(st.input);
      }
      if (s == last) {
        Tensor l = loss_(out, targets.at(static_cast<size_t>(i)));
        if (!l.defined() || l.numel() != 1) throw ValueError("the loss function must return a one-element tensor");
        if (lossScale_[i] != 1.0) l = l * lossScale_[i];
        lossSum_ += l.detach().itemDouble();
        st.output = l;
      } else {
        st.output = out;
      }
      break;
    }
    case ActionKind::Backward: {
      std::vector<Tensor> r, g;
      roots(r, g);
      autograd::backward(r, g);
      if (s > 0 && st.input.requiresGrad()) st.gradIn = st.input.grad();
      handOverGradient();
      st.output = st.gradOut = Tensor();
      break;
    }
    case ActionKind::BackwardInput: {
      std::vector<Tensor> r, g;
      roots(r, g);
      std::vector<Tensor> in;
      if (s > 0 && st.input.requiresGrad()) in.push_back(st.input);
      auto grads = autograd::backwardInput(r, g, in, st.rest);
      if (!in.empty()) st.gradIn = grads[0];
      handOverGradient();
      st.output = st.gradOut = Tensor();
      break;
    }
    case ActionKind::BackwardWeight: st.rest.run(); break;
  }
}

}  // namespace cohort::pipeline
