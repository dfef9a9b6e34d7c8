// The collectives of ShmBackend, each a sequence of rounds (see shm_backend.h), run on the
// caller's thread.
#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/detail/coalesce.h>
#include <cohort/distributed/detail/op_queue.h>
#include <cohort/distributed/detail/reduce_kernels.h>
#include <cohort/distributed/shm/shm_backend.h>

namespace cohort::dist::shm_backend {

using ::cohort::dist::detail::reduceSources;
using ::cohort::dist::detail::reduceSourcesInto;

namespace {

uint8_t* bytesOf(const Tensor& t) { return static_cast<uint8_t*>(t.dataPtr()); }

size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace

template <typename F>
void ShmBackend::run(const WorkPtr& work, F&& body) {
  if (!ops_) {
    execute(work, body);
    return;
  }
  ops_->post(work, [this, work, b = std::forward<F>(body)]() mutable { execute(work, b); });
}

void ShmBackend::execute(const WorkPtr& work, const std::function<std::vector<Tensor>(Deadline)>& body) {
  std::vector<Tensor> outputs;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(opMu_);
    if (broken_.load()) {
      error = std::make_exception_ptr(brokenError());
    } else {
      try {
        outputs = body(work->deadline());
      } catch (const Failure& f) {
        // Tell the peers (and stop later ops) before the diagnosis, which may read the store.
        breakWith(fmt::format("{} failed: {}", work->describe(), f.detail));
        error = f.timeout ? work->timeoutError(f.detail) : work->peerError(f.detail);
      } catch (...) {
        error = std::current_exception();
      }
    }
  }
  // Completed outside the lock: a completion callback may issue the group's next op.
  if (error) work->fail(completionKey(), error);
  else work->finish(completionKey(), std::move(outputs));
}

// ---- byte-level collectives ------------------------------------------------------------------

void ShmBackend::allreduceBytes(void* data, size_t count, DType dtype, ReduceOp op, Deadline dl) {
  const int n = size(), r = rank();
  if (count == 0 || n == 1) return;  // Avg over one rank is the value itself
  const size_t es = elementSize(dtype);
  uint8_t* d = static_cast<uint8_t*>(data);
  if (count * es <= smallBytes_) {
    std::vector<const void*> srcs(n);
    std::memcpy(writeSlot(), d, count * es);
    sync(dl, "allreduce");
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? d : readSlot(q);
    reduceSources(dtype, d, nullptr, srcs.data(), n, count, op, n);
    return;
  }
  // Large: every rank states in the first round whether its tensor is a registered buffer.
  Desc mine{Desc::kPlain, 0, 0, count * es};
  std::vector<uint8_t*> bases;
  const bool registered = findRegistered(d, count * es, mine, bases);
  publishDesc(mine);
  if (registered) {
    sync(dl, "allreduce");
    bool alike = true;
    for (int q = 0; q < n; ++q)
      if (q != r && !(peerDesc(q) == mine)) alike = false;
    if (alike) {
      allreduceRegistered(bases, mine.offset, count, dtype, op, dl);
      return;
    }
    allreduceSlots(d, count, dtype, op, dl, false);  // some peer's was not: all start over
    return;
  }
  if (!allreduceSlots(d, count, dtype, op, dl, true)) allreduceSlots(d, count, dtype, op, dl, false);
}

void ShmBackend::allreduceRegistered(const std::vector<uint8_t*>& bases, size_t offset, size_t count, DType dtype,
                                     ReduceOp op, Deadline dl) {
  const int n = size(), r = rank();
  const size_t es = elementSize(dtype);
  // This rank's slice, in whole cache lines of the buffer, so no two ranks write one line.
  const size_t unit = std::max<size_t>(1, 64 / es);
  const size_t slice = roundUp((count + n - 1) / n, unit);
  const size_t beg = std::min(static_cast<size_t>(r) * slice, count), end = std::min(beg + slice, count);
  std::vector<const void*> srcs(n);
  std::vector<void*> outs(n);
  for (int q = 0; q < n; ++q) {
    uint8_t* p = bases[q] + offset + beg * es;
    srcs[q] = p;
    outs[q] = p;
  }
  reduceSourcesInto(dtype, outs.data(), n, srcs.data(), n, end - beg, op, n);
  // Nobody may write its buffer again (a next backward) while a peer still reads or writes it.
  sync(dl, "allreduce");
  registeredAllreduces_.fetch_add(1, std::memory_order_relaxed);
}

bool ShmBackend::allreduceSlots(uint8_t* d, size_t count, DType dtype, ReduceOp op, Deadline dl, bool checkPeers) {
  const int n = size(), r = rank();
  const size_t es = elementSize(dtype);
  std::vector<const void*> srcs(n);
  const size_t unit = std::max<size_t>(1, 64 / es);
  // Reduce-scatter + allgather, chunk by chunk, one round per chunk: a slot holds the chunk (the
  // others' slices of it) and, behind it, this rank's reduced slice of the previous chunk. In
  // round k every rank copies the others' reduced slices of chunk k-1 and reduces its slice of
  // chunk k into its next slot; one last round delivers the last chunk's slices.
  const size_t chunk = (slotBytes_ * n / (n + 1) / es) / (unit * n) * (unit * n);
  // chunk >= unit * n: the constructor makes slots of at least 64 * (n + 1) bytes.
  const size_t reducedAt = chunk * es;  // offset of the reduced slice in a slot (64-byte aligned)
  auto sliceLen = [&](size_t len) { return roundUp((len + n - 1) / n, unit); };
  auto beg = [&](size_t len, int q) { return std::min(static_cast<size_t>(q) * sliceLen(len), len); };
  auto end = [&](size_t len, int q) { return std::min(static_cast<size_t>(q + 1) * sliceLen(len), len); };
  auto copyOut = [&](size_t off, size_t len) {
    for (int q = 0; q < n; ++q) {
      if (q != r && end(len, q) > beg(len, q)) {
        std::memcpy(d + (off + beg(len, q)) * es, readSlot(q) + reducedAt, (end(len, q) - beg(len, q)) * es);
      }
    }
  };
  size_t prevOff = 0, prevLen = 0;
  for (size_t off = 0; off < count; off += chunk) {
    const size_t len = std::min(chunk, count - off);
    uint8_t* w = writeSlot();
    for (int q = 0; q < n; ++q) {
      if (q != r && end(len, q) > beg(len, q)) {
        std::memcpy(w + beg(len, q) * es, d + (off + beg(len, q)) * es, (end(len, q) - beg(len, q)) * es);
      }
    }
    sync(dl, "allreduce");
    if (checkPeers) {
      checkPeers = false;
      for (int q = 0; q < n; ++q)
        if (q != r && peerDesc(q).kind == Desc::kRegistered) return false;
    }
    if (prevLen) copyOut(prevOff, prevLen);
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? d + (off + beg(len, r)) * es : readSlot(q) + beg(len, r) * es;
    reduceSources(dtype, d + (off + beg(len, r)) * es, writeSlot() + reducedAt, srcs.data(), n,
                  end(len, r) - beg(len, r), op, n);
    prevOff = off;
    prevLen = len;
  }
  sync(dl, "allreduce");
  copyOut(prevOff, prevLen);
  return true;
}

void ShmBackend::allgatherBytes(const void* in, size_t bytes, const std::vector<uint8_t*>& outs, Deadline dl) {
  if (bytes == 0) return;
  const int n = size(), r = rank();
  const uint8_t* src = static_cast<const uint8_t*>(in);
  if (n == 1) {
    if (outs[r] != src) std::memcpy(outs[r], src, bytes);
    return;
  }
  for (size_t off = 0; off < bytes; off += slotBytes_) {
    const size_t len = std::min(slotBytes_, bytes - off);
    // Into the slot and this rank's output, block by block, so the input is read from memory once.
    uint8_t* w = writeSlot();
    constexpr size_t kBlock = 64 << 10;
    for (size_t b = 0; b < len; b += kBlock) {
      const size_t m = std::min(kBlock, len - b);
      std::memcpy(w + b, src + off + b, m);
      if (outs[r] != src) std::memcpy(outs[r] + off + b, w + b, m);
    }
    sync(dl, "allgather");
    for (int q = 0; q < n; ++q)
      if (q != r) std::memcpy(outs[q] + off, readSlot(q), len);
  }
}

void ShmBackend::alltoallBytes(const std::vector<const uint8_t*>& send, const std::vector<size_t>& sendBytes,
                               const std::vector<uint8_t*>& recv, const std::vector<size_t>& recvBytes,
                               bool sizesKnownEqual, Deadline dl) {
  const int n = size(), r = rank();
  const size_t region = std::max<size_t>(64, slotBytes_ / n / 64 * 64);
  size_t maxLen = 0;
  if (sizesKnownEqual) {
    for (int q = 0; q < n; ++q)
      if (q != r) maxLen = std::max(maxLen, sendBytes[q]);
  } else {
    // Exchange every rank's send and receive sizes, so every rank checks every pair alike and
    // agrees on the number of rounds.
    uint64_t* mine = reinterpret_cast<uint64_t*>(writeSlot());
    for (int q = 0; q < n; ++q) {
      mine[q] = sendBytes[q];
      mine[n + q] = recvBytes[q];
    }
    sync(dl, "alltoall");
    std::string mismatch;
    for (int s = 0; s < n; ++s) {
      const uint64_t* ss = reinterpret_cast<const uint64_t*>(readSlot(s));
      for (int t = 0; t < n; ++t) {
        const uint64_t* ts = reinterpret_cast<const uint64_t*>(readSlot(t));
        if (ss[t] != ts[n + s] && mismatch.empty()) {
          mismatch = fmt::format("rank {} sends {} bytes to rank {}, which expects {}", s, ss[t], t, ts[n + s]);
        }
        if (s != t) maxLen = std::max<size_t>(maxLen, ss[t]);
      }
    }
    if (!mismatch.empty()) throw DistError(fmt::format("shm: alltoall in group '{}': {}", group_, mismatch));
  }
  if (sendBytes[r]) std::memmove(recv[r], send[r], sendBytes[r]);
  for (size_t off = 0; off < maxLen; off += region) {
    uint8_t* w = writeSlot();
    for (int q = 0; q < n; ++q) {
      if (q != r && off < sendBytes[q])
        std::memcpy(w + q * region, send[q] + off, std::min(region, sendBytes[q] - off));
    }
    sync(dl, "alltoall");
    for (int q = 0; q < n; ++q) {
      if (q != r && off < recvBytes[q])
        std::memcpy(recv[q] + off, readSlot(q) + r * region, std::min(region, recvBytes[q] - off));
    }
  }
}

// ---- the collectives ---------------------------------------------------------------------------

void ShmBackend::allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    allreduceBytes(tensor.dataPtr(), static_cast<size_t>(tensor.numel()), tensor.dtype(), opts.op, dl);
    return {tensor};
  });
}

