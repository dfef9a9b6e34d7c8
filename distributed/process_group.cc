#include <cohort/distributed/process_group.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/debug/consistency_check.h>
#include <cohort/distributed/debug/detail/hang_diagnosis.h>
#include <cohort/distributed/debug/detail/progress_publisher.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/detail/op_args.h>
#include <cohort/distributed/store/prefix_store.h>
#include <cohort/distributed/topology.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kDebugKnob, "COHORT_DEBUG", "OFF",
                "Collective debugging: OFF, INFO, or DETAIL (cross-rank check of every collective's arguments)");

COHORT_ENV_KNOB(kRecorderEntriesKnob, "COHORT_FLIGHT_RECORDER_ENTRIES", "2000",
                "Operations each process group's flight recorder keeps (0 disables it); overrides "
                "ProcessGroupOptions::flightRecorderEntries when set");
// At most 10 million entries (a few GB of ring): a bigger value is a typo, not a wish.
constexpr int64_t kMaxRecorderEntries = 10'000'000;

DebugLevel debugLevelFromEnv() {
  auto raw = kDebugKnob.raw();
  if (!raw) return DebugLevel::Off;
  std::string v = *raw;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  if (v == "OFF" || v == "0") return DebugLevel::Off;
  if (v == "INFO") return DebugLevel::Info;
  if (v == "DETAIL") return DebugLevel::Detail;
  throw ValueError(fmt::format("COHORT_DEBUG must be OFF, INFO or DETAIL, got '{}'", *raw));
}

// ---- construction --------------------------------------------------------------------------

std::shared_ptr<ProcessGroup> ProcessGroup::create(StorePtr store, int rank, int size, ProcessGroupOptions opts) {
  if (!store) throw ValueError("ProcessGroup::create: store is null");
  if (size < 1) throw ValueError(fmt::format("ProcessGroup::create: size must be >= 1, got {}", size));
  if (rank < 0 || rank >= size) {
    throw ValueError(fmt::format("ProcessGroup::create: rank {} is out of range for size {}", rank, size));
  }
  std::vector<int> global(size);
  for (int i = 0; i < size; ++i) global[i] = i;
  auto prefixed = std::make_shared<PrefixStore>(opts.name, std::move(store));
  std::shared_ptr<ProcessGroup> pg(
      new ProcessGroup(std::move(prefixed), rank, size, std::move(opts), std::move(global)));
  pg->initBackends();
  return pg;
}

ProcessGroup::ProcessGroup(StorePtr store, int rank, int size, ProcessGroupOptions opts, std::vector<int> globalRanks)
    : store_(std::move(store)), rank_(rank), size_(size), opts_(std::move(opts)), globalRanks_(std::move(globalRanks)) {
  if (kDebugKnob.raw()) opts_.debug = debugLevelFromEnv();
  if (kRecorderEntriesKnob.raw()) {
    const int64_t n = kRecorderEntriesKnob.integer();
    if (n < 0 || n > kMaxRecorderEntries) {
      throw ValueError(
          fmt::format("COHORT_FLIGHT_RECORDER_ENTRIES must be between 0 and {}, got {}", kMaxRecorderEntries, n));
    }
    opts_.flightRecorderEntries = static_cast<size_t>(n);
  }
  if (opts_.timeout.count() <= 0) {
    throw ValueError(
        fmt::format("process group '{}': timeout must be positive, got {} ms", opts_.name, opts_.timeout.count()));
  }
  recorder_ = std::make_shared<FlightRecorder>(opts_.name, opts_.flightRecorderEntries);
  progress_ = std::make_shared<ProgressPublisher>(store_, rank_);
  diagnoser_ = std::make_shared<HangDiagnoser>(store_, rank_, size_, globalRanks_, progress_);
  observer_ = std::make_shared<GroupWorkObserver>(diagnoser_, progress_, recorder_);
}

ProcessGroup::~ProcessGroup() {
  // Works failed from here on (by the backends, below) get no diagnosis: the group is going away.
  diagnoser_.reset();
  // Backends first: their threads complete pending Works, whose callbacks touch progress_.
  backends_.clear();
  progress_.reset();
}

