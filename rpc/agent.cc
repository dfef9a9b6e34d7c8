#include <cohort/rpc/agent.h>

#include <tuple>

#include <cohort/core/profiler/record.h>
#include <cohort/core/util/logging.h>
#include <cohort/rpc/detail/dist_autograd.h>
#include <cohort/rpc/detail/rref_protocol.h>
#include <cohort/rpc/detail/thread_pool.h>
#include <cohort/rpc/rref.h>

namespace cohort::rpc {

using Clock = std::chrono::steady_clock;

namespace {

std::mutex& factoryMu() {
  static std::mutex m;
  return m;
}
std::map<std::string, AgentFactory>& factories() {
  static std::map<std::string, AgentFactory> f;
  return f;
}

const char* errorTypeName(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const RpcTimeoutError&) {
    return "RpcTimeoutError";
  } catch (const RpcError&) {
    return "RpcError";
  } catch (const IndexError&) {
    return "IndexError";
  } catch (const ValueError&) {
    return "ValueError";
  } catch (const TimeoutError&) {
    return "TimeoutError";
  } catch (const PeerError&) {
    return "PeerError";
  } catch (const DistError&) {
    return "DistError";
  } catch (const NotSupportedError&) {
    return "NotSupportedError";
  } catch (const Error&) {
    return "Error";
  } catch (const std::exception&) {
    return "std::exception";
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

std::string describeException(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

void registerAgentFactory(const std::string& kind, AgentFactory factory) {
  std::lock_guard<std::mutex> lock(factoryMu());
  factories()[kind] = std::move(factory);
}
std::vector<std::string> agentKinds() {
  std::lock_guard<std::mutex> lock(factoryMu());
  std::vector<std::string> out;
  for (const auto& [k, f] : factories()) out.push_back(k);
  return out;
}
AgentFactory findAgentFactory(const std::string& kind) {
  std::lock_guard<std::mutex> lock(factoryMu());
  auto it = factories().find(kind);
  return it == factories().end() ? nullptr : it->second;
}

// ---- RpcAgent ------------------------------------------------------------------------------

RpcAgent::RpcAgent(WorkerInfo self, int worldSize, RpcOptions options)
    : self_(std::move(self)), worldSize_(worldSize), options_(std::move(options)), store_(options_.store) {
  if (worldSize_ < 1 || self_.rank < 0 || self_.rank >= worldSize_) {
    throw ValueError(fmt::format("rpc::init: rank {} is outside a world of {}", self_.rank, worldSize_));
  }
  if (self_.name.empty() || self_.name.size() > 256) {
    throw ValueError(fmt::format("rpc::init: a worker name must have 1 to 256 characters, got {}", self_.name.size()));
  }
  if (options_.numWorkerThreads < 1) throw ValueError("rpc::init: numWorkerThreads must be at least 1");
  if (options_.workerPoll.count() < 0 || options_.workerPoll > std::chrono::milliseconds(100)) {
    throw ValueError(
        fmt::format("rpc::init: workerPoll must be 0 to 100000 µs, got {} µs", options_.workerPoll.count()));
  }
  if (options_.copyThreads < 0 || options_.copyThreads > 64) {
    throw ValueError(
        fmt::format("rpc::init: copyThreads must be 0 (one per core) to 64, got {}", options_.copyThreads));
  }
  out_.resize(worldSize_);
  rrefs_ = std::make_unique<RRefProtocol>(
      *this, RRefProtocol::Hooks{
                 .runOnPool = [this](std::function<void()> task) { return pool_->run(std::move(task)); },
                 .dispatch =
                     [this](const std::string& fn, Value args, const ContextTag& tag) {
                       detail::ContextScope scope(detail::contextOf(tag));
                       return dispatchCall(fn, std::move(args));
                     },
                 .respond =
                     [this](int to, const Frame& request, Future<Value> result, RRefProtocol::Respond respond) {
                       respondWith(to, request, std::move(result), std::move(respond));
                     },
                 .errorFrame = [this](uint64_t id, const std::string& fn,
                                      const std::string& message) { return errorFrame(id, fn, message); },
             });
  autograd_ = std::make_unique<DistAutograd>(*this, [this](std::function<void()> task) {
    return pool_ != nullptr && pool_->run(std::move(task));
  });
}

RpcAgent::~RpcAgent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    timerStop_ = true;
  }
  timerCv_.notify_all();
  if (timer_.joinable()) timer_.join();
  if (pool_) pool_->stop();
}

void RpcAgent::startThreads() {
  pool_ = std::make_unique<ThreadPool>(options_.numWorkerThreads, options_.maxWorkerThreads, options_.workerPoll);
  timer_ = std::thread([this] { timerLoop(); });
}

WorkerInfo RpcAgent::worker(const std::string& name) const {
  auto it = rankOf_.find(name);
  if (it == rankOf_.end()) throw RpcError(fmt::format("no RPC worker is named '{}'", name));
  return workers_[it->second];
}
WorkerInfo RpcAgent::worker(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(workers_.size())) {
    throw RpcError(fmt::format("no RPC worker has rank {} (world of {})", rank, worldSize_));
  }
  return workers_[rank];
}
std::vector<WorkerInfo> RpcAgent::workers() const { return workers_; }

std::string RpcAgent::describeCall(int rank, Op op, const std::string& fn) const {
  std::string what = op == Op::Call ? fmt::format("rpc '{}'", fn)
                     : fn.empty()   ? fmt::format("{}", opName(op))
                                    : fmt::format("{} '{}'", opName(op), fn);
  return fmt::format("{} to worker '{}' (rank {})", what, workers_[rank].name, rank);
}

size_t RpcAgent::pendingCalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}
size_t RpcAgent::ownedRRefs() const { return rrefs_->ownedCount(); }

