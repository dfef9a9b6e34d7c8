// The collectives of GlooBackend: each enqueues a body that runs on the worker thread.
#include <cstring>
#include <functional>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/dtype.h>
#include <cohort/core/util/check.h>
#include <cohort/distributed/detail/coalesce.h>
#include <cohort/distributed/detail/op_queue.h>
#include <cohort/distributed/detail/reduce_kernels.h>
#include <cohort/distributed/gloo/gloo_backend.h>

namespace cohort::dist::gloo_backend {

namespace {

using Ctx = std::shared_ptr<::gloo::Context>;
using ::cohort::dist::detail::accumulate;

// The gloo reduce function for a storage type T (never Half/BFloat16: those are widened first).
using GlooReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
template <typename T>
GlooReduceFn reduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return &::cohort::dist::detail::combineInto<T, ReduceOp::Sum>;
    case ReduceOp::Product: return &::cohort::dist::detail::combineInto<T, ReduceOp::Product>;
    case ReduceOp::Min: return &::cohort::dist::detail::combineInto<T, ReduceOp::Min>;
    case ReduceOp::Max: return &::cohort::dist::detail::combineInto<T, ReduceOp::Max>;
  }
  return &::cohort::dist::detail::combineInto<T, ReduceOp::Sum>;
}

bool isHalf(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

uint8_t* bytesOf(const Tensor& t) { return static_cast<uint8_t*>(t.dataPtr()); }

// In-place allreduce of a contiguous buffer of a non-half dtype.
// `tag` keeps allreduces that run side by side (OpQueue with several threads) apart on the wire:
// the op's sequence number, the same on every rank.
void allreduceRaw(const Ctx& ctx, void* ptr, size_t n, DType dtype, ReduceOp op, Millis timeout, uint32_t tag) {
  COHORT_DISPATCH(dtype, "allreduce", [&]<typename T>() {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      COHORT_CHECK(false, "allreduceRaw: half types are widened first");
    } else {
      ::gloo::AllreduceOptions o(ctx);
      o.setOutput(static_cast<T*>(ptr), n);
      o.setReduceFunction(reduceFn<T>(op));
      o.setTimeout(timeout);
      o.setTag(tag);
      ::gloo::allreduce(o);
    }
  });
}

// Allreduce of a contiguous tensor in place; halves accumulate in float32 and round once.
void allreduceTensor(const Ctx& ctx, const Tensor& t, ReduceOp op, Millis timeout, uint32_t tag) {
  if (t.numel() == 0) return;
  Tensor target = t.detach();
  if (isHalf(t.dtype())) {
    Tensor wide = target.to(DType::Float32);
    allreduceRaw(ctx, wide.dataPtr(), wide.numel(), DType::Float32, op, timeout, tag);
    if (op == ReduceOp::Avg) wide.div_(Scalar(static_cast<double>(ctx->size)));
    target.copy_(wide);
    return;
  }
  allreduceRaw(ctx, target.dataPtr(), target.numel(), target.dtype(), op, timeout, tag);
  if (op == ReduceOp::Avg) target.div_(Scalar(static_cast<double>(ctx->size)));
}

void allgatherBytes(const Ctx& ctx, const void* in, size_t nbytes, void* out, Millis timeout) {
  if (nbytes == 0) return;
  ::gloo::AllgatherOptions o(ctx);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), nbytes);
  o.setOutput(static_cast<uint8_t*>(out), nbytes * ctx->size);
  o.setTimeout(timeout);
  ::gloo::allgather(o);
}

void alltoallBytes(const Ctx& ctx, const void* in, void* out, size_t totalBytes, Millis timeout) {
  if (totalBytes == 0) return;
  ::gloo::AlltoallOptions o(ctx);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), totalBytes);
  o.setOutput(static_cast<uint8_t*>(out), totalBytes);
  o.setTimeout(timeout);
  ::gloo::alltoall(o);
}

void alltoallvBytes(const Ctx& ctx, const void* in, std::vector<int64_t> inBytes, void* out,
                    std::vector<int64_t> outBytes, Millis timeout) {
  // gloo needs real pointers even for empty sides.
  static uint8_t dummy = 0;
  ::gloo::AlltoallvOptions o(ctx);
  o.setInput(in ? static_cast<uint8_t*>(const_cast<void*>(in)) : &dummy, std::move(inBytes));
  o.setOutput(out ? static_cast<uint8_t*>(out) : &dummy, std::move(outBytes));
  o.setTimeout(timeout);
  ::gloo::alltoallv(o);
}