// The CPU backend "auto" stands for: shm on one node, hierarchical across nodes when some node
// has several ranks, else gloo.
std::string ProcessGroup::chooseCpuBackend(const std::vector<std::string>& nodeIds) const {
  const NodeLayout layout = NodeLayout::fromIds(nodeIds);
  const bool oneNode = layout.numNodes() == 1;
  const bool sharedNode = layout.maxNodeSize() > 1;
  std::string name, why;
  if (oneNode && hasBackend("shm")) {
    name = "shm";
    why = "every rank is on one node";
  } else if (!oneNode && sharedNode && hasBackend("hierarchical")) {
    name = "hierarchical";
    why = "several nodes, some with several ranks";
  } else if (hasBackend("gloo")) {
    name = "gloo";
    why = oneNode ? "every rank is on one node, but this build has no shm backend"
                  : (sharedNode ? "several nodes, but this build has no hierarchical backend" : "one rank per node");
  } else {
    auto names = availableBackends();
    throw NotSupportedError(
        fmt::format("process group '{}': backend \"auto\" needs gloo, which this build lacks (available: {})",
                    opts_.name, names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
  }
  if (rank_ == 0) {
    COHORT_LOG(Info, "process group '{}': backend auto chose {} for CPU tensors: {} ({} ranks on {} nodes)", opts_.name,
               name, why, size_, layout.numNodes());
  }
  return name;
}

// Which backend serves which device, from ProcessGroupOptions::backend (as c10d's
// init_process_group): "auto" (CPU: chooseCpuBackend; CUDA: nccl when built), one registered name
// (it serves every device type it supports: "gloo" CPU tensors, "nccl" CUDA tensors only, as
// c10d's "nccl"), or a list "cpu:gloo,cuda:nccl" (each device type at most once; a name there may
// be "auto" for the CPU's choice).
void ProcessGroup::initBackends() {
  const std::string& spec = opts_.backend;
  std::vector<std::pair<std::optional<DeviceType>, std::string>> wanted;  // nullopt: whatever it serves
  if (spec.find(':') != std::string::npos) {
    std::set<DeviceType> seen;
    std::istringstream in(spec);
    std::string item;
    while (std::getline(in, item, ',')) {
      const size_t colon = item.find(':');
      const std::string dev = colon == std::string::npos ? "" : item.substr(0, colon);
      const std::string name = colon == std::string::npos ? "" : item.substr(colon + 1);
      DeviceType type;
      if (dev == "cpu") {
        type = DeviceType::CPU;
      } else if (dev == "cuda") {
        type = DeviceType::CUDA;
      } else {
        throw ValueError(fmt::format("process group '{}': backend \"{}\": each entry must be cpu:<backend> or "
                                     "cuda:<backend>, got \"{}\"",
                                     opts_.name, spec, item));
      }
      if (name.empty() || !seen.insert(type).second) {
        throw ValueError(
            fmt::format("process group '{}': backend \"{}\": {} must name one backend, once", opts_.name, spec, dev));
      }
      wanted.emplace_back(type, name);
    }
  } else if (spec == "auto") {
    wanted.emplace_back(DeviceType::CPU, "auto");
    // As c10d's default: CUDA tensors go to NCCL when this build has it. The backend makes its
    // communicator at the first CUDA op, so a CPU-only job pays nothing for it.
    if (hasBackend("nccl")) wanted.emplace_back(DeviceType::CUDA, "nccl");
  } else {
    wanted.emplace_back(std::nullopt, spec);
  }

  std::vector<std::string> nodeIds;
  const bool needNodes = std::any_of(wanted.begin(), wanted.end(),
                                     [](const auto& w) { return w.second == "auto" || w.second == "hierarchical"; });
  if (needNodes) {
    nodeIds = exchangeNodeIds(*store_, "node/", rank_, size_, localNodeId(opts_.nodeId), opts_.timeout);
  }
  for (auto& [type, requested] : wanted) {
    std::string name = requested == "auto" ? chooseCpuBackend(nodeIds) : requested;
    BackendOptions bo;
    bo.groupName = opts_.name;
    bo.timeout = opts_.timeout;
    bo.globalRanks = globalRanks_;
    bo.nodeId = opts_.nodeId;
    bo.nodeIds = nodeIds;
    bo.groupStore = store_;
    auto backendStore = std::make_shared<PrefixStore>("backend/" + name, store_);
    BackendPtr b = createBackend(name, backendStore, rank_, size_, bo);
    if (type) {
      setBackend(*type, std::move(b));
      continue;
    }
    bool any = false;
    for (DeviceType t : {DeviceType::CPU, DeviceType::CUDA}) {
      if (b->supportsDevice(t)) {
        backends_[t] = b;
        any = true;
      }
    }
    if (!any) throw ValueError(fmt::format("process group '{}': backend {} serves no device", opts_.name, name));
  }
}

void ProcessGroup::setBackend(DeviceType type, BackendPtr backend) {
  COHORT_CHECK(backend != nullptr, "ProcessGroup::setBackend: null backend");
  if (!backend->supportsDevice(type)) {
    throw ValueError(fmt::format("process group '{}': backend {} does not serve {} tensors", opts_.name,
                                 backend->name(), Device(type, 0)));
  }
  backends_[type] = std::move(backend);
}

Backend& ProcessGroup::backend(DeviceType type) const {
  auto it = backends_.find(type);
  if (it == backends_.end()) {
    std::vector<std::string> have;
    for (const auto& [t, b] : backends_) have.push_back(fmt::format("{}: {}", Device(t, 0), b->name()));
    throw NotSupportedError(fmt::format("process group '{}' has no backend for {} tensors (it has {})", opts_.name,
                                        Device(type, 0), fmt::join(have, ", ")));
  }
  return *it->second;
}

bool ProcessGroup::supports(OpType op, DeviceType type) const {
  auto it = backends_.find(type);
  return it != backends_.end() && it->second->supports(op);
}

const BackendPtr& ProcessGroup::backendFor(OpType op, DeviceType device) const {
  auto it = backends_.find(device);
  if (it == backends_.end()) backend(device);  // throws NotSupportedError naming what the group has
  const BackendPtr& b = it->second;
  if (!b->supports(op)) {
    throw NotSupportedError(fmt::format("backend {} does not support {}", b->name(), opTypeName(op)));
  }
  return b;
}

// ---- work bookkeeping ----------------------------------------------------------------------

namespace {
// Bytes of the tensors an op's flight-recorder text describes ("[4, 8] float32; [3] int64").
int64_t bytesOfShapes(std::string_view text) {
  int64_t total = 0;
  while (!text.empty()) {
    size_t end = text.find("; ");
    std::string_view item = text.substr(0, end);
    size_t close = item.find(']');
    if (item.starts_with('[') && close != std::string_view::npos) {
      int64_t numel = 1;
      std::string_view dims = item.substr(1, close - 1);
      while (!dims.empty()) {
        size_t comma = dims.find(", ");
        std::string_view d = dims.substr(0, comma);
        int64_t v = 0;
        std::from_chars(d.data(), d.data() + d.size(), v);
        numel *= v;
        if (comma == std::string_view::npos) break;
        dims = dims.substr(comma + 2);
      }
      std::string_view dt = item.substr(close + 1);
      while (dt.starts_with(' ')) dt.remove_prefix(1);
      try {
        total += numel * static_cast<int64_t>(elementSize(dtypeFromName(std::string(dt))));
      } catch (const ValueError&) {
      }
    }
    if (end == std::string_view::npos) break;
    text = text.substr(end + 2);
  }
  return total;
}
}  // namespace

WorkPtr ProcessGroup::startWork(OpType op, Millis timeout, RecordFn record, FingerprintFn fingerprint,
                                std::string p2pLabel) {
  Millis t = timeout.count() < 0 ? opts_.timeout : timeout;
  if (t.count() == 0)
    throw ValueError(fmt::format("{} in group '{}': timeout must be positive", opTypeName(op), opts_.name));
  bool collective = p2pLabel.empty();
  uint64_t seq = collective ? ++seq_ : 0;
  const auto start = std::chrono::steady_clock::now();  // one reading for the Work and its entry
  auto work = std::make_shared<Work>(op, seq, opts_.name, t, start);
  uint64_t entry;
  if (collective) {
    entry = recorder_->recordInPlace(seq, op, record, start);
  } else {
    entry = recorder_->recordInPlace(
        seq, op,
        [&](std::string& shapes, std::string& detail) {
          std::string unused;
          record(shapes, unused);
          detail = p2pLabel;
        },
        start);
    work->setLabel(Work::CompletionKey(), std::move(p2pLabel));
  }
  work->setObserver(Work::CompletionKey(), observer_, entry);
  if (profiler::detail::active()) [[unlikely]] {
    auto p = std::make_unique<Work::Profiled>();
    p->startNs = profiler::detail::nowNs();
    p->rank = rank_;
    record(p->shapes, p->detail);
    p->bytes = bytesOfShapes(p->shapes);
    work->setProfiled(Work::CompletionKey(), std::move(p));
  }
  if (collective) progress_->markStarted(seq);
  if (collective && opts_.debug == DebugLevel::Detail && fingerprint) {
    try {
      checkCollectiveConsistency(*store_, opts_.name, rank_, size_, seq, fingerprint(), t);
    } catch (...) {
      work->fail(Work::CompletionKey(), std::current_exception());
      throw;
    }
  }
  return work;
}

template <typename F>
WorkPtr ProcessGroup::launch(const WorkPtr& work, const BackendPtr& backend, F&& call) {
  // When wait() gives up, the backend stops its transport so no thread stays blocked.
  work->setAbortBackend(Work::CompletionKey(), backend);
  if (Work::Profiled* p = work->profiled(Work::CompletionKey())) [[unlikely]]
    p->backend = backend->name();
  try {
    call();
  } catch (...) {
    if (!work->isCompleted()) work->fail(Work::CompletionKey(), std::current_exception());
    throw;
  }
  return work;
}

using op_args::appendShapes;
using op_args::Checker;
using op_args::fp;
using op_args::fpDtypeOnly;
using op_args::rankName;
using op_args::reduceDetail;
using op_args::rootDetail;

// ---- collectives ---------------------------------------------------------------------------

WorkPtr ProcessGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  Checker c(OpType::Allreduce, opts_.name);
  c.tensor(tensor, "tensor");
  c.reduction(opts.op, tensor);
  const BackendPtr& b = backendFor(OpType::Allreduce, tensor.device().type());
  auto work = startWork(
      OpType::Allreduce, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, tensor);
        reduceDetail(d, opts.op);
      },
      [&] { return fp(OpType::Allreduce, {tensor}, opts.op)(); });
  return launch(work, b, [&] { b->allreduce(tensor, opts, work); });
}

