// The collectives of the MPI backend. Each method checks what it can on the caller's thread
// (reduction and dtype, counts that fit MPI's int), then queues a closure that the worker runs
// with blocking MPI calls (mpi_backend.cc). Contiguous tensors go to MPI as they are: no copy for
// allreduce, broadcast, reduce, allgather into a tensor, reduce-scatter from a tensor and
// alltoall; lists of tensors are packed into one buffer, and float16/bfloat16 reductions go
// through float32 buffers.
#include <cstring>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/detail/coalesce.h>
#include <cohort/distributed/mpi/detail/mpi_datatype.h>
#include <cohort/distributed/mpi/detail/mpi_state.h>

namespace cohort::dist::mpi_backend {

using Outputs = std::optional<std::vector<Tensor>>;

namespace {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (!a || !b || aBytes == 0 || bBytes == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bBytes && pb < pa + aBytes;
}

// Reduces `count` elements of `data` (dtype dt) in place across the communicator; avg divides by
// the group size afterwards; float16/bfloat16 are reduced in float32 and rounded once.
void allreduceInPlace(void* data, DType dt, int count, MPI_Op op, bool avg, int size, MPI_Comm comm) {
  if (count == 0) return;
  if (reducesInFloat32(dt)) {
    std::vector<float> buf(count);
    widenToFloat(data, dt, buf.data(), count);
    check(MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, op, comm), "MPI_Allreduce");
    if (avg) divideInPlace(buf.data(), MPI_FLOAT, count, size);
    narrowFromFloat(buf.data(), dt, data, count);
    return;
  }
  MPI_Datatype type = mpiType(dt);
  check(MPI_Allreduce(MPI_IN_PLACE, data, count, type, op, comm), "MPI_Allreduce");
  if (avg) divideInPlace(data, type, count, size);
}

// The reduction's MPI type and op, checked on the caller's thread (a bad reduction is a
// ValueError for the caller, not a failed Work).
struct Reduction {
  MPI_Op op;
  bool avg;
  Reduction(ReduceOp r, DType dt) : op(mpiOp(r, dt)), avg(r == ReduceOp::Avg) {}
};

}  // namespace

// ---- allreduce -------------------------------------------------------------------------------

void MpiBackend::allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) {
  Reduction red(opts.op, tensor.dtype());
  int count = mpiCount(tensor.numel(), "allreduce's tensor");
  int n = size();
  state_->enqueue(work, [t = tensor, red, count, n](MPI_Comm comm) -> Outputs {
    allreduceInPlace(dataOrNull(t), t.dtype(), count, red.op, red.avg, n, comm);
    return std::vector<Tensor>{t};
  });
}

void MpiBackend::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) {
  const DType dt = tensors.at(0).dtype();
  Reduction red(opts.op, dt);
  int count = mpiCount(detail::packedNumel(tensors), "allreduce_coalesced's tensors together");
  int n = size();
  state_->enqueue(work, [ts = tensors, dt, red, count, n](MPI_Comm comm) -> Outputs {
    if (ts.size() == 1) {
      allreduceInPlace(dataOrNull(ts[0]), dt, count, red.op, red.avg, n, comm);
      return ts;
    }
    // One flat buffer, one MPI call: small tensors cost one latency instead of one each.
    if (reducesInFloat32(dt)) {
      // Not detail::packBytes: each tensor is converted to float32 on its way in and back out.
      std::vector<float> buf(count);
      int64_t off = 0;
      for (const auto& t : ts) {
        if (t.numel()) widenToFloat(t.dataPtr(), dt, buf.data() + off, t.numel());
        off += t.numel();
      }
      if (count) check(MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, red.op, comm), "MPI_Allreduce");
      if (red.avg) divideInPlace(buf.data(), MPI_FLOAT, count, n);
      off = 0;
      for (const auto& t : ts) {
        if (t.numel()) narrowFromFloat(buf.data() + off, dt, t.dataPtr(), t.numel());
        off += t.numel();
      }
      return ts;
    }
    std::vector<char> buf(static_cast<size_t>(count) * elementSize(dt));
    detail::packBytes(ts, buf.data(), "allreduce_coalesced");
    allreduceInPlace(count ? buf.data() : nullptr, dt, count, red.op, red.avg, n, comm);
    detail::unpackBytes(buf.data(), ts, "allreduce_coalesced");
    return ts;
  });
}

// ---- broadcast, reduce -------------------------------------------------------------------------

void MpiBackend::broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) {
  int count = mpiCount(tensor.numel(), "broadcast's tensor");
  int root = opts.root;
  state_->enqueue(work, [t = tensor, count, root](MPI_Comm comm) -> Outputs {
    if (count) check(MPI_Bcast(t.dataPtr(), count, mpiType(t.dtype()), root, comm), "MPI_Bcast");
    return std::vector<Tensor>{t};
  });
}