void ShmBackend::allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const size_t total = detail::packedBytes(tensors);
    std::vector<uint8_t> flat(total);
    detail::packBytes(tensors, flat.data(), "allreduce_coalesced");
    const DType dtype = tensors[0].dtype();
    allreduceBytes(flat.data(), total / elementSize(dtype), dtype, opts.op, dl);
    detail::unpackBytes(flat.data(), tensors, "allreduce_coalesced");
    return tensors;
  });
}

void ShmBackend::broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const size_t bytes = tensor.nbytes();
    uint8_t* d = bytesOf(tensor);
    if (size() == 1) return {tensor};
    for (size_t off = 0; off < bytes; off += slotBytes_) {
      const size_t len = std::min(slotBytes_, bytes - off);
      if (rank() == opts.root) std::memcpy(writeSlot(), d + off, len);
      sync(dl, "broadcast");
      if (rank() != opts.root) std::memcpy(d + off, readSlot(opts.root), len);
    }
    return {tensor};
  });
}

void ShmBackend::reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size(), r = rank();
    const size_t count = static_cast<size_t>(tensor.numel());
    if (n == 1) return {tensor};
    const DType dtype = tensor.dtype();
    const size_t es = elementSize(dtype);
    const size_t chunk = slotBytes_ / es;
    uint8_t* d = bytesOf(tensor);
    std::vector<const void*> srcs(n);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      if (r != opts.root) std::memcpy(writeSlot(), d + off * es, len * es);
      sync(dl, "reduce");
      if (r == opts.root) {
        for (int q = 0; q < n; ++q) srcs[q] = q == r ? d + off * es : readSlot(q);
        reduceSources(dtype, d + off * es, nullptr, srcs.data(), n, len, opts.op, n);
      }
    }
    return {tensor};
  });
}