WorkPtr ProcessGroup::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts) {
  Checker c(OpType::AllreduceCoalesced, opts_.name);
  if (tensors.empty()) c.fail("needs at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    c.tensor(tensors[i], fmt::format("tensor {}", i));
    if (i) c.sameDtype(tensors[i], tensors[0], fmt::format("tensor {}", i), "tensor 0");
  }
  c.reduction(opts.op, tensors[0]);
  const BackendPtr& b = backendFor(OpType::AllreduceCoalesced, tensors[0].device().type());
  auto work = startWork(
      OpType::AllreduceCoalesced, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, tensors);
        reduceDetail(d, opts.op);
      },
      [&] { return fp(OpType::AllreduceCoalesced, tensors, opts.op)(); });
  return launch(work, b, [&] { b->allreduceCoalesced(tensors, opts, work); });
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  Checker c(OpType::Broadcast, opts_.name);
  c.tensor(tensor, "tensor");
  c.rank(opts.root, size_, "root");
  const BackendPtr& b = backendFor(OpType::Broadcast, tensor.device().type());
  auto work = startWork(
      OpType::Broadcast, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, tensor);
        d = rootDetail(opts.root);
      },
      [&] { return fp(OpType::Broadcast, {tensor}, std::nullopt, opts.root)(); });
  return launch(work, b, [&] { b->broadcast(tensor, opts, work); });
}