void MpiBackend::reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) {
  const DType dt = tensor.dtype();
  Reduction red(opts.op, dt);
  int count = mpiCount(tensor.numel(), "reduce's tensor");
  int root = opts.root, n = size();
  bool isRoot = rank() == root;
  state_->enqueue(work, [t = tensor, dt, red, count, root, n, isRoot](MPI_Comm comm) -> Outputs {
    if (count == 0) return std::vector<Tensor>{t};
    if (reducesInFloat32(dt)) {
      // Not detail::packBytes: each tensor is converted to float32 on its way in and back out.
      std::vector<float> buf(count);
      widenToFloat(t.dataPtr(), dt, buf.data(), count);
      check(MPI_Reduce(isRoot ? MPI_IN_PLACE : buf.data(), isRoot ? buf.data() : nullptr, count, MPI_FLOAT, red.op,
                       root, comm),
            "MPI_Reduce");
      if (isRoot) {
        if (red.avg) divideInPlace(buf.data(), MPI_FLOAT, count, n);
        narrowFromFloat(buf.data(), dt, t.dataPtr(), count);
      }
      return std::vector<Tensor>{t};
    }
    MPI_Datatype type = mpiType(dt);
    check(MPI_Reduce(isRoot ? MPI_IN_PLACE : t.dataPtr(), isRoot ? t.dataPtr() : nullptr, count, type, red.op, root,
                     comm),
          "MPI_Reduce");
    if (isRoot && red.avg) divideInPlace(t.dataPtr(), type, count, n);
    return std::vector<Tensor>{t};
  });
}

// ---- allgather ---------------------------------------------------------------------------------

void MpiBackend::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& /*opts*/,
                           const WorkPtr& work) {
  int count = mpiCount(input.numel(), "allgather's input");
  mpiCount(input.numel() * size(), "allgather's outputs together");
  int n = size();
  state_->enqueue(work, [outs = outputs, in = input, count, n](MPI_Comm comm) -> Outputs {
    if (count == 0) return outs;
    MPI_Datatype type = mpiType(in.dtype());
    std::vector<char> buf(in.nbytes() * n);
    check(MPI_Allgather(in.dataPtr(), count, type, buf.data(), count, type, comm), "MPI_Allgather");
    detail::unpackBytes(buf.data(), outs, "allgather");
    return outs;
  });
}

void MpiBackend::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& /*opts*/,
                                     const WorkPtr& work) {
  int count = mpiCount(input.numel(), "allgather_into_tensor's input");
  mpiCount(output.numel(), "allgather_into_tensor's output");
  int r = rank();
  state_->enqueue(work, [out = output, in = input, count, r](MPI_Comm comm) -> Outputs {
    if (count == 0) return std::vector<Tensor>{out};
    MPI_Datatype type = mpiType(in.dtype());
    const char* slot = static_cast<const char*>(out.dataPtr()) + static_cast<size_t>(r) * in.nbytes();
    const void* send = in.dataPtr();
    std::vector<char> copy;
    if (send == slot) {
      send = MPI_IN_PLACE;  // the input is this rank's slice of the output (FSDP's layout)
    } else if (overlaps(send, in.nbytes(), out.dataPtr(), out.nbytes())) {
      copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + in.nbytes());
      send = copy.data();
    }
    check(MPI_Allgather(send, count, type, out.dataPtr(), count, type, comm), "MPI_Allgather");
    return std::vector<Tensor>{out};
  });
}

void MpiBackend::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                    const AllgatherOptions& /*opts*/, const WorkPtr& work) {
  int count = mpiCount(detail::packedNumel(inputs), "allgather_coalesced's inputs together");
  mpiCount(detail::packedNumel(inputs) * size(), "allgather_coalesced's outputs together");
  int n = size();
  state_->enqueue(work, [outs = outputs, ins = inputs, count, n](MPI_Comm comm) -> Outputs {
    std::vector<Tensor> flat;
    for (const auto& list : outs) flat.insert(flat.end(), list.begin(), list.end());
    if (count == 0) return flat;
    const DType dt = ins[0].dtype();
    const size_t bytes = static_cast<size_t>(count) * elementSize(dt);
    std::vector<char> send(bytes), recv(bytes * n);
    detail::packBytes(ins, send.data(), "allgather_coalesced");
    check(MPI_Allgather(send.data(), count, mpiType(dt), recv.data(), count, mpiType(dt), comm), "MPI_Allgather");
    for (int r = 0; r < n; ++r) detail::unpackBytes(recv.data() + r * bytes, outs[r], "allgather_coalesced");
    return flat;
  });
}

