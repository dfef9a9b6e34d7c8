#include <cohort/distributed/watchdog/comm_backend.h>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::dist {

namespace {
WatchdogOptions watchdogOptions(const StorePtr& store, int rank, int size, const BackendOptions& opts) {
  WatchdogOptions w;
  w.group = opts.groupName;
  w.rank = rank;
  w.size = size;
  w.globalRanks = opts.globalRanks;
  w.store = store;
  w.groupStore = opts.groupStore;
  w.killOnFailure = watchdogKillFromEnv();
  return w;
}

void* advance(void* p, size_t elems, DType dtype) {
  return p ? static_cast<uint8_t*>(p) + elems * elementSize(dtype) : nullptr;
}
}  // namespace

CommBackend::CommBackend(std::string name, const StorePtr& store, int rank, int size, const BackendOptions& opts)
    : Backend(std::move(name), rank, size), group_(opts.groupName),
      watchdog_(std::make_unique<Watchdog>(completionKey(), watchdogOptions(store, rank, size, opts))) {}

CommBackend::~CommBackend() {
  if (watchdog_) watchdog_->stop(Millis(0));
}

void CommBackend::stopWatchdog(Millis drain) {
  if (watchdog_) watchdog_->stop(drain);
}

void CommBackend::abort(const std::string& reason) { watchdog_->abortAll(reason); }

CommOp CommBackend::op(CommOpKind kind, const Tensor* send, Tensor* recv, size_t count, DType dtype, int peer,
                       ReduceOp reduce) const {
  CommOp o;
  o.kind = kind;
  o.count = count;
  o.dtype = dtype;
  o.peer = peer;
  o.op = reduce;
  if (send && send->numel() > 0) o.send = address(*send);
  if (recv && recv->numel() > 0) o.recv = address(*recv);
  return o;
}

void CommBackend::run(const WorkPtr& work, Device device, const std::vector<CommOp>& ops, std::vector<Tensor> tensors,
                      std::vector<Tensor> outputs, bool barrier) {
  if (auto error = watchdog_->errorFor(*work)) {
    work->fail(completionKey(), error);
    return;
  }
  const Target target = prepare(device);
  CommCompletionPtr done;
  try {
    done = target.comm->enqueue(std::span<const CommOp>(ops.data(), ops.size()), target.stream);
  } catch (const cohort::Error& e) {
    throw DistError(fmt::format("{} failed: {}", work->describe(), e.what()));
  }
  launched(device, target, done, tensors, outputs, work, barrier);
  watchdog_->track(work, std::move(done), std::move(tensors), std::move(outputs));
}

void CommBackend::allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) {
  const size_t n = static_cast<size_t>(tensor.numel());
  run(work, tensor.device(), {op(CommOpKind::Allreduce, &tensor, &tensor, n, tensor.dtype(), -1, opts.op)}, {tensor},
      {tensor});
}

void CommBackend::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) {
  std::vector<CommOp> ops;
  ops.reserve(tensors.size());
  for (Tensor& t : tensors) {
    ops.push_back(op(CommOpKind::Allreduce, &t, &t, static_cast<size_t>(t.numel()), t.dtype(), -1, opts.op));
  }
  run(work, tensors[0].device(), ops, tensors, tensors);
}

void CommBackend::broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) {
  run(work, tensor.device(),
      {op(CommOpKind::Broadcast, &tensor, &tensor, static_cast<size_t>(tensor.numel()), tensor.dtype(), opts.root)},
      {tensor}, {tensor});
}

void CommBackend::reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) {
  run(work, tensor.device(),
      {op(CommOpKind::Reduce, &tensor, &tensor, static_cast<size_t>(tensor.numel()), tensor.dtype(), opts.root,
          opts.op)},
      {tensor}, {tensor});
}

void CommBackend::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& /*opts*/,
                            const WorkPtr& work) {
  // One broadcast from each rank straight into its output: no staging buffer, no copies out.
  std::vector<CommOp> ops;
  const size_t n = static_cast<size_t>(input.numel());
  for (int r = 0; r < size(); ++r) {
    ops.push_back(op(CommOpKind::Broadcast, r == rank() ? &input : &outputs[r], &outputs[r], n, input.dtype(), r));
  }
  std::vector<Tensor> tensors = outputs;
  tensors.push_back(input);
  run(work, input.device(), ops, std::move(tensors), outputs);
}

void CommBackend::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& /*opts*/,
                                      const WorkPtr& work) {
  run(work, input.device(),
      {op(CommOpKind::Allgather, &input, &output, static_cast<size_t>(input.numel()), input.dtype())}, {output, input},
      {output});
}

void CommBackend::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                     const AllgatherOptions& /*opts*/, const WorkPtr& work) {
  std::vector<CommOp> ops;
  std::vector<Tensor> tensors = inputs;
  std::vector<Tensor> flat;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t n = static_cast<size_t>(inputs[i].numel());
    for (int r = 0; r < size(); ++r) {
      Tensor& out = outputs[r][i];
      ops.push_back(op(CommOpKind::Broadcast, r == rank() ? &inputs[i] : &out, &out, n, inputs[i].dtype(), r));
    }
  }
  for (auto& list : outputs) {
    for (auto& t : list) {
      tensors.push_back(t);
      flat.push_back(t);
    }
  }
  run(work, inputs[0].device(), ops, std::move(tensors), std::move(flat));
}