WorkPtr ProcessGroup::reduce(Tensor& tensor, const ReduceOptions& opts) {
  Checker c(OpType::Reduce, opts_.name);
  c.tensor(tensor, "tensor");
  c.rank(opts.root, size_, "root");
  c.reduction(opts.op, tensor);
  const BackendPtr& b = backendFor(OpType::Reduce, tensor.device().type());
  auto work = startWork(
      OpType::Reduce, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, tensor);
        reduceDetail(d, opts.op);
        d += " " + rootDetail(opts.root);
      },
      [&] { return fp(OpType::Reduce, {tensor}, opts.op, opts.root)(); });
  return launch(work, b, [&] { b->reduce(tensor, opts, work); });
}

WorkPtr ProcessGroup::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts) {
  Checker c(OpType::Allgather, opts_.name);
  c.tensor(input, "input");
  c.count(outputs.size(), size_, "output tensors");
  for (size_t i = 0; i < outputs.size(); ++i) c.like(outputs[i], input, fmt::format("output {}", i), "the input");
  const BackendPtr& b = backendFor(OpType::Allgather, input.device().type());
  auto work = startWork(
      OpType::Allgather, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, input); },
      [&] { return fp(OpType::Allgather, {input})(); });
  return launch(work, b, [&] { b->allgather(outputs, input, opts, work); });
}

