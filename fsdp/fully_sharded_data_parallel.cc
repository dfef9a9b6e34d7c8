#include <cohort/fsdp/fully_sharded_data_parallel.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/topology.h>

namespace cohort::fsdp {

const char* strategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::NoShard: return "NO_SHARD";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

bool ModuleTypePolicy::operator()(const nn::Module& module, const std::string&, int64_t) const {
  return std::find(typeNames.begin(), typeNames.end(), module.name()) != typeNames.end();
}

AutoWrapPolicy wrapModuleTypes(std::vector<std::string> typeNames) {
  if (typeNames.empty()) throw ValueError("wrapModuleTypes: no type names given");
  return ModuleTypePolicy{std::move(typeNames)};
}

AutoWrapPolicy wrapBySize(int64_t minNumel) {
  return [minNumel](const nn::Module&, const std::string&, int64_t unwrapped) { return unwrapped >= minNumel; };
}

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module, dist::ProcessGroupPtr pg, FSDPOptions options)
    : nn::Module("FullyShardedDataParallel"), module_(std::move(module)), pg_(std::move(pg)),
      opts_(std::move(options)) {
  if (module_ == nullptr) throw ValueError("FullyShardedDataParallel: the module is null");
  if (pg_ == nullptr) pg_ = dist::defaultProcessGroup();
  std::optional<std::pair<std::string, Device>> first;
  for (const auto& [name, p] : module_->namedParameters()) {
    if (!first) first = {name, p.device()};
    if (p.device() != first->second)
      throw NotSupportedError(fmt::format("FullyShardedDataParallel: parameter '{}' is on {} but '{}' is on {}; FSDP "
                                          "shards a module that lives on one device (move it with Module::to first)",
                                          name, p.device(), first->first, first->second));
    if (!p.requiresGrad())
      throw NotSupportedError(fmt::format("FullyShardedDataParallel: parameter '{}' does not require grad; frozen "
                                          "parameters inside a flat parameter are not supported (make it a buffer)",
                                          name));
  }
  if (first && pg_->size() > 1 && !pg_->supports(dist::OpType::Allgather, first->second.type()))
    throw NotSupportedError(fmt::format("FullyShardedDataParallel: the module's parameters are on {}, but process "
                                        "group '{}' has no backend for {} tensors (make the group with one, e.g. "
                                        "\"auto\" or \"cpu:gloo,cuda:nccl\")",
                                        first->second, pg_->name(), first->second));
  if (opts_.syncModuleStates) {
    std::vector<Tensor> state = module_->parameters();
    for (const Tensor& b : module_->buffers()) state.push_back(b);
    dist::broadcastCoalesced(*pg_, state, 0);
  }
  if (opts_.mixedPrecision.bufferDtype) {
    autograd::NoGradGuard noGrad;
    const DType bd = *opts_.mixedPrecision.bufferDtype;
    for (auto& [path, m] : module_->namedModules()) {
      for (const auto& [name, b] : m->namedBuffers(false))
        if (b.isFloatingPoint() && b.dtype() != bd) m->setBuffer(name, b.to(bd));
    }
  }
  checkPolicy();
  buildGroups();
  buildUnits();
}

void FullyShardedDataParallel::checkPolicy() {
  const auto* byType = opts_.autoWrapPolicy ? opts_.autoWrapPolicy.target<ModuleTypePolicy>() : nullptr;
  if (byType == nullptr) return;
  std::vector<std::string> present;  // type names below the root, first appearance order
  for (auto& [path, m] : module_->namedModules())
    if (!path.empty() && std::find(present.begin(), present.end(), m->name()) == present.end())
      present.push_back(m->name());
  std::vector<std::string> unmatched;
  for (const std::string& name : byType->typeNames)
    if (std::find(present.begin(), present.end(), name) == present.end()) unmatched.push_back(name);
  if (unmatched.empty()) return;
  throw ValueError(fmt::format(
      "FullyShardedDataParallel: wrapModuleTypes names {} that no module of the model has{}; the model's module "
      "types (below the root '{}') are: {}",
      fmt::join(unmatched, ", "),
      std::find(unmatched.begin(), unmatched.end(), module_->name()) != unmatched.end()
          ? " (the root is always a unit of its own; list the types of its children)"
          : "",
      module_->name(), present.empty() ? std::string("none") : fmt::format("{}", fmt::join(present, ", "))));
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& u : units_) {
    for (auto& h : u.hooks) h.remove();
    u.handle->shard().removeHook(u.shardHook);
    u.handle->restParams();
    for (const auto& p : u.handle->params())
      autograd::setManagedBy(p.param, fmt::format("belonged to a FullyShardedDataParallel wrapper (unit '{}') that "
                                                  "was destroyed; its values lived in that wrapper's shards (take "
                                                  "fsdp::fullStateDict before destroying the wrapper)",
                                                  u.handle->label()));
  }
}