// output = reduction over ranks r of chunk r of `recv` (each chunk output.numel() elements),
// in rank order; float16/bfloat16 accumulate in float32.
void reduceChunks(const Tensor& output, const uint8_t* recv, int size, ReduceOp op) {
  const size_t n = static_cast<size_t>(output.numel());
  if (n == 0) return;
  COHORT_DISPATCH(output.dtype(), "reduce_scatter", [&]<typename T>() {
    using A = Acc<T>;
    const T* chunks = reinterpret_cast<const T*>(recv);
    T* out = static_cast<T*>(output.dataPtr());
    if constexpr (std::is_same_v<A, T>) {
      std::memcpy(out, chunks, n * sizeof(T));
      for (int r = 1; r < size; ++r) accumulate<T, T>(out, chunks + r * n, n, op);
      if constexpr (kIsFloat<T>) {
        if (op == ReduceOp::Avg) {
          const T inv = static_cast<T>(size);
          for (size_t i = 0; i < n; ++i) out[i] /= inv;
        }
      }
    } else {
      std::vector<A> acc(n);
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(chunks[i]);
      for (int r = 1; r < size; ++r) accumulate<A, T>(acc.data(), chunks + r * n, n, op);
      const A div = op == ReduceOp::Avg ? static_cast<A>(size) : A(1);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(acc[i] / div);
    }
  });
}

void reduceTensor(const Ctx& ctx, const Tensor& t, ReduceOp op, int root, Millis timeout) {
  if (t.numel() == 0) return;
  Tensor target = t.detach();
  Tensor buf = isHalf(t.dtype()) ? target.to(DType::Float32) : target;
  COHORT_DISPATCH(buf.dtype(), "reduce", [&]<typename T>() {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      COHORT_CHECK(false, "reduce: half types are widened first");
    } else {
      ::gloo::ReduceOptions o(ctx);
      o.setOutput(static_cast<T*>(buf.dataPtr()), static_cast<size_t>(buf.numel()));
      o.setRoot(root);
      o.setReduceFunction(reduceFn<T>(op));
      o.setTimeout(timeout);
      ::gloo::reduce(o);
    }
  });
  if (ctx->rank != root) return;
  if (op == ReduceOp::Avg) buf.div_(Scalar(static_cast<double>(ctx->size)));
  if (!buf.isSameAs(target)) target.copy_(buf);
}

}  // namespace

// Allreduces may run side by side with other allreduces on other memory (distributed/detail/op_queue.h).
void GlooBackend::allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) {
  OpFootprint shared{false, {tensor.storage().get()}};
  enqueue(
      work,
      [ctx = context_, t = tensor, op = opts.op, work]() -> std::vector<Tensor> {
        allreduceTensor(ctx, t, op, work->remaining(), static_cast<uint32_t>(work->sequenceNumber()));
        return {t};
      },
      std::move(shared));
}

void GlooBackend::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) {
  OpFootprint shared{false, {}};
  for (const Tensor& t : tensors) shared.storages.push_back(t.storage().get());
  enqueue(
      work,
      [ctx = context_, ts = tensors, op = opts.op, work]() -> std::vector<Tensor> {
        const detail::FlatLayout layout = detail::FlatLayout::of(ts, "allreduce_coalesced");
        Tensor flat = detail::pack(ts, layout);
        allreduceTensor(ctx, flat, op, work->remaining(), static_cast<uint32_t>(work->sequenceNumber()));
        detail::unpack(flat, ts, layout);
        return ts;
      },
      std::move(shared));
}

void GlooBackend::broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) {
  enqueue(work, [ctx = context_, t = tensor, root = opts.root, work]() -> std::vector<Tensor> {
    if (t.nbytes() == 0) return {t};
    ::gloo::BroadcastOptions o(ctx);
    o.setOutput(bytesOf(t), t.nbytes());
    o.setRoot(root);
    o.setTimeout(work->remaining());
    ::gloo::broadcast(o);
    return {t};
  });
}

void GlooBackend::reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) {
  enqueue(work, [ctx = context_, t = tensor, op = opts.op, root = opts.root, work]() -> std::vector<Tensor> {
    reduceTensor(ctx, t, op, root, work->remaining());
    return {t};
  });
}

void GlooBackend::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& /*opts*/,
                            const WorkPtr& work) {
  enqueue(work, [ctx = context_, outs = outputs, in = input, work]() -> std::vector<Tensor> {
    const size_t n = in.nbytes();
    std::vector<uint8_t> all(n * ctx->size);
    allgatherBytes(ctx, in.dataPtr(), n, all.data(), work->remaining());
    detail::unpackBytes(all.data(), outs, "allgather");
    return outs;
  });
}

void GlooBackend::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& /*opts*/,
                                      const WorkPtr& work) {
  enqueue(work, [ctx = context_, out = output, in = input, work]() -> std::vector<Tensor> {
    allgatherBytes(ctx, in.dataPtr(), in.nbytes(), out.dataPtr(), work->remaining());
    return {out};
  });
}

void GlooBackend::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                     const AllgatherOptions& /*opts*/, const WorkPtr& work) {
  enqueue(work, [ctx = context_, outs = outputs, ins = inputs, work]() -> std::vector<Tensor> {
    const size_t n = detail::packedBytes(ins);
    std::vector<uint8_t> mine(n), all(n * ctx->size);
    detail::packBytes(ins, mine.data(), "allgather_coalesced");
    allgatherBytes(ctx, mine.data(), n, all.data(), work->remaining());
    std::vector<Tensor> flat;
    for (int r = 0; r < ctx->size; ++r) {
      detail::unpackBytes(all.data() + r * n, outs[r], "allgather_coalesced");
      flat.insert(flat.end(), outs[r].begin(), outs[r].end());
    }
    return flat;
  });
}