void ShmBackend::allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& /*opts*/,
                           const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    std::vector<uint8_t*> outs(size());
    for (int q = 0; q < size(); ++q) outs[q] = bytesOf(outputs[q]);
    allgatherBytes(input.dataPtr(), input.nbytes(), outs, dl);
    return outputs;
  });
}

void ShmBackend::allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& /*opts*/,
                                     const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const size_t bytes = input.nbytes();
    std::vector<uint8_t*> outs(size());
    for (int q = 0; q < size(); ++q) outs[q] = bytesOf(output) + q * bytes;
    allgatherBytes(input.dataPtr(), bytes, outs, dl);
    return {output};
  });
}

void ShmBackend::allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                                    const AllgatherOptions& /*opts*/, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size();
    const size_t bytes = detail::packedBytes(inputs);
    std::vector<uint8_t> mine(bytes), all(bytes * n);
    detail::packBytes(inputs, mine.data(), "allgather_coalesced");
    std::vector<uint8_t*> outs(n);
    for (int q = 0; q < n; ++q) outs[q] = all.data() + q * bytes;
    allgatherBytes(mine.data(), bytes, outs, dl);
    std::vector<Tensor> flat;
    for (int q = 0; q < n; ++q) {
      detail::unpackBytes(all.data() + q * bytes, outputs[q], "allgather_coalesced");
      flat.insert(flat.end(), outputs[q].begin(), outputs[q].end());
    }
    return flat;
  });
}