void FullyShardedDataParallel::buildGroups() {
  switch (opts_.strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: groups_.shard = pg_; break;
    case ShardingStrategy::NoShard: groups_.replicate = pg_; break;
    case ShardingStrategy::HybridShard: {
      if (opts_.shardGroup || opts_.replicateGroup) {
        if (!opts_.shardGroup || !opts_.replicateGroup)
          throw ValueError(
              "FullyShardedDataParallel(HYBRID_SHARD): give both shardGroup and replicateGroup, or neither");
        if (opts_.shardGroup->size() * opts_.replicateGroup->size() != pg_->size())
          throw ValueError(fmt::format("FullyShardedDataParallel(HYBRID_SHARD): shard group of {} ranks times "
                                       "replicate group of {} is not the world's {}",
                                       opts_.shardGroup->size(), opts_.replicateGroup->size(), pg_->size()));
        groups_.shard = opts_.shardGroup;
        groups_.replicate = opts_.replicateGroup;
        break;
      }
      const std::string prefix = fmt::format("fsdp/nodes/{}/", pg_->sequenceNumber());
      auto ids = dist::exchangeNodeIds(*pg_->store(), prefix, pg_->rank(), pg_->size(), dist::localNodeId(opts_.nodeId),
                                       pg_->timeout());
      auto layout = dist::NodeLayout::fromIds(ids);
      for (const auto& node : layout.nodes) {
        if (node.size() != layout.nodes[0].size()) {
          throw ValueError(fmt::format("FullyShardedDataParallel(HYBRID_SHARD): nodes have different numbers of "
                                       "ranks ({} on the node of rank {}, {} on the node of rank {}); every node "
                                       "must hold the same number",
                                       layout.nodes[0].size(), layout.nodes[0][0], node.size(), node[0]));
        }
      }
      const int r = pg_->rank();
      dist::ProcessGroupOptions so;
      so.name = pg_->name() + "/fsdp_shard";
      so.timeout = pg_->timeout();
      dist::ProcessGroupOptions ro = so;
      ro.name = pg_->name() + "/fsdp_replicate";
      groups_.shard = pg_->split(layout.nodeOf[r], r, so);
      groups_.replicate = pg_->split(layout.localRank[r], r, ro);
      break;
    }
  }
}

