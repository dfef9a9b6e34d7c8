// HierarchicalBackend: topology, inner backends, the worker, stages, failure handling, the ops
// handed to the flat backend, and registration (the staged algorithms are in hierarchical_ops.cc).
#include <cohort/distributed/hierarchical/hierarchical_backend.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/detail/coalesce.h>
#include <cohort/distributed/detail/op_queue.h>
#include <cohort/distributed/store/prefix_store.h>

namespace cohort::dist::hierarchical_backend {

COHORT_ENV_KNOB(kInterKnob, "COHORT_HIERARCHICAL_INTER", "gloo",
                "Backend the hierarchical backend uses across node leaders and for the ops it does not "
                "stage: gloo or mpi");

namespace {

std::string interBackendName() {
  std::string name = kInterKnob.str();
  if (name != "gloo" && name != "mpi") {
    throw ValueError(fmt::format("COHORT_HIERARCHICAL_INTER must be gloo or mpi, got '{}'", name));
  }
  return name;
}

}  // namespace

HierarchicalBackend::HierarchicalBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts)
    : Backend("hierarchical", rank, size), group_(opts.groupName), ops_(std::make_unique<OpQueue>(completionKey())) {
  std::vector<std::string> ids = opts.nodeIds;
  if (static_cast<int>(ids.size()) != size) {
    ids = exchangeNodeIds(*store, "node/", rank, size, localNodeId(opts.nodeId), opts.timeout);
  }
  layout_ = NodeLayout::fromIds(ids);
  if (!hasBackend("shm")) {
    throw NotSupportedError(
        fmt::format("backend hierarchical (group '{}') needs the shm backend, which this build lacks", group_));
  }
  const std::string inter = interBackendName();
  const int node = layout_.nodeOf[rank];
  const std::vector<int>& members = layout_.nodes[node];
  auto globalOf = [&](int r) { return r < static_cast<int>(opts.globalRanks.size()) ? opts.globalRanks[r] : r; };
  auto subOptions = [&](const std::string& suffix, const std::vector<int>& ranks) {
    BackendOptions o = opts;
    o.groupName = suffix.empty() ? opts.groupName : opts.groupName + "/" + suffix;
    o.globalRanks.clear();
    for (int r : ranks) o.globalRanks.push_back(globalOf(r));
    o.nodeIds.clear();
    return o;
  };
  std::vector<int> leaders, all;
  for (const auto& n : layout_.nodes) leaders.push_back(n[0]);
  for (int r = 0; r < size; ++r) all.push_back(r);
  intraName_ = fmt::format("node {} of group '{}' (ranks [{}])", node, group_, fmt::join(members, ", "));
  interName_ = fmt::format("the node leaders of group '{}' (ranks [{}])", group_, fmt::join(leaders, ", "));
  COHORT_LOG(Debug, "hierarchical backend of group '{}': rank {} on node '{}' ({}), {} node(s), leaders [{}]", group_,
             rank, ids[rank], intraName_, layout_.numNodes(), fmt::join(leaders, ", "));

  // Every rank creates its inner backends in the same order (intra, inter, flat), so the
  // rendezvous of one never waits on a rank stuck in another's.
  if (members.size() > 1) {
    intra_ =
        createBackend("shm", std::make_shared<PrefixStore>(fmt::format("node{}", node), store), layout_.localRank[rank],
                      static_cast<int>(members.size()), subOptions(fmt::format("node{}", node), members));
  }
  if (layout_.numNodes() > 1 && isLeader()) {
    inter_ = createBackend(inter, std::make_shared<PrefixStore>("leaders", store), node, layout_.numNodes(),
                           subOptions("leaders", leaders));
  }
  flat_ = createBackend(inter, std::make_shared<PrefixStore>("flat", store), rank, size, subOptions("", all));
}

HierarchicalBackend::~HierarchicalBackend() {
  ops_->stop();  // ops still queued fail: the group was destroyed before they ran
  intra_.reset();
  inter_.reset();
  flat_.reset();
}

// ---- the worker ------------------------------------------------------------------------------

void HierarchicalBackend::run(const WorkPtr& work, std::function<std::vector<Tensor>(const WorkPtr&)> body) {
  ops_->post(work, [this, work, b = std::move(body)] {
    std::string reason;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (broken_) reason = brokenReason_;
    }
    if (!reason.empty()) {
      work->fail(completionKey(),
                 std::make_exception_ptr(PeerError(fmt::format(
                     "{} failed: the hierarchical backend of group '{}' was aborted by an earlier error: {}",
                     work->describe(), group_, reason))));
      return;
    }
    std::vector<Tensor> outputs;
    std::exception_ptr error;
    try {
      outputs = b(work);
    } catch (const Failure& f) {
      // Tell the peers (abort every inner backend) before the diagnosis, which may read the store.
      breakWith(fmt::format("{} failed in {}", work->describe(), f.detail));
      error = f.kind == FailKind::Timeout ? work->timeoutError(f.detail)
              : f.kind == FailKind::Peer  ? work->peerError(f.detail)
                                          : work->distError(f.detail);
    } catch (const std::exception& e) {
      // A local failure half way through leaves the peers inside a stage: release them.
      breakWith(fmt::format("{} failed on rank {}: {}", work->describe(), rank(), e.what()));
      error = std::current_exception();
    }
    if (error) work->fail(completionKey(), error);
    else work->finish(completionKey(), std::move(outputs));
  });
}