void ShmBackend::reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                               const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    std::vector<const uint8_t*> pieces(size());
    for (int q = 0; q < size(); ++q) pieces[q] = bytesOf(inputs[q]);
    reduceScatterBytes(pieces, bytesOf(output), static_cast<size_t>(output.numel()), output.dtype(), opts.op, dl);
    return {output};
  });
}

void ShmBackend::reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                                     const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    std::vector<const uint8_t*> pieces(size());
    for (int q = 0; q < size(); ++q) pieces[q] = bytesOf(input) + q * output.nbytes();
    reduceScatterBytes(pieces, bytesOf(output), static_cast<size_t>(output.numel()), output.dtype(), opts.op, dl);
    return {output};
  });
}

void ShmBackend::reduceScatterBytes(const std::vector<const uint8_t*>& pieces, uint8_t* out, size_t count, DType dtype,
                                    ReduceOp op, Deadline dl) {
  const int n = size(), r = rank();
  if (count == 0) return;
  const size_t es = elementSize(dtype);
  std::vector<const void*> srcs(n);
  if (n == 1) {
    srcs[0] = pieces[0];
    reduceSources(dtype, out, nullptr, srcs.data(), 1, count, op, 1);
    return;
  }
  const size_t region = std::max<size_t>(64, slotBytes_ / n / 64 * 64);
  const size_t chunk = std::max<size_t>(1, region / es);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t len = std::min(chunk, count - off);
    uint8_t* w = writeSlot();
    for (int q = 0; q < n; ++q)
      if (q != r) std::memcpy(w + q * region, pieces[q] + off * es, len * es);
    sync(dl, "reduce_scatter");
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? pieces[r] + off * es : readSlot(q) + r * region;
    reduceSources(dtype, out + off * es, nullptr, srcs.data(), n, len, op, n);
  }
}