Future<Value> RpcAgent::call(const std::string& to, const std::string& fn, List args, Millis timeout) {
  return send(worker(to).rank, Op::Call, fn, Value(std::move(args)), timeout);
}

// A future that only has waiters (rpcSync, a plain wait) is completed right here, which saves the
// waiter one thread hand-off; one with callbacks is completed on the pool, so that user code never
// runs on a transport thread.
void RpcAgent::completeOnPool(Future<Value> f, Value v) {
  if (f.setValueIfNoCallbacks(v)) return;
  auto task = [f, v = std::move(v)]() mutable { f.setValue(std::move(v)); };
  if (!pool_ || !pool_->run(task)) task();
}
void RpcAgent::failOnPool(Future<Value> f, std::exception_ptr e) {
  if (f.setErrorIfNoCallbacks(e)) return;
  auto task = [f, e]() mutable { f.setError(e); };
  if (!pool_ || !pool_->run(task)) task();
}

Future<Value> RpcAgent::send(int rank, Op op, const std::string& fn, Value body, Millis timeout) {
  if (timeout.count() <= 0) timeout = options_.rpcTimeout;
  if (rank < 0 || rank >= worldSize_)
    return Future<Value>::failed(std::make_exception_ptr(RpcError(fmt::format("no RPC worker has rank {}", rank))));
  std::string what = describeCall(rank, op, fn);
  if (state_.load() != State::Running) {
    return Future<Value>::failed(std::make_exception_ptr(RpcError(what + " failed: the agent has shut down")));
  }
  // In a distributed autograd context, requests carry it, and their tensors that require grad
  // record sends (detail/dist_autograd.h). Calls to oneself share tensors, and so the graph.
  const autograd::ContextId context = detail::currentContext();
  if (rank == self_.rank) {
    // A call to oneself runs on the pool without encoding: arguments are shared, not copied.
    COHORT_CHECK(op == Op::Call, "the RRef protocol never sends {} to itself", opName(op));
    Future<Value> out;
    if (!pool_->run([this, out, fn, context, body = std::move(body)]() mutable {
          detail::ContextScope scope(context);
          Future<Value> r = dispatchCall(fn, std::move(body));
          r.addCallback([out, fn, this](Future<Value> d) mutable {
            if (auto e = d.exception()) {
              out.setError(
                  std::make_exception_ptr(RpcError(fmt::format("rpc '{}' on worker '{}' raised {}: {}", fn, self_.name,
                                                               errorTypeName(e), describeException(e)))));
            } else {
              out.setValue(d.value());
            }
          });
        })) {
      out.setError(std::make_exception_ptr(RpcError(what + " failed: the agent has shut down")));
    }
    return out;
  }
  ContextTag tag;
  if (context.valid() && op != Op::Autograd && op != Op::RRefAddRef && op != Op::RRefDecRef) {
    try {
      autograd_->tagOutgoing(context, rank, body, tag);
    } catch (...) {
      return Future<Value>::failed(std::current_exception());
    }
  }
  auto [id, fut] = registerPending(rank, what, timeout);
  if (id == 0) return fut;  // the peer is known dead
  // While the profiler records: the call from send to response on the "rpc client" track, with
  // the bytes that left, and a flow to where the peer served it.
  std::shared_ptr<int64_t> sentBytes;
  if (profiler::detail::active()) [[unlikely]] {
    sentBytes = std::make_shared<int64_t>(0);
    fut.addCallback([start = profiler::detail::nowNs(), sentBytes, id, rank, fn, op, self = self_.rank](Future<Value>) {
      profiler::detail::recordSpan(profiler::EventKind::Rpc, fmt::format("rpc {} {}", opName(op), fn), "rpc client",
                                   start, profiler::detail::nowNs(),
                                   {profiler::Arg::num("to", rank), profiler::Arg::num("id", static_cast<int64_t>(id)),
                                    profiler::Arg::num("bytes_sent", *sentBytes)},
                                   {profiler::Flow{fmt::format("rpc/{}/{}", self, id), true}});
    });
  }
  // Forks to third workers: the owner must count the receiver's reference before this message
  // leaves, so the addrefs go first. Later requests to `rank` must not overtake this one while it
  // waits for them (a fetch overtaking the create it follows would find no rref), so every
  // request takes a place in its peer's outgoing queue now and leaves in that order. The
  // addrefs and this request take their places together, under one lock: then no two requests
  // can each wait on an addref queued behind the other.
  std::vector<std::shared_ptr<RRefHandle>> forks = rrefs_->forks(body, rank);
  std::vector<Future<Value>> acks;
  std::vector<std::tuple<int, uint64_t, EncodedFrame>> addrefs;
  uint64_t slot;
  {
    std::lock_guard<std::mutex> lock(outMu_);
    for (const auto& h : forks) {
      int owner = h->owner();
      auto [aid, afut] = registerPending(owner, describeCall(owner, Op::RRefAddRef, ""), timeout);
      acks.push_back(afut);
      if (aid == 0) continue;
      Frame a;
      a.op = Op::RRefAddRef;
      a.id = aid;
      a.body = RRefProtocol::idValue(h->id());
      addrefs.emplace_back(owner, out_[owner].next++, encodeFrame(a));
    }
    slot = out_[rank].next++;
  }
  for (auto& [owner, aslot, frame] : addrefs) markReady(owner, aslot, std::move(frame));
  Frame f;
  f.kind = FrameKind::Request;
  f.op = op;
  f.id = id;
  f.function = fn;
  f.body = std::move(body);
  f.context = std::move(tag);
  auto finish = [this, rank, slot, id, f = std::move(f), sentBytes](std::exception_ptr e) {
    std::optional<EncodedFrame> enc;
    if (!e) {
      try {
        enc = encodeFrame(f, rrefs_->encoderFor(rank), options_.limits);
        if (sentBytes) {
          *sentBytes = static_cast<int64_t>(enc->payload.size());
          for (const Tensor& t : enc->tensors) *sentBytes += static_cast<int64_t>(t.nbytes());
        }
      } catch (...) {
        e = std::current_exception();
      }
    }
    if (e) {
      if (auto p = takePending(id)) {
        failOnPool(p->future,
                   std::make_exception_ptr(RpcError(fmt::format("{} failed: {}", p->what, describeException(e)))));
      }
    }
    markReady(rank, slot, std::move(enc));  // an empty slot only lets the queue move on
  };
  if (acks.empty()) {
    finish(nullptr);
  } else {
    whenAll(acks).addCallback([finish](Future<void> all) mutable { finish(all.exception()); });
  }
  return fut;
}