void HierarchicalBackend::stage(const WorkPtr& outer, OpType op, const BackendPtr& inner, const std::string& stageName,
                                const std::function<void(const WorkPtr&)>& call) {
  const std::string& where = inner == intra_ ? intraName_ : interName_;
  // The inner Work ends when the op must: the stage gets what is left of the op's timeout.
  const std::string innerGroup =
      inner == intra_ ? fmt::format("{}/node{}", group_, layout_.nodeOf[rank()]) : group_ + "/leaders";
  auto w = std::make_shared<Work>(op, outer->sequenceNumber(), innerGroup, outer->remaining());
  // Weak: the inner backend's worker destroys this Work when its task ends, and a strong
  // reference here could make that the backend's last one, destroying the backend (and joining
  // its worker) on that very worker.
  w->setAbort(completionKey(), [weak = std::weak_ptr<Backend>(inner), d = outer->describe(), stageName] {
    if (auto b = weak.lock()) b->abort(fmt::format("{}: {} did not finish in time", d, stageName));
  });
  auto detail = [&](const std::exception& e) { return fmt::format("{} over {}: {}", stageName, where, e.what()); };
  try {
    try {
      call(w);
    } catch (...) {
      if (!w->isCompleted()) w->fail(completionKey(), std::current_exception());
    }
    w->wait();
  } catch (const TimeoutError& e) {
    throw Failure{FailKind::Timeout, detail(e)};
  } catch (const PeerError& e) {
    throw Failure{FailKind::Peer, detail(e)};
  } catch (const std::exception& e) {
    throw Failure{FailKind::Other, detail(e)};
  }
}

void HierarchicalBackend::breakWith(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return;
    broken_ = true;
    brokenReason_ = reason;
  }
  for (const BackendPtr& b : {intra_, inter_, flat_})
    if (b) b->abort(reason);
}

void HierarchicalBackend::abort(const std::string& reason) { breakWith(reason); }

// ---- staged ops: queue for the worker -------------------------------------------------------------

void HierarchicalBackend::allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) {
  run(work, [this, tensor, op = opts.op](const WorkPtr& w) mutable -> std::vector<Tensor> {
    allreduceStaged(tensor, op, w);
    return {tensor};
  });
}

void HierarchicalBackend::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts,
                                             const WorkPtr& work) {
  run(work, [this, tensors, op = opts.op](const WorkPtr& w) mutable -> std::vector<Tensor> {
    const detail::FlatLayout layout = detail::FlatLayout::of(tensors, "allreduce_coalesced");
    Tensor flat = detail::pack(tensors, layout);
    allreduceStaged(flat, op, w);
    detail::unpack(flat, tensors, layout);
    return tensors;
  });
}

void HierarchicalBackend::broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) {
  run(work, [this, tensor, root = opts.root](const WorkPtr& w) mutable -> std::vector<Tensor> {
    broadcastStaged(tensor, root, w);
    return {tensor};
  });
}

void HierarchicalBackend::reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) {
  run(work, [this, tensor, op = opts.op, root = opts.root](const WorkPtr& w) mutable -> std::vector<Tensor> {
    reduceStaged(tensor, op, root, w);
    return {tensor};
  });
}

void HierarchicalBackend::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& /*opts*/,
                                    const WorkPtr& work) {
  run(work, [this, outputs, input](const WorkPtr& w) mutable -> std::vector<Tensor> {
    const int64_t n = input.numel();
    Tensor full = empty({size() * n}, TensorOptions{.dtype = input.dtype()});
    allgatherStaged(full, input, w);
    for (int q = 0; q < size(); ++q)
      if (n) outputs[q].view({-1}).copy_(full.narrow(0, q * n, n));
    return outputs;
  });
}

void HierarchicalBackend::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& /*opts*/,
                                              const WorkPtr& work) {
  run(work, [this, output, input](const WorkPtr& w) mutable -> std::vector<Tensor> {
    Tensor full = output.view({-1});
    allgatherStaged(full, input, w);
    return {output};
  });
}

// ---- everything else: the flat backend completes the group's Work itself ------------------------

void HierarchicalBackend::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs,
                                             const std::vector<Tensor>& inputs, const AllgatherOptions& opts,
                                             const WorkPtr& work) {
  flat_->allgatherCoalesced(outputs, inputs, opts, work);
}
void HierarchicalBackend::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                                        const WorkPtr& work) {
  flat_->reduceScatter(output, inputs, opts, work);
}
void HierarchicalBackend::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                              const WorkPtr& work) {
  flat_->reduceScatterTensor(output, input, opts, work);
}
void HierarchicalBackend::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts,
                                   const WorkPtr& work) {
  flat_->alltoall(output, input, opts, work);
}
void HierarchicalBackend::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                       const AlltoallOptions& opts, const WorkPtr& work) {
  flat_->alltoallList(outputs, inputs, opts, work);
}
void HierarchicalBackend::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                                 const WorkPtr& work) {
  flat_->gather(outputs, input, opts, work);
}
void HierarchicalBackend::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                                  const WorkPtr& work) {
  flat_->scatter(output, inputs, opts, work);
}
void HierarchicalBackend::barrier(const BarrierOptions& opts, const WorkPtr& work) { flat_->barrier(opts, work); }
void HierarchicalBackend::send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) {
  flat_->send(tensor, dst, opts, work);
}
void HierarchicalBackend::recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) {
  flat_->recv(tensor, src, opts, work);
}

// ---- registration --------------------------------------------------------------------------

namespace {
const bool kRegistered = [] {
  registerBackend("hierarchical",
                  [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
                    return std::make_shared<HierarchicalBackend>(store, rank, size, opts);
                  });
  return true;
}();
}  // namespace

}  // namespace cohort::dist::hierarchical_backend