void ShmBackend::alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size();
    const bool equal = opts.inputSplitSizes.empty() && opts.outputSplitSizes.empty();
    auto split = [&](const Tensor& t, const std::vector<int64_t>& splits, auto* ptrs, std::vector<size_t>& bytes) {
      size_t rowBytes = t.elementSize();
      for (int64_t dd = 1; dd < t.dim(); ++dd) rowBytes *= static_cast<size_t>(t.size(dd));
      size_t off = 0;
      for (int q = 0; q < n; ++q) {
        const int64_t rows = splits.empty() ? (t.dim() ? t.size(0) / n : 0) : splits[q];
        bytes[q] = static_cast<size_t>(rows) * rowBytes;
        (*ptrs)[q] = bytesOf(t) + off;
        off += bytes[q];
      }
    };
    std::vector<const uint8_t*> send(n);
    std::vector<uint8_t*> recv(n);
    std::vector<size_t> sendBytes(n), recvBytes(n);
    split(input, opts.inputSplitSizes, &send, sendBytes);
    split(output, opts.outputSplitSizes, &recv, recvBytes);
    alltoallBytes(send, sendBytes, recv, recvBytes, equal, dl);
    return {output};
  });
}

void ShmBackend::alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                              const AlltoallOptions& /*opts*/, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size();
    std::vector<const uint8_t*> send(n);
    std::vector<uint8_t*> recv(n);
    std::vector<size_t> sendBytes(n), recvBytes(n);
    for (int q = 0; q < n; ++q) {
      send[q] = bytesOf(inputs[q]);
      sendBytes[q] = inputs[q].nbytes();
      recv[q] = bytesOf(outputs[q]);
      recvBytes[q] = outputs[q].nbytes();
    }
    alltoallBytes(send, sendBytes, recv, recvBytes, false, dl);
    return outputs;
  });
}

void ShmBackend::gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
                        const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size(), r = rank(), root = opts.root;
    const size_t bytes = input.nbytes();
    const uint8_t* in = bytesOf(input);
    if (bytes == 0) return outputs;
    if (r == root) std::memcpy(bytesOf(outputs[r]), in, bytes);
    if (n == 1) return outputs;
    for (size_t off = 0; off < bytes; off += slotBytes_) {
      const size_t len = std::min(slotBytes_, bytes - off);
      if (r != root) std::memcpy(writeSlot(), in + off, len);
      sync(dl, "gather");
      if (r == root) {
        for (int q = 0; q < n; ++q)
          if (q != r) std::memcpy(bytesOf(outputs[q]) + off, readSlot(q), len);
      }
    }
    return outputs;
  });
}

void ShmBackend::scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
                         const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    const int n = size(), r = rank(), root = opts.root;
    const size_t bytes = output.nbytes();
    uint8_t* out = bytesOf(output);
    if (bytes == 0) return {output};
    if (r == root) std::memcpy(out, bytesOf(inputs[r]), bytes);
    if (n == 1) return {output};
    const size_t region = std::max<size_t>(64, slotBytes_ / n / 64 * 64);
    for (size_t off = 0; off < bytes; off += region) {
      const size_t len = std::min(region, bytes - off);
      if (r == root) {
        uint8_t* w = writeSlot();
        for (int q = 0; q < n; ++q)
          if (q != r) std::memcpy(w + q * region, bytesOf(inputs[q]) + off, len);
      }
      sync(dl, "scatter");
      if (r != root) std::memcpy(out + off, readSlot(root) + r * region, len);
    }
    return {output};
  });
}

void ShmBackend::barrier(const BarrierOptions& /*opts*/, const WorkPtr& work) {
  run(work, [=, this](Deadline dl) mutable -> std::vector<Tensor> {
    sync(dl, "barrier");
    return {};
  });
}

}  // namespace cohort::dist::shm_backend