std::pair<uint64_t, Future<Value>> RpcAgent::registerPending(int rank, const std::string& what, Millis timeout) {
  uint64_t id = nextId_.fetch_add(1);
  Future<Value> fut;
  bool wakeTimer = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = deadPeers_.find(rank); it != deadPeers_.end()) {
      return {0,
              Future<Value>::failed(std::make_exception_ptr(RpcError(fmt::format("{} failed: {}", what, it->second))))};
    }
    auto deadline = Clock::now() + timeout;
    pending_.emplace(id, Pending{fut, rank, what, deadline, timeout});
    deadlines_.emplace(deadline, id);
    // Wake the timer only when it would sleep past this deadline: in a stream of calls with one
    // timeout each new deadline is later than the one it sleeps until, and a wake-up per call
    // would cost a context switch per call.
    wakeTimer = deadline < timerWakeAt_;
  }
  if (wakeTimer) timerCv_.notify_one();
  return {id, fut};
}

// Transmits outside outMu_: a transport may run its own callbacks inside transmit() (TensorPipe
// runs its event loop on the calling thread when it is idle), and those may send (a response that
// joins a distributed autograd context does). A send made meanwhile for the same peer, from
// that callback or another thread, only queues its frame: the thread draining the queue
// transmits it, in order, when the transmit in progress returns.
void RpcAgent::markReady(int rank, uint64_t slot, std::optional<EncodedFrame> frame) {
  std::unique_lock<std::mutex> lock(outMu_);
  OutQueue& q = out_[rank];
  q.ready.emplace(slot, std::move(frame));
  if (q.draining) return;
  q.draining = true;
  while (!q.ready.empty() && q.ready.begin()->first == q.head) {
    auto node = q.ready.extract(q.ready.begin());
    ++q.head;
    if (!node.mapped()) continue;
    lock.unlock();
    transmit(rank, std::move(*node.mapped()));
    lock.lock();
  }
  q.draining = false;
}

