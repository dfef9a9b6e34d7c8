/*
 * RpcAgent: one worker's endpoint of the RPC layer. It knows every worker of the job by name and
 * rank (rendezvous through a Store), sends requests and completes their futures when responses
 * arrive, serves requests by calling registered functions (registry.h), keeps the table of RRefs
 * this worker owns, and times out or fails calls whose peer is slow or gone.
 *
 * This class holds everything that does not depend on the transport: the pending-call table,
 * deadlines, dispatch to the registry, the outgoing order per peer and graceful shutdown. It owns
 * the RRef protocol (rref.h's rules carried out: the values this worker owns and their counts,
 * the RRef requests; rref_protocol.cc), hands it the RRef requests and the references in the
 * frames it encodes and decodes, and sends the forks it names before the message carrying them.
 * A transport (tensorpipe/tensorpipe_agent.h) moves encoded frames: it implements transmit() to a
 * peer and feeds what it receives to onRequest()/onResponse(), and reports broken peers with
 * failPeer().
 *
 * Errors callers see (all RpcError or its subclass RpcTimeoutError):
 *   - "rpc 'f' on worker 'ps' raised ValueError: <message>" — the function threw;
 *   - "rpc 'f' to worker 'ps' (rank 1) timed out after 500 ms" — the per-call deadline passed;
 *   - "rpc 'f' to worker 'ps' (rank 1) failed: the connection to 'ps' broke (...)" — the peer died;
 *   - unknown functions, wrong arguments and malformed frames, named by the callee.
 *
 * Threads (docs/thread_model.md): the transport's I/O threads decode frames and do the RRef
 * bookkeeping that must keep arrival order; user functions run on the agent's worker pool; caller
 * futures are completed on the pool too (so their callbacks may block or make nested calls); one
 * timer thread expires deadlines. Every public method is thread-safe.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cohort/core/util/future.h>
#include <cohort/distributed/store/store.h>
#include <cohort/rpc/registry.h>
#include <cohort/rpc/value.h>
#include <cohort/rpc/wire.h>

namespace cohort::rpc {

using Millis = std::chrono::milliseconds;
inline constexpr Millis kDefaultRpcTimeout{60'000};

struct WorkerInfo {
  std::string name;
  int rank = -1;
};

struct RpcOptions {
  // The rendezvous store (shared by all workers). Null: the default process group's store, under
  // the prefix "rpc" (dist::initProcessGroup() must have run).
  dist::StorePtr store{};
  Millis rpcTimeout = kDefaultRpcTimeout;  // per call, unless the call gives its own
  Millis initTimeout{60'000};              // rendezvous: every worker must arrive by then
  Millis shutdownTimeout{60'000};          // graceful shutdown: outstanding calls and the barrier
  int numWorkerThreads = 4;
  // The pool grows up to this many threads while all are busy (functions blocked on nested calls
  // would otherwise starve the completions they wait for; detail/thread_pool.h).
  int maxWorkerThreads = 256;
  // A worker thread that finished a task polls for the next one this long (yielding the CPU)
  // before it sleeps: a stream of calls then skips a thread wake-up per call (tiny calls ~30 µs
  // instead of ~75 µs here). 0 turns polling off, for hosts with more busy threads than cores.
  std::chrono::microseconds workerPoll{100};
  // Checked when a peer connects: a peer that cannot prove it holds the same secret is refused,
  // and its calls fail with an RpcError saying so. The secret itself never travels: the hello
  // carries an HMAC of it over a fresh nonce and a timestamp, and a replayed hello is refused
  // (hello_auth.h). It keeps strangers and stray jobs out; the traffic after the hello is neither
  // authenticated nor encrypted.
  std::string secret{};
  // The address other hosts reach this worker at over TCP. Empty: this host's name resolved, or
  // 127.0.0.1 when that fails.
  std::string tcpHost{};
  // Peers on the same host (and network namespace) talk over TensorPipe's shared-memory transport:
  // round trips of ~20 us instead of TCP's ~90 here. Its cost is a core: the transport's thread
  // polls without ever sleeping, one per process, busy even while the worker idles. Turn it off
  // (or set COHORT_RPC_SHM=0, which overrides this either way) where the workers keep every core
  // busy, as pipeline stages or compute-heavy RPC functions do: there the stolen core costs more
  // than the latency saves (a two-stage pipeline on two cores: 1.0-1.3x one process with it,
  // 1.2-1.4x without). Tensors between processes of one host move by cross-memory attach either way.
  bool useShm = true;
  bool useCma = true;  // tensors between processes of one host move by cross-memory attach
  // Threads that read one large tensor (2 MiB and up) out of the sender's memory at once: one
  // process_vm_readv moves ~4-5 GB/s here, two ~9. 0: one per core, at most 4.
  int copyThreads = 0;
  WireLimits limits{};
  std::string agent = "tensorpipe";  // which registered transport
};

// A call's deadline, for the overloads that take one: rpcSync<int>(Timeout{500ms}, "ps", "f", 1).
struct Timeout {
  Millis value;
};

class RRefHandle;
class RRefProtocol;
class DistAutograd;  // detail/dist_autograd.h
class ThreadPool;    // detail/thread_pool.h
struct RRefId {
  int32_t creator = -1;
  uint64_t local = 0;
  bool operator<(const RRefId& o) const { return creator != o.creator ? creator < o.creator : local < o.local; }
  bool operator==(const RRefId& o) const { return creator == o.creator && local == o.local; }
};

class RpcAgent : public std::enable_shared_from_this<RpcAgent> {
 public:
  RpcAgent(WorkerInfo self, int worldSize, RpcOptions options);
  virtual ~RpcAgent();
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  const WorkerInfo& self() const { return self_; }
  int worldSize() const { return worldSize_; }
  const RpcOptions& options() const { return options_; }
  // RpcError naming the unknown worker.
  WorkerInfo worker(const std::string& name) const;
  WorkerInfo worker(int rank) const;
  std::vector<WorkerInfo> workers() const;

  // Calls registered function `fn` on worker `to` with `args`. timeout 0: the agent's default.
  Future<Value> call(const std::string& to, const std::string& fn, List args, Millis timeout = Millis(0));
  // Sends one request of any kind (the RRef operations use it). The future completes on the pool.
  Future<Value> send(int rank, Op op, const std::string& fn, Value body, Millis timeout = Millis(0));

  // Graceful: waits (up to shutdownTimeout) for this worker's outstanding calls, then for every
  // worker to arrive at the same point (a store barrier), then closes. Otherwise fails everything
  // pending at once. Idempotent. Throws TimeoutError naming the missing workers when the barrier
  // times out (the agent is closed anyway).
  void shutdown(bool graceful = true);
  bool running() const { return state_.load() == State::Running; }

  // Calls this worker has sent and not seen answered (for tests and diagnostics).
  size_t pendingCalls() const;
  // RRefs this worker owns and some reference still holds.
  size_t ownedRRefs() const;

  // ---- the RRef protocol (rref.h is the typed face; see it for the rules) ----
  std::shared_ptr<RRefHandle> createRemote(const std::string& to, const std::string& fn, List args,
                                           std::string typeName, Millis timeout);
  std::shared_ptr<RRefHandle> createLocalRRef(Value value, std::string typeName);
  Future<Value> fetchRRef(const std::shared_ptr<RRefHandle>& h, Millis timeout);
  Future<Value> callOnRRef(const std::shared_ptr<RRefHandle>& h, const std::string& fn, List args, Millis timeout);
  void releaseRRef(const RRefHandle& h) noexcept;

  // ---- distributed autograd (autograd.h is the face; detail/dist_autograd.h the protocol) ----
  DistAutograd& distAutograd() { return *autograd_; }

 protected:
  // ---- what a transport implements ----
  // Sends an encoded request frame to `rank` on this worker's pipe to it. Failures are reported
  // later through failPeer().
  virtual void transmit(int rank, EncodedFrame frame) = 0;
  // Closes every connection and stops the transport's threads.
  virtual void closeTransport() = 0;

  // ---- what a transport calls ----
  using Respond = std::function<void(EncodedFrame)>;
  // A request from `from`, decoded with decoderFor(from). Call on the pipe's I/O thread, in order.
  void onRequest(int from, Frame frame, Respond respond);
  // A response or error frame on the pipe to `from`.
  void onResponse(int from, Frame frame);
  // The connection to `rank` is gone: every call pending to it fails naming it and `why`; later
  // calls to it fail at once.
  void failPeer(int rank, const std::string& why);
  RRefDecoder decoderFor(int from);
  dist::Store& store() { return *store_; }
  // An error frame (for refusals the transport sends before any request).
  EncodedFrame errorFrame(uint64_t id, const std::string& fn, const std::string& message) const;
  // Starts the pool and the timer (a transport's start calls it when connected).
  void startThreads();

  const WorkerInfo self_;
  const int worldSize_;
  const RpcOptions options_;
  std::vector<WorkerInfo> workers_;  // by rank, filled by the transport's rendezvous
  std::map<std::string, int> rankOf_;
  dist::StorePtr store_;

 private:
  enum class State { Running, Stopped };
  struct Pending {
    Future<Value> future;
    int rank;
    std::string what;  // "rpc 'f' to worker 'ps' (rank 1)"
    std::chrono::steady_clock::time_point deadline;
    Millis timeout;
  };
  Future<Value> dispatchCall(const std::string& fn, Value args);
  void respondWith(int to, const Frame& request, Future<Value> result, Respond respond);
  // Encodes `frame` for `to`, first counting the rrefs it carries at their owners; then `done`.
  void encodeFor(int to, Frame frame, Millis timeout, std::function<void(std::exception_ptr, EncodedFrame)> done);
  void completeOnPool(Future<Value> f, Value v);
  void failOnPool(Future<Value> f, std::exception_ptr e);
  std::optional<Pending> takePending(uint64_t id);
  // A new pending call; id 0 (and a failed future) when the peer is known dead.
  std::pair<uint64_t, Future<Value>> registerPending(int rank, const std::string& what, Millis timeout);
  // Requests leave for each peer in the order they were issued (send() explains why).
  struct OutQueue {
    uint64_t next = 0;  // the next place to hand out
    uint64_t head = 0;  // the next place to transmit
    std::map<uint64_t, std::optional<EncodedFrame>> ready;
    bool draining = false;  // a thread is transmitting this queue's ready frames
  };
  // Puts `frame` (empty: nothing to send) in place `slot` of the queue to `rank` and transmits
  // what is next in order; takes outMu_ itself.
  void markReady(int rank, uint64_t slot, std::optional<EncodedFrame> frame);
  void timerLoop();
  std::string describeCall(int rank, Op op, const std::string& fn) const;

  std::atomic<State> state_{State::Running};
  std::atomic<uint64_t> nextId_{1};

  mutable std::mutex mu_;  // pending_, deadlines_, deadPeers_
  std::condition_variable pendingCv_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::multimap<std::chrono::steady_clock::time_point, uint64_t> deadlines_;
  std::map<int, std::string> deadPeers_;
  bool timerStop_ = false;
  std::condition_variable timerCv_;
  // When the sleeping timer thread wakes by itself (min() while it is awake); under mu_.
  std::chrono::steady_clock::time_point timerWakeAt_ = std::chrono::steady_clock::time_point::min();
  std::thread timer_;

  std::mutex outMu_;  // out_; taken before mu_, never after
  std::vector<OutQueue> out_;

  // The RRefs this worker owns and the RRef requests it serves and sends (rpc/detail/rref_protocol.h).
  std::unique_ptr<RRefProtocol> rrefs_;

  std::unique_ptr<ThreadPool> pool_;
  // Distributed autograd contexts this worker holds (rpc/detail/dist_autograd.h).
  std::unique_ptr<DistAutograd> autograd_;
  std::once_flag shutdownOnce_;
};

using AgentPtr = std::shared_ptr<RpcAgent>;

// Transports register a factory by name (from a static initializer in their folder).
using AgentFactory = std::function<AgentPtr(const std::string& name, int rank, int worldSize, RpcOptions options)>;
void registerAgentFactory(const std::string& kind, AgentFactory factory);
std::vector<std::string> agentKinds();

// The RpcError (or RpcTimeoutError) a failed remote call carries, with its words.
std::string describeException(std::exception_ptr e);

}  // namespace cohort::rpc