void FullyShardedDataParallel::buildUnits() {
  // Which modules are units: post-order, so a module's count leaves out what its children took.
  std::unordered_set<const nn::Module*> wrapped;
  std::unordered_set<const nn::Module*> visited;
  std::function<int64_t(nn::Module&, const std::string&, bool)> pick = [&](nn::Module& m, const std::string& path,
                                                                           bool isRoot) -> int64_t {
    if (!visited.insert(&m).second) return 0;
    int64_t n = 0;
    for (const auto& [name, child] : m.namedChildren())
      n += pick(*child, path.empty() ? name : path + "." + name, false);
    for (const auto& [name, p] : m.namedParameters(false)) n += p.numel();
    if (!isRoot && opts_.autoWrapPolicy && n > 0 && opts_.autoWrapPolicy(m, path, n)) {
      wrapped.insert(&m);
      return 0;
    }
    return n;
  };
  pick(*module_, "", true);

  // Each parameter goes to the innermost unit holding it; one held by two units goes to the root.
  struct Pending {
    std::string path;
    nn::Module* module;
    std::vector<FlatParamInfo> params;
  };
  std::vector<Pending> pending{{"", nullptr, {}}};
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> where;  // impl -> (unit, index)
  std::vector<std::pair<const TensorImpl*, std::pair<nn::Module*, std::string>>> extraSlots;
  visited.clear();
  std::function<void(nn::Module&, const std::string&, size_t)> assign = [&](nn::Module& m, const std::string& path,
                                                                            size_t unit) {
    if (!visited.insert(&m).second) return;
    if (wrapped.contains(&m)) {
      pending.push_back({path, &m, {}});
      unit = pending.size() - 1;
    }
    for (const auto& [name, p] : m.namedParameters(false)) {
      const std::string fqn = path.empty() ? name : path + "." + name;
      auto it = where.find(p.impl());
      if (it == where.end()) {
        FlatParamInfo info;
        info.name = fqn;
        info.slots.push_back({&m, name});
        info.names.push_back(fqn);
        info.shape = p.sizes();
        info.param = p;
        where[p.impl()] = {unit, pending[unit].params.size()};
        pending[unit].params.push_back(std::move(info));
      } else {
        auto& [u, i] = it->second;
        if (u != unit && u != 0) {
          // Shared across units: move it to the root, whose buffer lives through the whole step.
          FlatParamInfo info = std::move(pending[u].params[i]);
          pending[u].params.erase(pending[u].params.begin() + static_cast<std::ptrdiff_t>(i));
          for (auto& [impl, loc] : where)
            if (loc.first == u && loc.second > i) --loc.second;
          where[p.impl()] = {0, pending[0].params.size()};
          pending[0].params.push_back(std::move(info));
        }
        auto& [u2, i2] = where[p.impl()];
        pending[u2].params[i2].slots.push_back({&m, name});
        pending[u2].params[i2].names.push_back(fqn);
      }
    }
    for (const auto& [name, child] : m.namedChildren()) assign(*child, path.empty() ? name : path + "." + name, unit);
  };
  assign(*module_, "", 0);

  // The storage each parameter had before wrapping: released once every unit copied its values.
  std::vector<std::pair<std::shared_ptr<Storage>, std::string>> before;
  for (const Pending& pu : pending)
    for (const FlatParamInfo& p : pu.params) before.emplace_back(p.param.storage(), p.name);

  for (size_t k = 0; k < pending.size(); ++k) {
    Pending& pu = pending[k];
    if (pu.params.empty()) continue;
    DType own = pu.params.front().param.dtype();
    for (const auto& p : pu.params) {
      if (p.param.dtype() != own)
        throw NotSupportedError(fmt::format("FullyShardedDataParallel: unit '{}' mixes parameter dtypes ({} for '{}', "
                                            "{} for '{}'); one flat parameter holds one dtype",
                                            pu.path, own, pu.params.front().name, p.param.dtype(), p.name));
    }
    // The shard keeps the parameters' dtype. Float32 master weights of a bfloat16/float16 model are
    // the optimizer's (Optimizer::setMasterWeights), sharded with the rest of its state.
    const DType compute = opts_.mixedPrecision.paramDtype.value_or(own);
    const DType reduce = opts_.mixedPrecision.reduceDtype.value_or(compute);
    Unit unit;
    unit.path = pu.path;
    unit.module = pu.module;
    if (k == 0) hasRootUnit_ = true;
    unit.handle = std::make_unique<FlatParamHandle>(pu.path.empty() ? "<root>" : pu.path, std::move(pu.params), groups_,
                                                    own, compute, reduce);
    units_.push_back(std::move(unit));
  }
  if (units_.empty()) throw ValueError("FullyShardedDataParallel: the module has no parameters");
  releaseOldStorage(before);

  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    registerParameter(fmt::format("flat_param_{}", u), unit.handle->shard());
    unit.shardHook = unit.handle->shard().registerHook([this, u](const Tensor&) -> std::optional<Tensor> {
      onShardGrad(u);
      return std::nullopt;
    });
    if (unit.module != nullptr) {
      unit.hooks.push_back(
          unit.module->registerForwardPreHook([this, u](nn::Module&, nn::TensorList&) { preForward(u); }));
      unit.hooks.push_back(unit.module->registerForwardHook(
          [this, u](nn::Module&, const nn::TensorList&, nn::TensorList& out) { postForward(u, out); }));
    }
  }
}