void RpcAgent::encodeFor(int to, Frame frame, Millis timeout,
                         std::function<void(std::exception_ptr, EncodedFrame)> done) {
  std::vector<std::shared_ptr<RRefHandle>> forks = rrefs_->forks(frame.body, to);
  auto encode = [this, to, frame = std::move(frame), done]() {
    EncodedFrame enc;
    try {
      enc = encodeFrame(frame, rrefs_->encoderFor(to), options_.limits);
    } catch (...) {
      done(std::current_exception(), {});
      return;
    }
    done(nullptr, std::move(enc));
  };
  // Forks to third workers: the owner counts the receiver's reference before the message leaves.
  std::vector<Future<Value>> acks;
  for (const auto& h : forks) {
    acks.push_back(send(h->owner(), Op::RRefAddRef, "", RRefProtocol::idValue(h->id()), timeout));
  }
  if (acks.empty()) {
    encode();
    return;
  }
  whenAll(acks).addCallback([encode, done](Future<void> all) {
    if (auto e = all.exception()) done(e, {});
    else encode();
  });
}

std::optional<RpcAgent::Pending> RpcAgent::takePending(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return std::nullopt;
  Pending p = std::move(it->second);
  pending_.erase(it);
  auto range = deadlines_.equal_range(p.deadline);
  for (auto d = range.first; d != range.second; ++d) {
    if (d->second == id) {
      deadlines_.erase(d);
      break;
    }
  }
  if (pending_.empty()) pendingCv_.notify_all();
  return p;
}

