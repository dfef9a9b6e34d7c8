#include <cohort/distributed/ddp/distributed_data_parallel.h>

#include <map>
#include <unordered_set>

#include <fmt/format.h>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/ddp/join.h>
#include <cohort/distributed/detail/coalesce.h>
#include <cohort/distributed/init.h>

namespace cohort::dist {

struct DistributedDataParallel::JoinState {
  JoinOptions options;
  std::vector<int> lastActive;  // ranks with data in the last round where some had data
};

namespace {

std::string describeParam(const std::string& name, const Tensor& p) {
  return fmt::format("'{}' {} {}", name, shapeStr(p.sizes()), p.dtype());
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

void broadcastCoalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root) {
  if (pg.size() == 1) return;
  std::map<DType, std::vector<Tensor>> byType;
  for (const Tensor& t : tensors)
    if (t.defined() && t.numel() > 0) byType[t.dtype()].push_back(t);
  autograd::NoGradGuard noGrad;
  for (auto& [dtype, group] : byType) {
    const detail::FlatLayout layout = detail::FlatLayout::of(group, "broadcastCoalesced");
    Tensor flat = pg.rank() == root ? detail::pack(group, layout)
                                    : empty({layout.total}, {.dtype = dtype, .device = layout.device});
    pg.broadcast(flat, {.root = root})->wait();
    if (pg.rank() != root) {
      std::vector<Tensor> dsts;
      dsts.reserve(group.size());
      for (const Tensor& t : group) dsts.push_back(t.detach());
      detail::unpack(flat, dsts, layout);
    }
  }
}

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module, ProcessGroupPtr pg, DDPOptions options)
    : nn::Module("DistributedDataParallel"), module_(std::move(module)), pg_(std::move(pg)), opts_(options) {
  if (module_ == nullptr) throw ValueError("DistributedDataParallel: the module is null");
  if (pg_ == nullptr) pg_ = defaultProcessGroup();
  registerModule("module", module_);
  std::vector<std::string> names;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, p] : module_->namedParameters()) {
    if (!p.requiresGrad() || !seen.insert(p.impl()).second) continue;
    if (!params_.empty() && p.device() != params_.front().device())
      throw NotSupportedError(fmt::format("DistributedDataParallel: parameter '{}' is on {} but '{}' is on {}; DDP "
                                          "replicates a module that lives on one device (move it with "
                                          "Module::to first)",
                                          name, p.device(), names.front().substr(7), params_.front().device()));
    params_.push_back(p);
    names.push_back("module." + name);  // as ddp.namedParameters() and its state dict show it
  }
  const Device device = params_.empty() ? Device::cpu() : params_.front().device();
  if (!pg_->supports(OpType::Allreduce, device.type()))
    throw NotSupportedError(fmt::format("DistributedDataParallel: the module's parameters are on {}, but process "
                                        "group '{}' cannot all-reduce {} tensors (make the group with a backend for "
                                        "that device, e.g. \"auto\" or \"cpu:gloo,cuda:nccl\")",
                                        device, pg_->name(), device));
  control_ = controlDevice(*pg_, device);
  verifyParameters(names);
  broadcastState(0);
  ReducerOptions ro;
  ro.bucketCapMb = opts_.bucketCapMb;
  ro.firstBucketCapMb = opts_.firstBucketCapMb;
  ro.findUnusedParameters = opts_.findUnusedParameters;
  ro.staticGraph = opts_.staticGraph;
  ro.gradientAsBucketView = opts_.gradientAsBucketView;
  reducer_ = std::make_unique<Reducer>(params_, std::move(names), pg_, ro);
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::verifyParameters(const std::vector<std::string>& names) {
  // Every rank's description hashed and all-gathered: one small collective when models agree.
  std::string mine;
  for (size_t i = 0; i < params_.size(); ++i) mine += describeParam(names[i], params_[i]) + "\n";
  const uint64_t key = pg_->sequenceNumber();
  Tensor h = full({1}, static_cast<int64_t>(fnv1a(mine)), {.dtype = DType::Int64, .device = control_});
  Tensor all = empty({pg_->size()}, {.dtype = DType::Int64, .device = control_});
  pg_->allgatherIntoTensor(all, h)->wait();
  all = all.to(Device::cpu());
  const int64_t* hs = all.data<int64_t>();
  bool same = true;
  for (int r = 1; r < pg_->size(); ++r) same = same && hs[r] == hs[0];
  if (same) return;

  // They differ: every rank publishes its list and names the first difference from rank 0.
  auto& store = *pg_->store();
  const std::string prefix = fmt::format("ddp/verify/{}/", key);
  store.set(prefix + std::to_string(pg_->rank()), mine);
  std::vector<std::vector<std::string>> lists(pg_->size());
  for (int r = 0; r < pg_->size(); ++r) lists[r] = splitLines(store.getString(prefix + std::to_string(r)));
  std::string detail;
  for (int r = 1; r < pg_->size() && detail.empty(); ++r) {
    if (hs[r] == hs[0]) continue;
    const auto& a = lists[0];
    const auto& b = lists[r];
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    detail = fmt::format("parameter #{} is {} on rank 0 but {} on rank {}", i, i < a.size() ? a[i] : "absent",
                         i < b.size() ? b[i] : "absent", r);
    if (a.size() != b.size())
      detail += fmt::format(" (rank 0 has {} parameters, rank {} has {})", a.size(), r, b.size());
  }
  std::vector<int> differing;
  for (int r = 0; r < pg_->size(); ++r)
    if (hs[r] != hs[0]) differing.push_back(r);
  throw ValueError(fmt::format(
      "DistributedDataParallel in group '{}': the ranks' models differ: {}; ranks [{}] differ from rank 0. Every rank "
      "must build the same model (same parameter names, shapes and dtypes, in the same order)",
      pg_->name(), detail, fmt::join(differing, ", ")));
}