// ---- reduce-scatter ----------------------------------------------------------------------------

namespace {
// MPI_Reduce_scatter_block of `send` (size * count elements) into `recv` (count elements).
void reduceScatterBlock(const void* send, void* recv, DType dt, int count, const Reduction& red, int size,
                        MPI_Comm comm) {
  if (count == 0) return;
  if (reducesInFloat32(dt)) {
    std::vector<float> in(static_cast<size_t>(count) * size), out(count);
    widenToFloat(send, dt, in.data(), static_cast<int64_t>(count) * size);
    check(MPI_Reduce_scatter_block(in.data(), out.data(), count, MPI_FLOAT, red.op, comm), "MPI_Reduce_scatter_block");
    if (red.avg) divideInPlace(out.data(), MPI_FLOAT, count, size);
    narrowFromFloat(out.data(), dt, recv, count);
    return;
  }
  MPI_Datatype type = mpiType(dt);
  check(MPI_Reduce_scatter_block(send, recv, count, type, red.op, comm), "MPI_Reduce_scatter_block");
  if (red.avg) divideInPlace(recv, type, count, size);
}
}  // namespace

void MpiBackend::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                               const WorkPtr& work) {
  const DType dt = output.dtype();
  Reduction red(opts.op, dt);
  int count = mpiCount(output.numel(), "reduce_scatter's output");
  mpiCount(output.numel() * size(), "reduce_scatter's inputs together");
  int n = size();
  state_->enqueue(work, [out = output, ins = inputs, dt, red, count, n](MPI_Comm comm) -> Outputs {
    if (count == 0) return std::vector<Tensor>{out};
    std::vector<char> send(out.nbytes() * n);
    detail::packBytes(ins, send.data(), "reduce_scatter");
    reduceScatterBlock(send.data(), out.dataPtr(), dt, count, red, n, comm);
    return std::vector<Tensor>{out};
  });
}

void MpiBackend::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                     const WorkPtr& work) {
  const DType dt = output.dtype();
  Reduction red(opts.op, dt);
  int count = mpiCount(output.numel(), "reduce_scatter_tensor's output");
  mpiCount(input.numel(), "reduce_scatter_tensor's input");
  int n = size();
  state_->enqueue(work, [out = output, in = input, dt, red, count, n](MPI_Comm comm) -> Outputs {
    if (count == 0) return std::vector<Tensor>{out};
    const void* send = in.dataPtr();
    std::vector<char> copy;
    if (overlaps(send, in.nbytes(), out.dataPtr(), out.nbytes())) {
      copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + in.nbytes());
      send = copy.data();
    }
    reduceScatterBlock(send, out.dataPtr(), dt, count, red, n, comm);
    return std::vector<Tensor>{out};
  });
}

// ---- alltoall ----------------------------------------------------------------------------------

void MpiBackend::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) {
  const int n = size();
  const bool uneven = !opts.inputSplitSizes.empty() || !opts.outputSplitSizes.empty();
  mpiCount(input.numel(), "alltoall's input");
  mpiCount(output.numel(), "alltoall's output");
  if (!uneven) {
    int count = static_cast<int>(input.numel() / n);
    state_->enqueue(work, [out = output, in = input, count](MPI_Comm comm) -> Outputs {
      if (count == 0) return std::vector<Tensor>{out};
      MPI_Datatype type = mpiType(in.dtype());
      const void* send = in.dataPtr();
      std::vector<char> copy;
      if (overlaps(send, in.nbytes(), out.dataPtr(), out.nbytes())) {
        copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + in.nbytes());
        send = copy.data();
      }
      check(MPI_Alltoall(send, count, type, out.dataPtr(), count, type, comm), "MPI_Alltoall");
      return std::vector<Tensor>{out};
    });
    return;
  }
  // Elements per row along dim 0 (the same for input and output: ProcessGroup checked the shapes).
  int64_t row = 1;
  for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
  auto layout = [&](const std::vector<int64_t>& splits, const Tensor& t, std::vector<int>& counts,
                    std::vector<int>& displs) {
    counts.resize(n);
    displs.resize(n);
    int64_t off = 0;
    for (int i = 0; i < n; ++i) {
      int64_t rows = splits.empty() ? t.size(0) / n : splits[i];
      counts[i] = mpiCount(rows * row, "an alltoall split");
      displs[i] = mpiCount(off, "an alltoall offset");
      off += rows * row;
    }
  };
  std::vector<int> sendCounts, sendDispls, recvCounts, recvDispls;
  layout(opts.inputSplitSizes, input, sendCounts, sendDispls);
  layout(opts.outputSplitSizes, output, recvCounts, recvDispls);
  state_->enqueue(work,
                  [out = output, in = input, sendCounts, sendDispls, recvCounts, recvDispls](MPI_Comm comm) -> Outputs {
                    MPI_Datatype type = mpiType(in.dtype());
                    const void* send = dataOrNull(in);
                    std::vector<char> copy;
                    if (overlaps(send, in.nbytes(), dataOrNull(out), out.nbytes())) {
                      copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + in.nbytes());
                      send = copy.data();
                    }
                    // MPI wants valid addresses even for zero counts.
                    char dummy[8];
                    check(MPI_Alltoallv(send ? send : dummy, sendCounts.data(), sendDispls.data(), type,
                                        out.numel() ? out.dataPtr() : dummy, recvCounts.data(), recvDispls.data(), type,
                                        comm),
                          "MPI_Alltoallv");
                    return std::vector<Tensor>{out};
                  });
}