void RpcAgent::onResponse(int from, Frame frame) {
  if (frame.kind == FrameKind::Error && frame.id == 0) {
    // A refusal of the whole connection (wrong secret, unknown name).
    failPeer(from, fmt::format("worker '{}' refused the connection: {}", workers_[from].name, frame.message));
    return;
  }
  auto p = takePending(frame.id);
  if (!p) return;  // timed out meanwhile
  if (p->rank != from) {
    failOnPool(p->future,
               std::make_exception_ptr(RpcError(fmt::format("{}: the response came from rank {}", p->what, from))));
    return;
  }
  if (frame.kind == FrameKind::Response) {
    try {
      autograd_->attachIncoming(from, frame);
    } catch (...) {
      failOnPool(p->future,
                 std::make_exception_ptr(RpcError(fmt::format("{}: its result could not join its autograd context: {}",
                                                              p->what, describeException(std::current_exception())))));
      return;
    }
    completeOnPool(p->future, std::move(frame.body));
  } else {
    failOnPool(p->future, std::make_exception_ptr(RpcError(frame.message)));
  }
}

void RpcAgent::failPeer(int rank, const std::string& why) {
  std::vector<Pending> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.load() == State::Running) deadPeers_.emplace(rank, why);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.rank == rank) {
        failed.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto d = deadlines_.begin(); d != deadlines_.end();) {
      if (!pending_.count(d->second)) d = deadlines_.erase(d);
      else ++d;
    }
    if (pending_.empty()) pendingCv_.notify_all();
  }
  for (auto& p : failed) {
    failOnPool(p.future, std::make_exception_ptr(RpcError(fmt::format("{} failed: {}", p.what, why))));
  }
  if (state_.load() == State::Running) autograd_->onPeerFailed(rank, why);
}

void RpcAgent::timerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!timerStop_) {
    // Sleep until the earliest deadline, or a while when there is none; registerPending wakes
    // the timer early only for a deadline before timerWakeAt_.
    auto now = Clock::now();
    if (deadlines_.empty() || now < deadlines_.begin()->first) {
      timerWakeAt_ = deadlines_.empty() ? now + std::chrono::seconds(1) : deadlines_.begin()->first;
      timerCv_.wait_until(lock, timerWakeAt_);
      timerWakeAt_ = Clock::time_point::min();  // awake: a new deadline needs no wake-up
      continue;
    }
    uint64_t id = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (pending_.empty()) pendingCv_.notify_all();
    lock.unlock();
    failOnPool(p.future, std::make_exception_ptr(
                             RpcTimeoutError(fmt::format("{} timed out after {} ms", p.what, p.timeout.count()))));
    lock.lock();
  }
}

EncodedFrame RpcAgent::errorFrame(uint64_t id, const std::string& fn, const std::string& message) const {
  Frame f;
  f.kind = FrameKind::Error;
  f.id = id;
  f.function = fn;
  f.worker = self_.name;
  f.message = message;
  return encodeFrame(f);
}

// ---- serving -------------------------------------------------------------------------------

Future<Value> RpcAgent::dispatchCall(const std::string& fn, Value args) {
  try {
    auto f = FunctionRegistry::global().find(fn);
    if (!f) throw RpcError(fmt::format("no function named '{}' is registered", fn));
    if (args.kind() != Kind::List)
      throw RpcError(fmt::format("'{}': the arguments are a {}, not a list", fn, kindName(args.kind())));
    return f->handler(std::move(args.toList()));
  } catch (...) {
    return Future<Value>::failed(std::current_exception());
  }
}