void DistributedDataParallel::broadcastState(int root) {
  std::vector<Tensor> state;
  for (const auto& [name, p] : module_->namedParameters()) state.push_back(p);
  for (const auto& [name, b] : module_->namedBuffers()) state.push_back(b);
  broadcastCoalesced(*pg_, state, root);
}

void DistributedDataParallel::broadcastBuffers(int root) {
  std::vector<Tensor> buffers = module_->buffers();
  if (!buffers.empty()) broadcastCoalesced(*pg_, buffers, root);
}

void DistributedDataParallel::registerCommHook(CommHookPtr hook) { reducer_->setCommHook(std::move(hook)); }

std::string DistributedDataParallel::extraRepr() const {
  return fmt::format("group='{}', world_size={}, buckets={}, comm_hook={}", pg_->name(), pg_->size(),
                     reducer_->numBuckets(), reducer_->commHook()->name());
}

DistributedDataParallel::JoinRound DistributedDataParallel::joinNotify(bool active, bool sync) {
  const int n = pg_->size();
  Tensor flags = zeros({n + 1}, {.dtype = DType::Int32});
  int32_t* f = flags.data<int32_t>();
  f[0] = active && sync ? 1 : 0;
  f[1 + pg_->rank()] = active ? 1 : 0;
  flags = flags.to(control_);  // the same tensor on the CPU
  pg_->allreduce(flags, {.op = ReduceOp::Sum})->wait();
  flags = flags.to(Device::cpu());
  f = flags.data<int32_t>();
  JoinRound round;
  round.sync = f[0] > 0;
  round.firstActive = -1;
  std::vector<int> activeRanks;
  for (int r = 0; r < n; ++r) {
    if (f[1 + r] == 0) continue;
    activeRanks.push_back(r);
    if (round.firstActive < 0) round.firstActive = r;
  }
  round.active = static_cast<int>(activeRanks.size());
  if (round.active > 0) join_->lastActive = std::move(activeRanks);
  if (join_->options.throwOnEarlyTermination && round.active < n) {
    std::vector<int> out;
    for (int r = 0; r < n; ++r)
      if (f[1 + r] == 0) out.push_back(r);
    throw DistError(fmt::format("DistributedDataParallel Join in group '{}': rank(s) [{}] ran out of inputs before "
                                "the others (throwOnEarlyTermination is set)",
                                pg_->name(), fmt::join(out, ", ")));
  }
  return round;
}

void DistributedDataParallel::joinShadowUntilAllJoined() {
  for (;;) {
    JoinRound round = joinNotify(false, false);
    if (round.active == 0) break;
    if (round.sync) reducer_->prepareForForward(true);
    if (opts_.broadcastBuffers) broadcastBuffers(round.firstActive);
    if (round.sync) reducer_->shadowBackward();
  }
  // Everyone has joined: the last joiners hold the newest model.
  int root = join_->lastActive.empty() ? 0 : join_->lastActive.front();
  broadcastState(root);
}

nn::TensorList DistributedDataParallel::forwardMulti(const nn::TensorList& inputs) {
  const bool sync = requireSync_ && autograd::isGradEnabled();
  int bufferRoot = 0;
  if (join_ && join_->options.enable) bufferRoot = joinNotify(true, sync).firstActive;
  reducer_->prepareForForward(sync);
  if (opts_.broadcastBuffers && pg_->size() > 1) broadcastBuffers(bufferRoot);
  nn::TensorList outputs = module_->call(inputs);
  reducer_->prepareForBackward(outputs, sync);
  return outputs;
}

// ---- Join ------------------------------------------------------------------------------------

Join::Join(DistributedDataParallel& ddp, JoinOptions options) : ddp_(ddp), opts_(options) {
  if (ddp_.join_) throw ValueError("dist::Join: this DistributedDataParallel is already inside a Join scope");
  ddp_.join_ = std::make_unique<DistributedDataParallel::JoinState>();
  ddp_.join_->options = opts_;
}

Join::~Join() { ddp_.join_.reset(); }

void Join::join() {
  if (joined_) throw ValueError("dist::Join::join() called twice");
  joined_ = true;
  if (!opts_.enable) return;
  ddp_.joinShadowUntilAllJoined();
}

}  // namespace cohort::dist
