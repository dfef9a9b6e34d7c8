/*
 * Communicator: the small, device-neutral interface the watchdog (watchdog.h) and the
 * communicator backends (comm_backend.h) work through. One communicator joins `size` ranks; it
 * moves raw buffers, and knows nothing of Tensors, Works or sequence numbers.
 *
 * What it does:
 *  - enqueue(ops, stream): queues a collective, a send or a receive — or several, as one group
 *    (NCCL's ncclGroupStart/End: the ops of a group make progress together, so a group of sends
 *    and receives cannot deadlock against itself, and DDP's buckets go out as one launch) — on a
 *    "stream", and returns at once with a completion handle. The stream is the implementation's
 *    own notion: a cudaStream_t for NCCL, ignored by the CPU fake (each fake rank has one).
 *  - CommCompletion::started()/done(): non-blocking queries. started() turns true when the op
 *    began executing on this rank (NCCL: an event recorded before it on the stream completed; the
 *    fake: its stream picked it up). A rank whose op never starts is stuck before it — in an
 *    earlier kernel, or never issued it — which is how the watchdog tells who never arrived.
 *  - asyncError(): an error the communicator hit after enqueue returned ("" when none): NCCL's
 *    ncclCommGetAsyncError, the fake's injected failure. Cheap; the watchdog polls it.
 *  - abort(): stops the communicator; ops still queued or running never complete (their
 *    completions stay not done), later enqueues throw DistError. Idempotent, callable from any
 *    thread while others enqueue (the watchdog aborts while the user's thread issues ops).
 *
 * Buffer conventions are NCCL's: `count` is the element count per rank — the buffer for
 * Allreduce, Broadcast, Reduce, Send and Recv; the send count for Allgather (recv holds
 * size * count); the receive count for ReduceScatter (send holds size * count). send == recv is
 * allowed (in place). Counts of 0 are valid no-ops that still complete in order.
 * A reduction over Bool is logical or (Sum, Max) or logical and (Product, Min), as on the CPU
 * backends; Avg is for floating types only (ProcessGroup checks).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <cohort/core/tensor/dtype.h>
#include <cohort/distributed/collective_options.h>

namespace cohort::dist {

enum class CommOpKind : uint8_t { Allreduce, Broadcast, Reduce, Allgather, ReduceScatter, Send, Recv };
const char* commOpKindName(CommOpKind k);

struct CommOp {
  CommOpKind kind = CommOpKind::Allreduce;
  const void* send = nullptr;  // Recv: unused
  void* recv = nullptr;        // Send: unused; Reduce: used on the root only
  size_t count = 0;            // elements (see above)
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;  // Allreduce, Reduce, ReduceScatter
  int peer = -1;                // the root (Broadcast, Reduce) or the peer (Send, Recv)
};

class CommCompletion {
 public:
  virtual ~CommCompletion() = default;
  virtual bool started() = 0;
  virtual bool done() = 0;
};
using CommCompletionPtr = std::shared_ptr<CommCompletion>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For messages: "nccl communicator of rank 0 of 2 on cuda:0".
  virtual std::string describe() const = 0;

  // Queues `ops` (one op, or several as one group) on `stream`; returns without waiting for any
  // peer. Throws DistError when the communicator is aborted or rejects the ops.
  virtual CommCompletionPtr enqueue(std::span<const CommOp> ops, void* stream) = 0;
  CommCompletionPtr enqueue(const CommOp& op, void* stream) { return enqueue(std::span<const CommOp>(&op, 1), stream); }

  virtual std::string asyncError() = 0;
  virtual void abort() = 0;
  virtual bool aborted() const = 0;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace cohort::dist
