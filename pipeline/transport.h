/*
 * How a pipeline's activations and gradients travel between its ranks: one seam, two
 * implementations.
 *
 *  - processGroupTransport(pg, device): a process group's send/recv (shm, gloo, mpi, nccl). Each
 *    tensor goes as two messages under one tag: a header (dtype, shape and which backend carries
 *    the data) and the data, so the receiver needs no shape in advance. A tensor travels over the
 *    group's backend for its own device when there is one (CUDA tensors over NCCL, device to
 *    device); otherwise through the host and the group's CPU backend. Pipeline rank = the group's
 *    rank.
 *  - rpcTransport(workers): the RPC layer (TensorPipe). A send is an asynchronous call that
 *    delivers the tensor into the receiving worker's mailbox; on one host TensorPipe's CMA channel
 *    has the receiver read the tensor straight from the sender's memory. The served function only
 *    files the tensor and returns, so RPC threads are never held. Pipeline rank i = workers[i];
 *    rpc::init must have run. RPC carries CPU tensors: a CUDA tensor goes through the host.
 *    Where the ranks' compute threads keep every core busy, run the agent without TensorPipe's
 *    shared-memory transport (RpcOptions::useShm = false, or COHORT_RPC_SHM=0): its loop polls a
 *    core per process. Even so each transfer crosses several TensorPipe and RPC threads, each waiting
 *    for a core there, and the process-group transport (whose shm send copies on the caller's
 *    thread) is faster.
 *
 * Either way a received tensor is placed on the transport's device (`device`, where this rank's
 * stages run: the CPU, or a GPU), wherever it came from.
 *
 * Sends never block; recv blocks until the tensor sent with that (source, tag) arrives, or throws
 * TimeoutError after `timeout` naming the peer and tag. A dead sender fails it sooner: the process
 * group's backend reports the broken connection (PeerError), and the RPC transport's waiting
 * receive probes its sender every 100 ms with a tiny call, which fails (RpcError naming the
 * worker) once the agent has seen the connection break. flush() waits for every send this
 * transport started to be delivered, and rethrows the first failure (a dead peer). Tags are the
 * pipeline's business (pipeline.h numbers them by micro-batch, stage and direction); within one
 * (source, tag) pair tensors arrive in the order they were sent.
 *
 * A transport is used by one thread at a time (the pipeline's).
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/process_group.h>

namespace cohort::pipeline {

using Millis = std::chrono::milliseconds;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The largest tag this transport carries (tags are 0..maxTag()).
  virtual int64_t maxTag() const = 0;
  virtual void send(const Tensor& tensor, int dst, int64_t tag) = 0;
  virtual Tensor recv(int src, int64_t tag, Millis timeout) = 0;
  // A hint: a recv(src, tag) will come. A transport that must post receives (a process group)
  // starts receiving now, so the tensor moves while this rank computes. Optional to call and to
  // honour (the RPC transport receives eagerly anyway).
  virtual void expect(int /*src*/, int64_t /*tag*/) {}
  virtual void flush(Millis timeout) = 0;
  // How errors name pipeline rank `r` ("rank 1", "worker 'stage1'").
  virtual std::string describe(int r) const = 0;
  virtual std::string name() const = 0;  // "process group (gloo)", "process group (shm, nccl)", "rpc"
  // Where received tensors are placed (the device this rank's stages run on).
  virtual Device device() const { return Device::cpu(); }
};

using TransportPtr = std::shared_ptr<Transport>;

// NotSupportedError when the group can send neither CPU tensors nor ones on `device`.
TransportPtr processGroupTransport(dist::ProcessGroupPtr pg, Device device = Device::cpu());
// workers[i]: the RPC worker name of pipeline rank i; this worker must be one of them.
TransportPtr rpcTransport(std::vector<std::string> workers, Device device = Device::cpu());

}  // namespace cohort::pipeline