void RpcAgent::respondWith(int to, const Frame& request, Future<Value> result, Respond respond) {
  uint64_t id = request.id;
  std::string fn = request.op == Op::Call
                       ? request.function
                       : (request.function.empty() ? std::string(opName(request.op)) : request.function);
  const autograd::ContextId context = detail::contextOf(request.context);
  result.addCallback([this, to, id, fn, context, respond = std::move(respond)](Future<Value> done) {
    Frame r;
    r.id = id;
    r.function = fn;
    r.worker = self_.name;
    if (auto e = done.exception()) {
      r.kind = FrameKind::Error;
      r.message =
          fmt::format("rpc '{}' on worker '{}' raised {}: {}", fn, self_.name, errorTypeName(e), describeException(e));
    } else {
      r.kind = FrameKind::Response;
      r.body = done.value();
      if (context.valid()) {
        try {
          autograd_->tagOutgoing(context, to, r.body, r.context);
        } catch (...) {
          r.kind = FrameKind::Error;
          r.body = Value();
          r.context = {};
          r.message =
              fmt::format("rpc '{}' on worker '{}': {}", fn, self_.name, describeException(std::current_exception()));
        }
      }
    }
    encodeFor(to, std::move(r), options_.rpcTimeout, [this, id, fn, respond](std::exception_ptr e, EncodedFrame enc) {
      if (e) {
        // The result could not be sent (a CUDA tensor, over the limits): the caller learns why.
        respond(errorFrame(id, fn,
                           fmt::format("rpc '{}' on worker '{}': its result could not be sent: {}", fn, self_.name,
                                       describeException(e))));
        return;
      }
      respond(std::move(enc));
    });
  });
}

void RpcAgent::onRequest(int from, Frame frame, Respond respond) {
  if (state_.load() != State::Running && frame.op != Op::RRefDecRef) {
    respond(errorFrame(frame.id, frame.function, fmt::format("worker '{}' has shut down", self_.name)));
    return;
  }
  try {
    if (frame.op != Op::Autograd) autograd_->attachIncoming(from, frame);
    switch (frame.op) {
      case Op::Call: {
        uint64_t id = frame.id;
        std::string fn = frame.function;
        auto task = [this, from, frame = std::move(frame), respond]() mutable {
          detail::ContextScope scope(detail::contextOf(frame.context));
          const int64_t start = profiler::detail::active() ? profiler::detail::nowNs() : 0;
          Future<Value> r = dispatchCall(frame.function, std::move(frame.body));
          if (start != 0) [[unlikely]] {
            // Served: from the pool picking the request up to the result being ready.
            r.addCallback([start, from, id = frame.id, fn = frame.function](Future<Value>) {
              profiler::detail::recordSpan(profiler::EventKind::Rpc, fmt::format("rpc serve {}", fn), "rpc server",
                                           start, profiler::detail::nowNs(),
                                           {profiler::Arg::num("from", from),
                                            profiler::Arg::num("id", static_cast<int64_t>(id))},
                                           {profiler::Flow{fmt::format("rpc/{}/{}", from, id), false}});
            });
          }
          respondWith(from, frame, r, respond);
        };
        if (!pool_->run(task)) respond(errorFrame(id, fn, "the agent has shut down"));
        return;
      }
      case Op::RRefCreate:
      case Op::RRefFetch:
      case Op::RRefCall:
      case Op::RRefAddRef:
      case Op::RRefDecRef: rrefs_->serve(from, frame, respond); return;
      case Op::Autograd: {
        uint64_t id = frame.id;
        std::string fn = frame.function;
        auto task = [this, from, frame = std::move(frame), respond]() mutable {
          Future<Value> r;
          try {
            r = autograd_->serve(from, frame.function, frame.body);
          } catch (...) {
            r = Future<Value>::failed(std::current_exception());
          }
          respondWith(from, frame, r, respond);
        };
        if (!pool_->run(task)) respond(errorFrame(id, fn, "the agent has shut down"));
        return;
      }
      case Op::Barrier: throw RpcError("unexpected barrier request");
    }
  } catch (...) {
    respondWith(from, frame, Future<Value>::failed(std::current_exception()), respond);
  }
}