bool FullyShardedDataParallel::reshardAfterForward(size_t u) const {
  if (units_[u].module == nullptr) return false;  // the root stays gathered until its backward
  return opts_.strategy == ShardingStrategy::FullShard || opts_.strategy == ShardingStrategy::HybridShard;
}

nn::TensorList FullyShardedDataParallel::forwardMulti(const nn::TensorList& inputs) {
  finishInFlightReduce();
  for (auto& u : units_) u.handle->resetIteration();
  endQueued_ = false;
  stats_ = {};
  if (hasRootUnit_) {
    units_[0].handle->waitGather();
    units_[0].handle->ranForward = true;
    installLiveParams(0);
  }
  if (opts_.forwardPrefetch && orderKnown_ && !forwardOrder_.empty()) units_[forwardOrder_[0]].handle->startGather();
  noteGathered();
  nn::TensorList in = inputs;
  if (opts_.mixedPrecision.paramDtype) {
    for (Tensor& t : in)
      if (t.defined() && t.isFloatingPoint() && t.dtype() != *opts_.mixedPrecision.paramDtype)
        t = t.to(*opts_.mixedPrecision.paramDtype);
  }
  nn::TensorList out = module_->call(in);
  orderKnown_ = true;
  if (autograd::isGradEnabled()) {
    for (Tensor& t : out) {
      if (t.defined() && t.requiresGrad() && !t.isLeaf()) {
        t.registerHook([this](const Tensor&) -> std::optional<Tensor> {
          // The root unit, like every other, is gathered again for a backward that comes after
          // another backward ended (a pipeline running several micro-batches' forwards first).
          if (hasRootUnit_) preBackward(0);
          else queueEndOfBackward();
          return std::nullopt;
        });
      }
    }
  } else if (summoned_ == 0) {
    releaseAll();  // no backward follows
    restoreRestingParams();
  }
  return out;
}

nn::Module& FullyShardedDataParallel::train(bool on) {
  Module::train(on);
  module_->train(on);
  return *this;
}

void FullyShardedDataParallel::preForward(size_t u) {
  FlatParamHandle& h = *units_[u].handle;
  if (!orderKnown_ && std::find(forwardOrder_.begin(), forwardOrder_.end(), u) == forwardOrder_.end())
    forwardOrder_.push_back(u);
  h.waitGather();
  installLiveParams(u);
  if (opts_.forwardPrefetch && orderKnown_) {
    auto it = std::find(forwardOrder_.begin(), forwardOrder_.end(), u);
    if (it != forwardOrder_.end() && it + 1 != forwardOrder_.end()) units_[*(it + 1)].handle->startGather();
  }
  noteGathered();
}

void FullyShardedDataParallel::noteGathered() {
  size_t n = 0;
  for (const auto& u : units_)
    if (u.handle->gathered() || u.handle->gatherInFlight()) ++n;
  stats_.peakGatheredUnits = std::max(stats_.peakGatheredUnits, n);
}

void FullyShardedDataParallel::postForward(size_t u, nn::TensorList& outputs) {
  FlatParamHandle& h = *units_[u].handle;
  h.ranForward = true;
  if (summoned_ == 0 && (reshardAfterForward(u) || !autograd::isGradEnabled())) h.release();
  if (!autograd::isGradEnabled()) return;
  for (Tensor& t : outputs) {
    if (t.defined() && t.requiresGrad() && !t.isLeaf()) {
      t.registerHook([this, u](const Tensor&) -> std::optional<Tensor> {
        preBackward(u);
        return std::nullopt;
      });
    }
  }
}