WorkPtr ProcessGroup::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts) {
  Checker c(OpType::AllgatherIntoTensor, opts_.name);
  c.tensor(input, "input");
  c.tensor(output, "output");
  c.sameDtype(output, input, "the output", "the input");
  if (output.numel() != input.numel() * size_) {
    c.fail(fmt::format("output {} must hold {} x input {} = {} elements, has {}", shapeStr(output.sizes()), size_,
                       shapeStr(input.sizes()), input.numel() * size_, output.numel()));
  }
  const BackendPtr& b = backendFor(OpType::AllgatherIntoTensor, input.device().type());
  auto work = startWork(
      OpType::AllgatherIntoTensor, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, output, input); },
      [&] {
        return fp(OpType::AllgatherIntoTensor, {output, input})();
      });
  return launch(work, b, [&] { b->allgatherIntoTensor(output, input, opts, work); });
}

WorkPtr ProcessGroup::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                         const AllgatherOptions& opts) {
  Checker c(OpType::AllgatherCoalesced, opts_.name);
  if (inputs.empty()) c.fail("needs at least one input tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.tensor(inputs[i], fmt::format("input {}", i));
    if (i) c.sameDtype(inputs[i], inputs[0], fmt::format("input {}", i), "input 0");
  }
  c.count(outputs.size(), size_, "output lists");
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      c.fail(fmt::format("output list {} has {} tensors, expected {} (one per input)", r, outputs[r].size(),
                         inputs.size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      c.like(outputs[r][i], inputs[i], fmt::format("output {} of rank {}", i, r), fmt::format("input {}", i));
    }
  }
  const BackendPtr& b = backendFor(OpType::AllgatherCoalesced, inputs[0].device().type());
  auto work = startWork(
      OpType::AllgatherCoalesced, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, inputs); },
      [&] { return fp(OpType::AllgatherCoalesced, inputs)(); });
  return launch(work, b, [&] { b->allgatherCoalesced(outputs, inputs, opts, work); });
}

WorkPtr ProcessGroup::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts) {
  Checker c(OpType::ReduceScatter, opts_.name);
  c.tensor(output, "output");
  c.count(inputs.size(), size_, "input tensors");
  for (size_t i = 0; i < inputs.size(); ++i) c.like(inputs[i], output, fmt::format("input {}", i), "the output");
  c.reduction(opts.op, output);
  const BackendPtr& b = backendFor(OpType::ReduceScatter, output.device().type());
  auto work = startWork(
      OpType::ReduceScatter, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, output);
        reduceDetail(d, opts.op);
      },
      [&] { return fp(OpType::ReduceScatter, {output}, opts.op)(); });
  return launch(work, b, [&] { b->reduceScatter(output, inputs, opts, work); });
}