// ---- RRefs: the protocol is in rref_protocol.cc --------------------------------------------

std::shared_ptr<RRefHandle> RpcAgent::createRemote(const std::string& to, const std::string& fn, List args,
                                                   std::string typeName, Millis timeout) {
  return rrefs_->createRemote(to, fn, std::move(args), std::move(typeName), timeout);
}
std::shared_ptr<RRefHandle> RpcAgent::createLocalRRef(Value value, std::string typeName) {
  return rrefs_->createLocal(std::move(value), std::move(typeName));
}
Future<Value> RpcAgent::fetchRRef(const std::shared_ptr<RRefHandle>& h, Millis timeout) {
  return rrefs_->fetch(h, timeout);
}
Future<Value> RpcAgent::callOnRRef(const std::shared_ptr<RRefHandle>& h, const std::string& fn, List args,
                                   Millis timeout) {
  return rrefs_->callOn(h, fn, std::move(args), timeout);
}
void RpcAgent::releaseRRef(const RRefHandle& h) noexcept { rrefs_->release(h); }
RRefDecoder RpcAgent::decoderFor(int from) { return rrefs_->decoderFor(from); }

// ---- shutdown ------------------------------------------------------------------------------

void RpcAgent::shutdown(bool graceful) {
  std::call_once(shutdownOnce_, [&] {
    std::exception_ptr barrierError;
    if (graceful) {
      auto deadline = Clock::now() + options_.shutdownTimeout;
      {
        std::unique_lock<std::mutex> lock(mu_);
        pendingCv_.wait_until(lock, deadline, [&] { return pending_.empty(); });
      }
      try {
        store_->set(fmt::format("shutdown/{}", self_.rank), std::string("1"));
        std::vector<std::string> keys;
        for (int r = 0; r < worldSize_; ++r) keys.push_back(fmt::format("shutdown/{}", r));
        auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
        try {
          store_->wait(keys, std::max(left, Millis(1)));
        } catch (const TimeoutError&) {
          // Name who is missing: the store's own message only lists keys.
          std::vector<std::string> missing;
          for (int r = 0; r < worldSize_; ++r) {
            bool there = false;
            try {
              there = store_->check({fmt::format("shutdown/{}", r)});
            } catch (...) {
            }
            if (!there) {
              std::string name;
              try {
                name = worker(r).name;
              } catch (...) {
              }
              missing.push_back(name.empty() ? fmt::format("rank {}", r) : fmt::format("'{}' (rank {})", name, r));
            }
          }
          throw TimeoutError(fmt::format(
              "rpc shutdown on worker '{}': {} did not reach shutdown within {} ms (RpcOptions::shutdownTimeout); "
              "this worker leaves without waiting longer, and calls to it from those still running will fail",
              self_.name, missing.empty() ? std::string("a worker") : fmt::format("{}", fmt::join(missing, ", ")),
              options_.shutdownTimeout.count()));
        }
      } catch (...) {
        barrierError = std::current_exception();
      }
      // Decrements sent while others were finishing.
      std::unique_lock<std::mutex> lock(mu_);
      pendingCv_.wait_until(lock, std::min(deadline, Clock::now() + Millis(2000)), [&] { return pending_.empty(); });
    }
    state_.store(State::Stopped);
    autograd_->shutdown();
    std::vector<Pending> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, p] : pending_) left.push_back(std::move(p));
      pending_.clear();
      deadlines_.clear();
      timerStop_ = true;
    }
    timerCv_.notify_all();
    for (auto& p : left) {
      failOnPool(p.future, std::make_exception_ptr(RpcError(fmt::format("{} failed: the agent shut down", p.what))));
    }
    closeTransport();
    if (timer_.joinable()) timer_.join();
    if (pool_) pool_->stop();
    rrefs_->dropOwned();
    if (barrierError) std::rethrow_exception(barrierError);
  });
}

}  // namespace cohort::rpc
