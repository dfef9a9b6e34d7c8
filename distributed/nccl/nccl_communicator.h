/*
 * NcclCommunicator: the Communicator (watchdog/communicator.h) over one NCCL communicator on one
 * CUDA device. Internal to the NCCL backend (nccl_backend.h) and its tests; built only with
 * COHORT_USE_NCCL.
 *
 * enqueue(ops, stream) records a start event on the stream (cudaStream_t), issues the ops — in
 * one ncclGroupStart/End when there are several or any is a send or receive (NCCL pairs a send
 * and a receive to the same rank only within a group) — and records an end event; the returned
 * NcclCompletion queries those events (cudaEventQuery: no host wait). Ops of 0 elements are
 * skipped (no-ops for NCCL too, and they may carry null buffers).
 * Types: float32/64, float16, bfloat16, int32/64 and uint8 map to NCCL's; bool travels as uint8
 * and reduces with max (sum, max, avg: logical or) or min (product, min: logical and), as c10d.
 *
 * Communicators are blocking (NCCL's default): ncclCommInitRank returns once every rank joined,
 * so a rank that never comes keeps the others in it (the store's timeout bounds only the
 * unique-id exchange before it). abort() runs ncclCommAbort, which makes kernels of this
 * communicator stuck on a peer return; it takes the enqueue lock first, waiting up to 2 s for an
 * enqueue in progress, and aborts anyway after that (an enqueue blocked that long is stuck inside
 * NCCL, and abort is what can free it).
 */
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <cohort/core/cuda/cuda.h>
#include <cohort/distributed/store/store.h>
#include <cohort/distributed/watchdog/communicator.h>

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace cohort::dist::nccl {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES).
using UniqueId = std::array<char, 128>;
// ncclGetUniqueId: needs no GPU (it picks the bootstrap network interface).
UniqueId makeUniqueId();
// Rank 0 makes an id and sets it under `key` in `store`; the others wait (up to `timeout`) and
// read it. Every rank returns the same id.
UniqueId exchangeUniqueId(Store& store, const std::string& key, int rank, Millis timeout);
// "2.28.9", from ncclGetVersion.
std::string version();

class NcclCompletion : public CommCompletion {
 public:
  bool started() override { return start.query(); }
  bool done() override { return end.query(); }
  cuda::Event start;
  cuda::Event end;
};

class NcclCommunicator : public Communicator {
 public:
  // Joins rank `rank` of `size` on CUDA device `device` (collective: blocks until every rank joined).
  static std::shared_ptr<NcclCommunicator> create(const UniqueId& id, int rank, int size, int device);
  // ncclCommSplit of `parent`: collective over every rank of the parent, each passing its color
  // (negative: not a member, which returns null) and its key (order in the new communicator).
  static std::shared_ptr<NcclCommunicator> split(NcclCommunicator& parent, int color, int key);
  ~NcclCommunicator() override;  // ncclCommDestroy (nothing more after abort)

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  std::string describe() const override;
  CommCompletionPtr enqueue(std::span<const CommOp> ops, void* stream) override;
  using Communicator::enqueue;
  std::string asyncError() override;
  void abort() override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }

 private:
  NcclCommunicator(ncclComm* comm, int rank, int size, int device);
  ncclComm* comm_;
  const int rank_, size_, device_;
  std::timed_mutex mu_;  // enqueue vs abort
  std::atomic<bool> aborted_{false};
};

}  // namespace cohort::dist::nccl