WorkPtr ProcessGroup::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts) {
  Checker c(OpType::ReduceScatterTensor, opts_.name);
  c.tensor(output, "output");
  c.tensor(input, "input");
  c.sameDtype(input, output, "the input", "the output");
  if (input.numel() != output.numel() * size_) {
    c.fail(fmt::format("input {} must hold {} x output {} = {} elements, has {}", shapeStr(input.sizes()), size_,
                       shapeStr(output.sizes()), output.numel() * size_, input.numel()));
  }
  c.reduction(opts.op, output);
  const BackendPtr& b = backendFor(OpType::ReduceScatterTensor, output.device().type());
  auto work = startWork(
      OpType::ReduceScatterTensor, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, output, input);
        reduceDetail(d, opts.op);
      },
      [&] {
        return fp(OpType::ReduceScatterTensor, {output, input}, opts.op)();
      });
  return launch(work, b, [&] { b->reduceScatterTensor(output, input, opts, work); });
}

WorkPtr ProcessGroup::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts) {
  bool uneven = !opts.inputSplitSizes.empty() || !opts.outputSplitSizes.empty();
  OpType op = uneven ? OpType::AlltoallV : OpType::Alltoall;
  Checker c(op, opts_.name);
  c.tensor(input, "input");
  c.tensor(output, "output");
  c.sameDtype(output, input, "the output", "the input");
  auto rows = [&](const Tensor& t, const char* what) -> int64_t {
    if (t.dim() == 0) c.fail(fmt::format("{} must have at least one dimension (splits are along dim 0)", what));
    return t.size(0);
  };
  int64_t inRows = rows(input, "the input"), outRows = rows(output, "the output");
  auto checkSplits = [&](const std::vector<int64_t>& splits, int64_t total, const char* what) {
    if (splits.empty()) {
      if (total % size_ != 0) {
        c.fail(fmt::format("{} has {} rows along dim 0, not divisible by the group size {}", what, total, size_));
      }
      return;
    }
    c.count(splits.size(), size_, fmt::format("{} split sizes", what));
    int64_t sum = 0;
    for (int64_t s : splits) {
      if (s < 0) c.fail(fmt::format("{} split sizes must be non-negative, got [{}]", what, fmt::join(splits, ", ")));
      sum += s;
    }
    if (sum != total) {
      c.fail(fmt::format("{} split sizes [{}] add up to {}, but dim 0 has {} rows", what, fmt::join(splits, ", "), sum,
                         total));
    }
  };
  checkSplits(opts.inputSplitSizes, inRows, "input");
  checkSplits(opts.outputSplitSizes, outRows, "output");
  if (!uneven && input.numel() != output.numel()) {
    c.fail(fmt::format("input {} and output {} must have the same number of elements", shapeStr(input.sizes()),
                       shapeStr(output.sizes())));
  }
  auto rowShape = [](const Tensor& t) { return Shape(t.sizes().begin() + 1, t.sizes().end()); };
  if (rowShape(input) != rowShape(output)) {
    c.fail(fmt::format("input {} and output {} must agree beyond dim 0", shapeStr(input.sizes()),
                       shapeStr(output.sizes())));
  }
  const BackendPtr& b = backendFor(op, input.device().type());
  auto work = startWork(
      op, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, output, input); },
      [&] {
        return (uneven ? fpDtypeOnly(op, input) : fp(op, {output, input}))();
      });
  return launch(work, b, [&] { b->alltoall(output, input, opts, work); });
}

WorkPtr ProcessGroup::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                   const AlltoallOptions& opts) {
  Checker c(OpType::AlltoallList, opts_.name);
  // The list form's splits are its tensors: split sizes given as well would be ignored.
  if (!opts.inputSplitSizes.empty() || !opts.outputSplitSizes.empty()) {
    c.fail("split sizes apply to alltoall on one tensor; alltoallList sends inputs[i] to rank i and receives "
           "outputs[i] from it, so each tensor's size is its split (leave inputSplitSizes and outputSplitSizes "
           "empty)");
  }
  c.count(inputs.size(), size_, "input tensors");
  c.count(outputs.size(), size_, "output tensors");
  for (int i = 0; i < size_; ++i) {
    c.tensor(inputs[i], fmt::format("input {}", i));
    c.tensor(outputs[i], fmt::format("output {}", i));
    c.sameDtype(inputs[i], inputs[0], fmt::format("input {}", i), "input 0");
    c.sameDtype(outputs[i], inputs[0], fmt::format("output {}", i), "input 0");
  }
  const BackendPtr& b = backendFor(OpType::AlltoallList, inputs[0].device().type());
  auto work = startWork(
      OpType::AlltoallList, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, inputs); },
      [&] { return fpDtypeOnly(OpType::AlltoallList, inputs[0])(); });
  return launch(work, b, [&] { b->alltoallList(outputs, inputs, opts, work); });
}