void CommBackend::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                                const WorkPtr& work) {
  // inputs[r] reduced onto rank r, for every r: one reduce each, in one group.
  std::vector<CommOp> ops;
  const size_t n = static_cast<size_t>(output.numel());
  for (int r = 0; r < size(); ++r) {
    ops.push_back(op(CommOpKind::Reduce, &inputs[r], &output, n, output.dtype(), r, opts.op));
  }
  std::vector<Tensor> tensors = inputs;
  tensors.push_back(output);
  run(work, output.device(), ops, std::move(tensors), {output});
}

void CommBackend::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                      const WorkPtr& work) {
  run(work, output.device(),
      {op(CommOpKind::ReduceScatter, &input, &output, static_cast<size_t>(output.numel()), output.dtype(), -1,
          opts.op)},
      {output, input}, {output});
}

void CommBackend::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) {
  const int n = size();
  const int64_t inRows = input.dim() ? input.size(0) : 0;
  const int64_t outRows = output.dim() ? output.size(0) : 0;
  const size_t inRow = inRows ? static_cast<size_t>(input.numel() / inRows) : 0;
  const size_t outRow = outRows ? static_cast<size_t>(output.numel() / outRows) : 0;
  auto splits = [n](const std::vector<int64_t>& given, int64_t rows) {
    if (!given.empty()) return given;
    return std::vector<int64_t>(static_cast<size_t>(n), rows / n);
  };
  const std::vector<int64_t> in = splits(opts.inputSplitSizes, inRows);
  const std::vector<int64_t> out = splits(opts.outputSplitSizes, outRows);
  void* inBase = input.numel() ? address(input) : nullptr;
  void* outBase = output.numel() ? address(output) : nullptr;
  std::vector<CommOp> ops;
  size_t inOff = 0, outOff = 0;  // elements
  for (int r = 0; r < n; ++r) {
    CommOp s;
    s.kind = CommOpKind::Send;
    s.count = static_cast<size_t>(in[r]) * inRow;
    s.send = s.count ? advance(inBase, inOff, input.dtype()) : nullptr;
    s.dtype = input.dtype();
    s.peer = r;
    CommOp v;
    v.kind = CommOpKind::Recv;
    v.count = static_cast<size_t>(out[r]) * outRow;
    v.recv = v.count ? advance(outBase, outOff, output.dtype()) : nullptr;
    v.dtype = output.dtype();
    v.peer = r;
    ops.push_back(s);
    ops.push_back(v);
    inOff += s.count;
    outOff += v.count;
  }
  run(work, input.device(), ops, {output, input}, {output});
}

void CommBackend::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                               const AlltoallOptions& /*opts*/, const WorkPtr& work) {
  std::vector<CommOp> ops;
  for (int r = 0; r < size(); ++r) {
    ops.push_back(
        op(CommOpKind::Send, &inputs[r], nullptr, static_cast<size_t>(inputs[r].numel()), inputs[r].dtype(), r));
    ops.push_back(
        op(CommOpKind::Recv, nullptr, &outputs[r], static_cast<size_t>(outputs[r].numel()), outputs[r].dtype(), r));
  }
  std::vector<Tensor> tensors = outputs;
  tensors.insert(tensors.end(), inputs.begin(), inputs.end());
  run(work, inputs[0].device(), ops, std::move(tensors), outputs);
}

void CommBackend::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                         const WorkPtr& work) {
  std::vector<CommOp> ops;
  const size_t n = static_cast<size_t>(input.numel());
  ops.push_back(op(CommOpKind::Send, &input, nullptr, n, input.dtype(), opts.root));
  std::vector<Tensor> tensors{input};
  if (rank() == opts.root) {
    for (int r = 0; r < size(); ++r) {
      ops.push_back(op(CommOpKind::Recv, nullptr, &outputs[r], n, input.dtype(), r));
      tensors.push_back(outputs[r]);
    }
  }
  run(work, input.device(), ops, std::move(tensors), rank() == opts.root ? outputs : std::vector<Tensor>{});
}

void CommBackend::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                          const WorkPtr& work) {
  std::vector<CommOp> ops;
  const size_t n = static_cast<size_t>(output.numel());
  std::vector<Tensor> tensors{output};
  if (rank() == opts.root) {
    for (int r = 0; r < size(); ++r) {
      ops.push_back(op(CommOpKind::Send, &inputs[r], nullptr, n, output.dtype(), r));
      tensors.push_back(inputs[r]);
    }
  }
  ops.push_back(op(CommOpKind::Recv, nullptr, &output, n, output.dtype(), opts.root));
  run(work, output.device(), ops, std::move(tensors), {output});
}

void CommBackend::barrier(const BarrierOptions& /*opts*/, const WorkPtr& work) {
  Tensor t = barrierTensor();
  run(work, t.device(), {op(CommOpKind::Allreduce, &t, &t, 1, t.dtype())}, {t}, {}, /*barrier=*/true);
}

void CommBackend::send(const Tensor& tensor, int dst, const SendRecvOptions& /*opts*/, const WorkPtr& work) {
  run(work, tensor.device(),
      {op(CommOpKind::Send, &tensor, nullptr, static_cast<size_t>(tensor.numel()), tensor.dtype(), dst)}, {tensor}, {});
}

void CommBackend::recv(Tensor& tensor, int src, const SendRecvOptions& /*opts*/, const WorkPtr& work) {
  run(work, tensor.device(),
      {op(CommOpKind::Recv, nullptr, &tensor, static_cast<size_t>(tensor.numel()), tensor.dtype(), src)}, {tensor},
      {tensor});
}

}  // namespace cohort::dist