void FullyShardedDataParallel::preBackward(size_t u) {
  queueEndOfBackward();
  FlatParamHandle& h = *units_[u].handle;
  if (h.backwardGathered || h.reduced()) return;
  h.backwardGathered = true;
  h.waitGather();
  if (opts_.backwardPrefetch == BackwardPrefetch::BackwardPre) {
    auto it = std::find(forwardOrder_.begin(), forwardOrder_.end(), u);
    if (it != forwardOrder_.end() && it != forwardOrder_.begin()) {
      FlatParamHandle& next = *units_[*(it - 1)].handle;
      if (!next.reduced()) next.startGather();
    }
  }
  noteGathered();
}

void FullyShardedDataParallel::installLiveParams(size_t u) {
  FlatParamHandle& h = *units_[u].handle;
  h.checkParams();
  if (!autograd::isGradEnabled()) return;
  // The module's own parameters become the outputs of the unit's node: whoever holds them (the
  // registry, a member the module kept) computes with the gathered values, and autograd hands the
  // node every gradient of the unit's parameters.
  std::vector<Tensor> params;
  params.reserve(h.params().size());
  for (const auto& p : h.params()) params.push_back(p.param);
  autograd::record("FSDPUnitBackward", {h.shard()}, params, {},
                   [this, u](autograd::Ctx&, const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     return {onUnitBackward(u, grads)};
                   });
}

void FullyShardedDataParallel::restoreRestingParams() {
  for (auto& unit : units_) unit.handle->restParams();
}

void FullyShardedDataParallel::releaseOldStorage(
    const std::vector<std::pair<std::shared_ptr<Storage>, std::string>>& before) {
  // A storage still used by a buffer (or now by a unit) is left alone; every other one is freed
  // with a note, so a tensor derived from a parameter before wrapping fails on first use instead
  // of computing with the initial values forever.
  std::unordered_set<const Storage*> keep;
  for (const Tensor& b : module_->buffers()) keep.insert(b.storage().get());
  for (const auto& unit : units_)
    for (const auto& p : unit.handle->params()) keep.insert(p.param.storage().get());
  for (const auto& [storage, name] : before) {
    if (storage == nullptr || keep.contains(storage.get()) || storage->released()) continue;
    storage->setReleasedNote(fmt::format(
        "it held parameter '{}' before FullyShardedDataParallel moved the parameter into a flat buffer; the "
        "parameter itself (the tensor registerParameter returned) follows it, but a tensor made from it before "
        "wrapping (a view, slice or transpose kept aside) does not: make such tensors from the parameter inside "
        "forward",
        name));
    storage->release();
  }
}

Tensor FullyShardedDataParallel::onUnitBackward(size_t u, const std::vector<Tensor>& grads) {
  queueEndOfBackward();
  FlatParamHandle& h = *units_[u].handle;
  // At most one reduction in flight: its flat gradient buffer is the only unsharded gradient.
  finishInFlightReduce();
  Tensor g = h.startReduce(grads);
  ++stats_.reducedInBackward;
  if (h.reduceInFlight()) inFlightReduce_ = u;
  h.release();  // every node that reads the unit's parameters has run
  return g;
}

void FullyShardedDataParallel::onShardGrad(size_t u) {
  if (inFlightReduce_ == u) finishInFlightReduce();
}

void FullyShardedDataParallel::finishInFlightReduce() {
  if (!inFlightReduce_) return;
  size_t u = *inFlightReduce_;
  inFlightReduce_.reset();
  units_[u].handle->finishReduce();
}

void FullyShardedDataParallel::queueEndOfBackward() {
  if (endQueued_ || !autograd::inBackward()) return;
  endQueued_ = true;
  autograd::queueCallback([this] { endOfBackward(); });
}

void FullyShardedDataParallel::endOfBackward() {
  finishInFlightReduce();
  // Units whose parameters did not all get a gradient: reduce what they have (zeros for the
  // rest), in a fixed order so every rank issues the same collectives.
  for (size_t k = units_.size(); k-- > 0;) {
    FlatParamHandle& h = *units_[k].handle;
    if (h.ranForward && !h.reduced()) {
      ++stats_.reducedAtEnd;
      Tensor g = h.startReduce(std::vector<Tensor>(h.params().size()));
      h.finishReduce();
      autograd::NoGradGuard noGrad;
      Tensor cur = h.shard().grad();
      if (cur.defined()) cur.add_(g);
      else h.shard().setGrad(g);
    }
  }
  releaseAll();
  restoreRestingParams();
  for (auto& u : units_) u.handle->resetIteration();
  endQueued_ = false;
}