WorkPtr ProcessGroup::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts) {
  Checker c(OpType::Gather, opts_.name);
  c.tensor(input, "input");
  c.rank(opts.root, size_, "root");
  if (rank_ == opts.root) {
    c.count(outputs.size(), size_, "output tensors on the root");
    for (size_t i = 0; i < outputs.size(); ++i) c.like(outputs[i], input, fmt::format("output {}", i), "the input");
  }
  const BackendPtr& b = backendFor(OpType::Gather, input.device().type());
  auto work = startWork(
      OpType::Gather, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, input);
        d = rootDetail(opts.root);
      },
      [&] { return fp(OpType::Gather, {input}, std::nullopt, opts.root)(); });
  return launch(work, b, [&] { b->gather(outputs, input, opts, work); });
}

WorkPtr ProcessGroup::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts) {
  Checker c(OpType::Scatter, opts_.name);
  c.tensor(output, "output");
  c.rank(opts.root, size_, "root");
  if (rank_ == opts.root) {
    c.count(inputs.size(), size_, "input tensors on the root");
    for (size_t i = 0; i < inputs.size(); ++i) c.like(inputs[i], output, fmt::format("input {}", i), "the output");
  }
  const BackendPtr& b = backendFor(OpType::Scatter, output.device().type());
  auto work = startWork(
      OpType::Scatter, opts.timeout,
      [&](std::string& s, std::string& d) {
        appendShapes(s, output);
        d = rootDetail(opts.root);
      },
      [&] { return fp(OpType::Scatter, {output}, std::nullopt, opts.root)(); });
  return launch(work, b, [&] { b->scatter(output, inputs, opts, work); });
}

Tensor ProcessGroup::allocateCommBuffer(const Shape& sizes, DType dtype, Device device) {
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t d) { return d < 0; }))
    throw ValueError(
        fmt::format("allocateCommBuffer in group '{}': negative size in shape {}", opts_.name, shapeStr(sizes)));
  if (!device.isCpu()) {
    backend(device.type());  // NotSupportedError naming the device when this group cannot reach it
    return zeros(sizes, {.dtype = dtype, .device = device});
  }
  return backend(DeviceType::CPU).allocateCommBuffer(sizes, dtype, opts_.timeout);
}

WorkPtr ProcessGroup::barrier(const BarrierOptions& opts) {
  // The CPU backend when there is one (the host waits at a barrier either way); a group with only
  // a CUDA backend ("nccl") runs it there, as c10d does (a one-element allreduce).
  const DeviceType where =
      backends_.count(DeviceType::CPU) || backends_.empty() ? DeviceType::CPU : backends_.begin()->first;
  const BackendPtr& b = backendFor(OpType::Barrier, where);
  auto work = startWork(
      OpType::Barrier, opts.timeout, [](std::string&, std::string&) {}, [&] { return fp(OpType::Barrier, {})(); });
  return launch(work, b, [&] { b->barrier(opts, work); });
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, const SendRecvOptions& opts) {
  Checker c(OpType::Send, opts_.name);
  c.tensor(tensor, "tensor");
  c.rank(dst, size_, "destination rank");
  if (dst == rank_) c.fail(fmt::format("rank {} cannot send to itself", rank_));
  if (opts.tag < 0) c.fail(fmt::format("tag must be non-negative, got {}", opts.tag));
  const BackendPtr& b = backendFor(OpType::Send, tensor.device().type());
  auto work = startWork(
      OpType::Send, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, tensor); }, {},
      fmt::format("to rank {}, tag {}", rankName(dst, globalRanks_), opts.tag));
  return launch(work, b, [&] { b->send(tensor, dst, opts, work); });
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, const SendRecvOptions& opts) {
  Checker c(OpType::Recv, opts_.name);
  c.tensor(tensor, "tensor");
  c.rank(src, size_, "source rank");
  if (src == rank_) c.fail(fmt::format("rank {} cannot receive from itself", rank_));
  if (opts.tag < 0) c.fail(fmt::format("tag must be non-negative, got {}", opts.tag));
  const BackendPtr& b = backendFor(OpType::Recv, tensor.device().type());
  auto work = startWork(
      OpType::Recv, opts.timeout, [&](std::string& s, std::string&) { appendShapes(s, tensor); }, {},
      fmt::format("from rank {}, tag {}", rankName(src, globalRanks_), opts.tag));
  return launch(work, b, [&] { b->recv(tensor, src, opts, work); });
}