void GlooBackend::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                                const WorkPtr& work) {
  enqueue(work, [ctx = context_, out = output, ins = inputs, op = opts.op, work]() -> std::vector<Tensor> {
    const size_t n = out.nbytes();
    if (n == 0) return {out};
    std::vector<uint8_t> send(n * ctx->size), recv(n * ctx->size);
    detail::packBytes(ins, send.data(), "reduce_scatter");
    alltoallBytes(ctx, send.data(), recv.data(), send.size(), work->remaining());
    reduceChunks(out, recv.data(), ctx->size, op);
    return {out};
  });
}

void GlooBackend::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                      const WorkPtr& work) {
  enqueue(work, [ctx = context_, out = output, in = input, op = opts.op, work]() -> std::vector<Tensor> {
    if (in.nbytes() == 0) return {out};
    std::vector<uint8_t> recv(in.nbytes());
    alltoallBytes(ctx, in.dataPtr(), recv.data(), in.nbytes(), work->remaining());
    reduceChunks(out, recv.data(), ctx->size, op);
    return {out};
  });
}

void GlooBackend::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) {
  enqueue(work, [ctx = context_, out = output, in = input, opts, work]() -> std::vector<Tensor> {
    const int size = ctx->size;
    if (opts.inputSplitSizes.empty() && opts.outputSplitSizes.empty()) {
      alltoallBytes(ctx, in.dataPtr(), out.dataPtr(), in.nbytes(), work->remaining());
      return {out};
    }
    auto bytesPerRank = [&](const Tensor& t, const std::vector<int64_t>& splits) {
      int64_t rowBytes = static_cast<int64_t>(t.elementSize());
      for (int64_t d = 1; d < t.dim(); ++d) rowBytes *= t.size(d);
      std::vector<int64_t> b(size);
      for (int r = 0; r < size; ++r) b[r] = (splits.empty() ? t.size(0) / size : splits[r]) * rowBytes;
      return b;
    };
    alltoallvBytes(ctx, in.dataPtr(), bytesPerRank(in, opts.inputSplitSizes), out.dataPtr(),
                   bytesPerRank(out, opts.outputSplitSizes), work->remaining());
    return {out};
  });
}

void GlooBackend::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                               const AlltoallOptions& /*opts*/, const WorkPtr& work) {
  enqueue(work, [ctx = context_, outs = outputs, ins = inputs, work]() -> std::vector<Tensor> {
    const int size = ctx->size;
    std::vector<int64_t> inBytes(size), outBytes(size);
    size_t inTotal = 0, outTotal = 0;
    for (int r = 0; r < size; ++r) {
      inBytes[r] = static_cast<int64_t>(ins[r].nbytes());
      outBytes[r] = static_cast<int64_t>(outs[r].nbytes());
      inTotal += ins[r].nbytes();
      outTotal += outs[r].nbytes();
    }
    std::vector<uint8_t> send(inTotal), recv(outTotal);
    detail::packBytes(ins, send.data(), "alltoall_list");
    alltoallvBytes(ctx, send.data(), inBytes, recv.data(), outBytes, work->remaining());
    detail::unpackBytes(recv.data(), outs, "alltoall_list");
    return outs;
  });
}

void GlooBackend::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                         const WorkPtr& work) {
  enqueue(work, [ctx = context_, outs = outputs, in = input, root = opts.root, work]() -> std::vector<Tensor> {
    const size_t n = in.nbytes();
    if (n == 0) return outs;
    ::gloo::GatherOptions o(ctx);
    o.setInput(bytesOf(in), n);
    std::vector<uint8_t> all;
    if (ctx->rank == root) {
      all.resize(n * ctx->size);
      o.setOutput(all.data(), all.size());
    }
    o.setRoot(root);
    o.setTimeout(work->remaining());
    ::gloo::gather(o);
    if (ctx->rank == root) {
      detail::unpackBytes(all.data(), outs, "gather");
    }
    return outs;
  });
}

void GlooBackend::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                          const WorkPtr& work) {
  enqueue(work, [ctx = context_, out = output, ins = inputs, root = opts.root, work]() -> std::vector<Tensor> {
    const size_t n = out.nbytes();
    if (n == 0) return {out};
    ::gloo::ScatterOptions o(ctx);
    if (ctx->rank == root) {
      std::vector<uint8_t*> ptrs;
      for (const Tensor& t : ins) ptrs.push_back(bytesOf(t));
      o.setInputs(ptrs, n);
    }
    o.setOutput(bytesOf(out), n);
    o.setRoot(root);
    o.setTimeout(work->remaining());
    ::gloo::scatter(o);
    return {out};
  });
}

void GlooBackend::barrier(const BarrierOptions& /*opts*/, const WorkPtr& work) {
  enqueue(work, [ctx = context_, work]() -> std::vector<Tensor> {
    ::gloo::BarrierOptions o(ctx);
    o.setTimeout(work->remaining());
    ::gloo::barrier(o);
    return {};
  });
}

}  // namespace cohort::dist::gloo_backend