void MpiBackend::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                              const AlltoallOptions& /*opts*/, const WorkPtr& work) {
  const int n = size();
  std::vector<int> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  int64_t sendOff = 0, recvOff = 0;
  for (int i = 0; i < n; ++i) {
    sendCounts[i] = mpiCount(inputs[i].numel(), "an alltoall_list input");
    recvCounts[i] = mpiCount(outputs[i].numel(), "an alltoall_list output");
    sendDispls[i] = mpiCount(sendOff, "alltoall_list's inputs together");
    recvDispls[i] = mpiCount(recvOff, "alltoall_list's outputs together");
    sendOff += inputs[i].numel();
    recvOff += outputs[i].numel();
  }
  state_->enqueue(work,
                  [outs = outputs, ins = inputs, sendCounts, sendDispls, recvCounts, recvDispls, sendOff,
                   recvOff](MPI_Comm comm) -> Outputs {
                    const DType dt = ins[0].dtype();
                    std::vector<char> send(std::max<size_t>(1, sendOff * elementSize(dt)));
                    std::vector<char> recv(std::max<size_t>(1, recvOff * elementSize(dt)));
                    detail::packBytes(ins, send.data(), "alltoall_list");
                    check(MPI_Alltoallv(send.data(), sendCounts.data(), sendDispls.data(), mpiType(dt), recv.data(),
                                        recvCounts.data(), recvDispls.data(), mpiType(dt), comm),
                          "MPI_Alltoallv");
                    detail::unpackBytes(recv.data(), outs, "alltoall_list");
                    return outs;
                  });
}

// ---- gather, scatter, barrier ------------------------------------------------------------------

void MpiBackend::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                        const WorkPtr& work) {
  int count = mpiCount(input.numel(), "gather's input");
  mpiCount(input.numel() * size(), "gather's outputs together");
  int root = opts.root, n = size();
  bool isRoot = rank() == root;
  std::vector<Tensor> outs = isRoot ? outputs : std::vector<Tensor>{};
  state_->enqueue(work, [outs, in = input, count, root, n, isRoot](MPI_Comm comm) -> Outputs {
    if (count == 0) return outs;
    MPI_Datatype type = mpiType(in.dtype());
    std::vector<char> buf(isRoot ? in.nbytes() * n : 0);
    check(MPI_Gather(in.dataPtr(), count, type, isRoot ? buf.data() : nullptr, count, type, root, comm), "MPI_Gather");
    if (isRoot) detail::unpackBytes(buf.data(), outs, "gather");
    return outs;
  });
}

void MpiBackend::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                         const WorkPtr& work) {
  int count = mpiCount(output.numel(), "scatter's output");
  mpiCount(output.numel() * size(), "scatter's inputs together");
  int root = opts.root, n = size();
  bool isRoot = rank() == root;
  std::vector<Tensor> ins = isRoot ? inputs : std::vector<Tensor>{};
  state_->enqueue(work, [out = output, ins, count, root, n, isRoot](MPI_Comm comm) -> Outputs {
    if (count == 0) return std::vector<Tensor>{out};
    MPI_Datatype type = mpiType(out.dtype());
    std::vector<char> buf(isRoot ? out.nbytes() * n : 0);
    if (isRoot) detail::packBytes(ins, buf.data(), "scatter");
    check(MPI_Scatter(isRoot ? buf.data() : nullptr, count, type, out.dataPtr(), count, type, root, comm),
          "MPI_Scatter");
    return std::vector<Tensor>{out};
  });
}

void MpiBackend::barrier(const BarrierOptions& /*opts*/, const WorkPtr& work) {
  state_->enqueue(work, [](MPI_Comm comm) -> Outputs {
    check(MPI_Barrier(comm), "MPI_Barrier");
    return std::vector<Tensor>{};
  });
}

}  // namespace cohort::dist::mpi_backend