// ---- subgroups -----------------------------------------------------------------------------

std::shared_ptr<ProcessGroup> ProcessGroup::makeSubgroup(const std::string& prefix, const std::vector<int>& parentRanks,
                                                         int subRank, ProcessGroupOptions opts) {
  if (opts.name == "world") opts.name = opts_.name + "/" + prefix;
  if (opts.backend == "auto") opts.backend = opts_.backend;
  if (opts.nodeId.empty()) opts.nodeId = opts_.nodeId;
  std::vector<int> global;
  for (int r : parentRanks) global.push_back(globalRanks_[r]);
  auto store = std::make_shared<PrefixStore>(prefix, store_);
  std::shared_ptr<ProcessGroup> pg(new ProcessGroup(std::move(store), subRank, static_cast<int>(parentRanks.size()),
                                                    std::move(opts), std::move(global)));
  pg->initBackends();
  return pg;
}

std::shared_ptr<ProcessGroup> ProcessGroup::newGroup(const std::vector<int>& ranks, ProcessGroupOptions opts) {
  uint64_t k = ++subgroupCounter_;
  if (ranks.empty()) throw ValueError(fmt::format("newGroup in group '{}': ranks is empty", opts_.name));
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_) {
      throw ValueError(
          fmt::format("newGroup in group '{}': rank {} is out of range for a group of size {} (ranks [{}])", opts_.name,
                      r, size_, fmt::join(ranks, ", ")));
    }
    if (!seen.insert(r).second) {
      throw ValueError(fmt::format("newGroup in group '{}': rank {} is listed twice (ranks [{}])", opts_.name, r,
                                   fmt::join(ranks, ", ")));
    }
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = it != ranks.end();
  const int subRank = member ? static_cast<int>(it - ranks.begin()) : -1;
  auto sub = member ? makeSubgroup(fmt::format("sub{}", k), ranks, subRank, std::move(opts)) : nullptr;
  splitBackends(member ? 0 : -1, subRank, sub.get());
  return sub;
}

void ProcessGroup::splitBackends(int color, int key, ProcessGroup* sub) {
  for (const auto& [type, b] : backends_) {
    Backend* child = nullptr;
    if (sub) {
      auto c = sub->backends_.find(type);
      if (c != sub->backends_.end()) child = c->second.get();
    }
    b->splitInto(color, key, child);
  }
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, ProcessGroupOptions opts) {
  uint64_t k = ++subgroupCounter_;
  const std::string base = fmt::format("split{}/", k);
  store_->set(base + std::to_string(rank_), fmt::format("{} {}", color, key));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(base + std::to_string(r));
  store_->wait(keys, opts_.timeout);
  if (color < 0) {
    splitBackends(-1, -1, nullptr);
    return nullptr;
  }
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int r = 0; r < size_; ++r) {
    std::istringstream in(store_->getString(keys[r]));
    int c = 0, kk = 0;
    in >> c >> kk;
    if (c == color) members.emplace_back(kk, r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  int subRank = -1;
  for (auto [kk, r] : members) {
    if (r == rank_) subRank = static_cast<int>(ranks.size());
    ranks.push_back(r);
  }
  auto sub = makeSubgroup(fmt::format("sub{}c{}", k, color), ranks, subRank, std::move(opts));
  splitBackends(color, subRank, sub.get());
  return sub;
}

}  // namespace cohort::dist