void FullyShardedDataParallel::releaseAll() {
  for (auto& u : units_) u.handle->release();
}

double FullyShardedDataParallel::clipGradNorm(double maxNorm, double normType) {
  if (!(normType > 0))
    throw ValueError(fmt::format("FullyShardedDataParallel::clipGradNorm: normType must be > 0, got {}", normType));
  const bool inf = std::isinf(normType);
  double local = 0;
  {
    autograd::NoGradGuard noGrad;
    for (auto& u : units_) {
      Tensor g = u.handle->shard().grad();
      if (!g.defined() || g.numel() == 0) continue;
      Tensor a = g.to(DType::Float64).abs();
      if (inf) local = std::max(local, a.max().item<double>());
      else local += a.pow(normType).sum().item<double>();
    }
  }
  double total = local;
  if (groups_.shard && groups_.shard->size() > 1) {
    // Through the group's CPU backend, or the shards' device when it has none (an "nccl" group).
    const Device where = dist::controlDevice(*groups_.shard, units_.front().handle->shard().device());
    Tensor t = full({1}, local, {.dtype = DType::Float64, .device = where});
    groups_.shard->allreduce(t, {.op = inf ? dist::ReduceOp::Max : dist::ReduceOp::Sum})->wait();
    total = t.item<double>();
  }
  if (!inf) total = std::pow(total, 1.0 / normType);
  const double coef = maxNorm / (total + 1e-6);
  if (coef < 1.0) {
    autograd::NoGradGuard noGrad;
    for (auto& u : units_) {
      Tensor g = u.handle->shard().grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return total;
}

FullyShardedDataParallel::SummonFullParams::SummonFullParams(FullyShardedDataParallel& fsdp, bool writeback)
    : fsdp_(fsdp), writeback_(writeback) {
  ++fsdp_.summoned_;
  fsdp_.finishInFlightReduce();
  for (auto& u : fsdp_.units_) u.handle->waitGather();
}

FullyShardedDataParallel::SummonFullParams::~SummonFullParams() {
  --fsdp_.summoned_;
  for (auto& u : fsdp_.units_) {
    if (writeback_) u.handle->writeBackShard();
    u.handle->release();
  }
}

nn::StateDict FullyShardedDataParallel::stateDict() const {
  throw NotSupportedError(
      "FullyShardedDataParallel::stateDict: the wrapper holds each unit's flat shard, not the model's keys; take "
      "fsdp::fullStateDict(fsdp) for the plain model's state dict (collective: every rank calls it), or save "
      "with fsdp::saveShardedCheckpoint (fsdp/state_dict.h)");
}

nn::LoadStateDictResult FullyShardedDataParallel::loadStateDict(const nn::StateDict&, bool) {
  throw NotSupportedError(
      "FullyShardedDataParallel::loadStateDict: the wrapper holds each unit's flat shard, not the model's keys; "
      "load a plain model's state dict with fsdp::loadFullStateDict(fsdp, dict) (collective), or a sharded "
      "checkpoint with fsdp::loadShardedCheckpoint (fsdp/state_dict.h)");
}

std::string FullyShardedDataParallel::extraRepr() const {
  std::string s =
      fmt::format("strategy={}, world_size={}, units={}", strategyName(opts_.strategy), pg_->size(), units_.size());
  for (size_t u = 0; u < units_.size(); ++u)
    s += fmt::format("\n  unit {} '{}': {} parameters, {} elements ({} padded), shard {}", u,
                     units_[u].path.empty() ? "<root>" : units_[u].path, units_[u].handle->params().size(),
                     units_[u].handle->numel(), units_[u].handle->paddedNumel(), units_[u].handle->shardNumel());
  return s;
}

}  // namespace cohort::fsdp
