/*
 * GlooBackend: the collectives over gloo's TCP transport (Debian's libgloo), registered as
 * "gloo". One gloo context per process group, connected at construction through the group's
 * store (a full mesh); the process shares one TCP device (its event loop thread) among them.
 *
 * Threads. The caller only enqueues: every collective runs on one of the backend's worker
 * threads (COHORT_GLOO_THREADS, default 2, as c10d's ProcessGroupGloo), which completes the
 * Work. Ops start in issue order; an allreduce may run beside earlier allreduces on other memory
 * (DDP's buckets: on a 2-core host the second bucket's transfer fills the first one's waits,
 * 0.87-0.91x PyTorch's DDP step against 1.03-1.07x with one thread), each tagged with its sequence
 * number on the wire; every other op runs alone, after everything issued before it (detail/op_queue.h). Send/recv are
 * posted at once on gloo unbound buffers (slot = the user's tag, apart from the collectives' slots) and completed by a
 * second thread that waits for them in order, so a recv waiting for its sender never holds up a collective.
 *
 * Timeouts and failures. Each op gets what is left of its Work's timeout as gloo's timeout, so a
 * dead or stalled peer fails the op (gloo IoException → PeerError, gloo timeout → TimeoutError,
 * both naming the op, group, sequence number and the ranks the store says are missing) instead
 * of hanging. After such a failure the gloo context is in an unknown state: the backend closes
 * its connections (so peers blocked on this rank fail promptly too) and every later op fails at
 * once with the first error, as c10d does with an aborted communicator.
 *
 * Closing is not always enough: gloo's TCP pair does not wake a send that was partly written when
 * its connection broke, so a rank could sit out its whole timeout in an op that its peers already
 * gave up. So the rank that breaks the group also raises the group's abort signal in the store
 * (detail/abort_signal.h), and a monitor thread reads that signal every 250 ms while an op of this
 * rank has been in flight for 250 ms or more. Once another rank raised it, the monitor breaks the
 * group here too and fails the collectives in flight at once: a TimeoutError when the origin
 * timed out, else a PeerError quoting the origin's error, each with the group's diagnosis of who
 * is missing. The worker thread still inside gloo stays there until gloo's own timeout, holding
 * the op's tensors (gloo may still write to them); later ops fail at once, but destroying the
 * group waits for that thread.
 *
 * Hot path. Contiguous float32/float64/integer allreduce runs in place on the tensor's memory
 * (no copies); float16/bfloat16 are widened to a float32 buffer and rounded back once.
 * reduce_scatter is an alltoall followed by a local reduction in rank order (the same bytes on
 * the wire as a ring reduce-scatter), since gloo's reduce_scatter is a legacy algorithm class
 * that must not share a context with gloo::allreduce (mixed on one context, later calls became
 * 50-180x slower in Debian's gloo).
 */
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <cohort/distributed/backend.h>

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace cohort::dist {
class OpQueue;  // detail/op_queue.h
struct OpFootprint;
namespace detail {
struct AbortSignal;  // detail/abort_signal.h
}
}  // namespace cohort::dist

namespace cohort::dist::gloo_backend {

class GlooBackend : public Backend {
 public:
  GlooBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts);
  ~GlooBackend() override;

  bool supports(OpType /*op*/) const override { return true; }

  void allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) override;
  void allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) override;
  void broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) override;
  void reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) override;
  void allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts,
                 const WorkPtr& work) override;
  void allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts,
                           const WorkPtr& work) override;
  void allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                          const AllgatherOptions& opts, const WorkPtr& work) override;
  void reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                     const WorkPtr& work) override;
  void reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                           const WorkPtr& work) override;
  void alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) override;
  void alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const AlltoallOptions& opts,
                    const WorkPtr& work) override;
  void gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
              const WorkPtr& work) override;
  void scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
               const WorkPtr& work) override;
  void barrier(const BarrierOptions& opts, const WorkPtr& work) override;
  void send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) override;
  void recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) override;

  void abort(const std::string& reason) override;

 private:
  // Runs `body` on the worker thread; it returns the op's outputs, and gloo's exceptions are
  // mapped onto the Work's typed errors.
  void enqueue(const WorkPtr& work, std::function<std::vector<Tensor>()> body);  // runs alone
  void enqueue(const WorkPtr& work, std::function<std::vector<Tensor>()> body, OpFootprint footprint);
  void runGuarded(const WorkPtr& work, const std::function<std::vector<Tensor>()>& body);
  bool isBroken() const;
  void p2pLoop();
  // Marks the backend broken with `error` (first one wins), closes the gloo connections, aborts
  // the waits of point-to-point ops still in flight (they fail with the group's error) and, unless
  // the break came from another rank's signal, raises the group's abort signal.
  void breakWith(std::exception_ptr error, bool raiseSignal = true);
  // The monitor (see above): started with the first op, stopped by the destructor.
  void startMonitor();
  void monitorLoop();
  // Whether a collective or a point-to-point wait has been in flight since `cutoff` or earlier.
  bool inFlightSince(std::chrono::steady_clock::time_point cutoff);
  // Another rank raised the abort signal: breaks the group and fails the collectives in flight.
  void stopForSignal(const ::cohort::dist::detail::AbortSignal& signal);
  static void abortWait(::gloo::transport::UnboundBuffer& buffer);
  std::exception_ptr brokenError() const;
  void postP2P(const WorkPtr& work, const Tensor& tensor, int peer, int tag, bool isSend);

  std::shared_ptr<::gloo::Context> context_;
  std::string group_;
  StorePtr store_;  // the backend's store: the group's abort signal

  mutable std::mutex mu_;  // broken_, diagnosing_, running_, leaked_, leakedTensors_
  std::exception_ptr broken_;
  // The collectives a worker thread is running, and since when. One the monitor fails is taken
  // out of here, so the worker, once gloo lets it go, leaves its Work alone.
  struct Running {
    WorkPtr work;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Running> running_;
  // The op that broke the group is diagnosing its error (asking the store which ranks are
  // missing, up to half a second); ops failed meanwhile as "aborted by an earlier error" wait for
  // that diagnosed error to quote it (brokenError), so every op names the missing ranks.
  bool diagnosing_ = false;
  mutable std::condition_variable brokenCv_;
  // Buffers of point-to-point ops that failed: gloo may still hold them, so they (and their
  // tensors' memory) live as long as the backend.
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> leaked_;
  std::vector<Tensor> leakedTensors_;
  std::unique_ptr<OpQueue> ops_;  // the collectives (COHORT_GLOO_THREADS workers)

  struct PendingP2P {
    WorkPtr work;
    Tensor tensor;  // keeps the memory alive
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    int peer;
    bool isSend;
  };
  // Point-to-point ops complete independently: each in-flight op is waited for by a thread of its
  // own (threads are kept and reused; one more starts when every one is busy), so a receive never
  // waits behind a send whose receiver has not posted yet, which could deadlock two ranks that
  // exchange in both directions.
  std::mutex p2pMu_;
  std::condition_variable p2pCv_;
  std::deque<PendingP2P> p2pQueue_;
  size_t p2pIdle_ = 0;  // waiters blocked on p2pCv_
  // Buffers a p2p thread is waiting on. When the group breaks their waits are aborted: gloo does not
  // wake a wait whose own connection is still open, so a receive from a live rank would otherwise
  // sit out its whole timeout after the group broke over another rank.
  std::vector<::gloo::transport::UnboundBuffer*> p2pWaiting_;
  bool p2pStop_ = false;
  std::vector<std::thread> p2pThreads_;

  std::once_flag monitorOnce_;
  std::mutex monitorMu_;  // monitorStop_
  std::condition_variable monitorCv_;
  bool monitorStop_ = false;
  std::thread monitor_;
};

}  // namespace cohort::dist::gloo_backend
