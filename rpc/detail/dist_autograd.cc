#include <cohort/rpc/detail/dist_autograd.h>

#include <condition_variable>
#include <set>
#include <tuple>
#include <unordered_map>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>
#include <cohort/rpc/agent.h>

namespace cohort::rpc {

namespace ag = ::cohort::autograd;
using autograd::ContextId;
using Clock = std::chrono::steady_clock;

namespace {

ContextId idFrom(const List& body, const char* what) {
  if (body.empty()) throw RpcError(fmt::format("malformed autograd {} request: no context id", what));
  return fromValue<ContextId>(body[0], fmt::format("autograd {} context", what));
}

const List& listOf(const Value& body, size_t n, const char* what) {
  if (body.kind() != Kind::List || body.toList().size() != n)
    throw RpcError(fmt::format("malformed autograd {} request: expected a list of {}", what, n));
  return body.toList();
}

}  // namespace

// ---- the graph's ends on each worker ----------------------------------------------------------

// Recorded on the worker that sent a tensor requiring grad: its gradient arrives in a grads
// message and flows on into the tensor's history.
class SendNode final : public ag::Node {
 public:
  SendNode(uint64_t id, int to, const Tensor& t) : id_(id), to_(to) {
    next_.push_back(ag::gradientEdge(t));
    inputMeta_.push_back({t.sizes(), t.dtype()});
    outputMeta_.push_back({t.sizes(), t.dtype()});
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return {std::move(grads.at(0))}; }
  std::string name() const override { return "SendRpcBackward"; }
  uint64_t id() const { return id_; }
  int to() const { return to_; }

 private:
  uint64_t id_;
  int to_;
};

// What this thread is running a round of (set by drain).
struct RunningRound {
  DistAutograd* container = nullptr;
  std::shared_ptr<DistAutograd::Context> ctx;
  std::shared_ptr<DistAutograd::Round> round;
};
thread_local RunningRound* tRound = nullptr;

// Recorded on the worker that received a tensor requiring grad (the tensor's gradFn): when it
// runs it sends the gradient back to the sender.
class RecvNode final : public ag::Node {
 public:
  RecvNode(ContextId ctx, int from, uint64_t sendId, const Tensor& t) : ctx_(ctx), from_(from), sendId_(sendId) {
    outputMeta_.push_back({t.sizes(), t.dtype()});
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "RecvRpcBackward"; }
  bool runsInline() const override { return true; }  // it only starts a send
  int from() const { return from_; }
  uint64_t sendId() const { return sendId_; }

 private:
  ContextId ctx_;
  int from_;
  uint64_t sendId_;
};

struct DistAutograd::Round {
  uint64_t number = 0;
  std::unique_ptr<ag::GraphTask> task;
  std::set<uint64_t> expected;  // sends discovered in this round
  // Gradients of receive functions that go straight to another sender: (the sender's rank, its
  // send id) -> the send they go to instead (the owner's pass-through plan, see backward()).
  std::map<std::pair<int, uint64_t>, std::pair<int, uint64_t>> redirects;
  bool executing = false;
  bool finished = false;   // every node ran and the callbacks too
  bool reported = false;   // (not the owner) done or abort sent
  size_t outstanding = 0;  // gradients sent and not yet acknowledged
  std::string error;       // the first failure
  // The owner's view.
  std::set<int> participants;
  std::set<int> done;
  uint64_t progress = 0;  // bumped by every event the owner waits for
};

struct DistAutograd::Context final : ag::GradStore {
  ContextId id;
  mutable std::mutex mu;  // everything below but the gradients
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<SendNode>> sends;
  std::set<int> peers;  // the owner: workers that joined; others: workers tensors went to or came from
  std::shared_ptr<Round> round;
  uint64_t rounds = 0;
  bool lastRetained = true;

  mutable std::mutex gradMu;
  std::unordered_map<const TensorImpl*, std::pair<std::shared_ptr<TensorImpl>, Tensor>> grads;

  Tensor get(const TensorImpl& leaf) const override {
    std::lock_guard<std::mutex> lock(gradMu);
    auto it = grads.find(&leaf);
    return it == grads.end() ? Tensor() : it->second.second;
  }
  void set(const std::shared_ptr<TensorImpl>& leaf, Tensor grad) override {
    std::lock_guard<std::mutex> lock(gradMu);
    grads[leaf.get()] = {leaf, std::move(grad)};
  }
};

std::vector<Tensor> RecvNode::apply(std::vector<Tensor>&& grads) {
  if (tRound == nullptr)
    throw ValueError(fmt::format("a local backward reached a tensor received over RPC in distributed autograd "
                                 "context {}: a graph that crosses workers runs with that context's backward "
                                 "(rpc::autograd::Context::backward)",
                                 ctx_.str()));
  if (!(tRound->ctx->id == ctx_))
    throw ValueError(fmt::format("the backward of distributed autograd context {} reached a tensor received in "
                                 "context {}: a context's graph may not use another context's tensors",
                                 tRound->ctx->id.str(), ctx_.str()));
  tRound->container->sendGradient(from_, sendId_, std::move(grads.at(0)));
  return {};
}

// ---- DistAutograd ------------------------------------------------------------------------------

DistAutograd::DistAutograd(RpcAgent& agent, std::function<bool(std::function<void()>)> runOnPool)
    : agent_(agent), self_(agent.self().rank), runOnPool_(std::move(runOnPool)) {}
DistAutograd::~DistAutograd() { shutdown(); }

std::string DistAutograd::workerName(int rank) const {
  try {
    return fmt::format("'{}' (rank {})", agent_.worker(rank).name, rank);
  } catch (...) {
    return fmt::format("rank {}", rank);
  }
}

ContextId DistAutograd::create() {
  auto ctx = std::make_shared<Context>();
  ctx->id = ContextId{self_, nextContext_.fetch_add(1)};
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) throw RpcError("rpc::autograd::Context: the RPC agent has shut down");
  contexts_.emplace(ctx->id, ctx);
  return ctx->id;
}

std::shared_ptr<DistAutograd::Context> DistAutograd::find(ContextId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

size_t DistAutograd::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return contexts_.size();
}

void DistAutograd::drop(ContextId id) {
  std::shared_ptr<Context> dying;  // destroyed outside the lock: the graph may be large
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = contexts_.find(id);
    if (it == contexts_.end()) return;
    dying = std::move(it->second);
    contexts_.erase(it);
  }
  std::lock_guard<std::mutex> lock(dying->mu);
  if (dying->round && dying->round->error.empty()) {
    dying->round->error = fmt::format("distributed autograd context {} was released", id.str());
    dying->cv.notify_all();
  }
}

std::shared_ptr<DistAutograd::Context> DistAutograd::ensure(ContextId id) {
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
    if (id.owner == self_ || stopped_) return nullptr;
    ctx = std::make_shared<Context>();
    ctx->id = id;
    contexts_.emplace(id, ctx);
  }
  // Whoever created the entry joins, once; a context that ended meanwhile is dropped again.
  agent_.send(id.owner, Op::Autograd, "join", List{toValue(id)}).addCallback([this, id](Future<Value> f) {
    bool live = false;
    try {
      live = f.value().toBool();
    } catch (...) {
    }
    if (!live) drop(id);
  });
  return ctx;
}

void DistAutograd::end(ContextId id) {
  std::shared_ptr<Context> ctx = find(id);
  if (!ctx) return;
  std::set<int> peers;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    peers = ctx->peers;
  }
  drop(id);
  for (int p : peers) {
    if (p == self_) continue;
    // Not waited for: a release that cannot be delivered finds the worker gone (and with it the
    // context), and the agent's shutdown waits for the rest.
    agent_.send(p, Op::Autograd, "release", List{toValue(id)}).addCallback([](Future<Value> f) {
      (void)f.exception();
    });
  }
}

std::vector<std::pair<Tensor, Tensor>> DistAutograd::gradients(ContextId id) const {
  auto ctx = find(id);
  if (!ctx)
    throw ValueError(fmt::format("distributed autograd context {} is not held by worker '{}' (it has ended, or "
                                 "never reached this worker)",
                                 id.str(), agent_.self().name));
  std::vector<std::pair<Tensor, Tensor>> out;
  std::lock_guard<std::mutex> lock(ctx->gradMu);
  out.reserve(ctx->grads.size());
  for (const auto& [impl, entry] : ctx->grads) out.emplace_back(Tensor(entry.first), entry.second);
  return out;
}

// ---- recording ---------------------------------------------------------------------------------

void DistAutograd::tagOutgoing(ContextId id, int to, Value& body, ContextTag& tag) {
  tag.owner = id.owner;
  tag.local = id.local;
  std::vector<std::pair<uint32_t, Tensor>> tensors;
  forEachTensor(body, [&](Tensor& t, uint32_t pos) {
    if (t.defined() && t.requiresGrad()) tensors.emplace_back(pos, t);
  });
  if (tensors.empty()) return;
  auto ctx = ensure(id);
  if (!ctx)
    throw ValueError(fmt::format("distributed autograd context {} has ended: a tensor that requires grad cannot "
                                 "be sent in it",
                                 id.str()));
  std::lock_guard<std::mutex> lock(ctx->mu);
  for (auto& [pos, t] : tensors) {
    uint64_t sid = nextSend_.fetch_add(1);
    ctx->sends.emplace(sid, std::make_shared<SendNode>(sid, to, t));
    tag.sends.emplace_back(pos, sid);
  }
  ctx->peers.insert(to);
}

void DistAutograd::attachIncoming(int from, Frame& frame) {
  if (frame.context.owner < 0 || frame.context.sends.empty()) return;
  ContextId id = detail::contextOf(frame.context);
  if (id.owner >= agent_.worldSize())
    throw RpcError(fmt::format("autograd context {} names no worker of the job", id.str()));
  auto ctx = ensure(id);
  if (!ctx) throw RpcError(fmt::format("distributed autograd context {} has ended on its owner", id.str()));
  size_t next = 0;
  const auto& sends = frame.context.sends;
  std::string bad;
  forEachTensor(frame.body, [&](Tensor& t, uint32_t pos) {
    if (next >= sends.size() || sends[next].first != pos) return;
    uint64_t sid = sends[next++].second;
    if (!t.isFloatingPoint()) {
      bad = fmt::format("a {} tensor is marked as requiring grad", t.dtype());
      return;
    }
    auto node = std::make_shared<RecvNode>(id, from, sid, t);
    ag::AutogradMeta& m = ag::autogradMeta(t);
    m.gradFn = node;
    m.outputNr = 0;
    m.requiresGrad = true;
  });
  if (!bad.empty()) throw RpcError("malformed autograd tag: " + bad);
  std::lock_guard<std::mutex> lock(ctx->mu);
  ctx->peers.insert(from);
}

// ---- backward ----------------------------------------------------------------------------------

namespace {
// The receive functions among `nodes`, by the worker that holds their sends.
std::map<int, List> recvsByWorker(const std::vector<ag::Node*>& nodes) {
  std::map<int, List> out;
  for (ag::Node* n : nodes)
    if (auto* r = dynamic_cast<RecvNode*>(n)) out[r->from()].push_back(Value(static_cast<int64_t>(r->sendId())));
  return out;
}
}  // namespace

void DistAutograd::backward(ContextId id, const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                            bool retainGraph) {
  auto ctx = find(id);
  if (!ctx) throw ValueError(fmt::format("distributed autograd context {} has ended", id.str()));
  if (roots.size() != grads.size())
    throw ValueError(fmt::format("Context::backward: {} roots but {} gradients", roots.size(), grads.size()));
  if (roots.empty()) throw ValueError("Context::backward: no roots");
  auto round = std::make_shared<Round>();
  std::map<int, List> discover;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (ctx->round) throw ValueError(fmt::format("a backward is already running in context {}", id.str()));
    if (ctx->rounds > 0 && !ctx->lastRetained)
      throw ValueError(fmt::format("Context::backward: context {} already ran a backward without retainGraph, which "
                                   "freed its graph; pass retainGraph=true to the first backward to run another",
                                   id.str()));
    round->number = ctx->rounds + 1;
    round->task = std::make_unique<ag::GraphTask>(retainGraph, ctx.get());
    round->task->setLock(&ctx->mu);
    for (size_t i = 0; i < roots.size(); ++i) {
      auto [e, g] = ag::checkedRoot(roots[i], grads[i], i, "Context::backward");
      round->task->addRoot(e, std::move(g));
    }
    discover = recvsByWorker(round->task->discover());
    ctx->rounds = round->number;
    ctx->lastRetained = retainGraph;
    round->participants.insert(self_);
    ctx->round = round;
  }
  struct Clear {
    const std::shared_ptr<Context>& ctx;
    const std::shared_ptr<Round>& round;
    ~Clear() {
      std::lock_guard<std::mutex> lock(ctx->mu);
      if (ctx->round == round) ctx->round = nullptr;
    }
  } clear{ctx, round};
  const std::string what =
      fmt::format("distributed backward of context {} on worker '{}'", id.str(), agent_.self().name);

  // Phase 1: every worker learns which of its sends will get a gradient.
  std::vector<std::pair<int, Future<Value>>> walks;
  for (auto& [rank, ids] : discover)
    walks.emplace_back(rank, agent_.send(rank, Op::Autograd, "discover",
                                         List{toValue(id), Value(static_cast<int64_t>(round->number)),
                                              Value(retainGraph), Value(std::move(ids))}));
  std::set<int> reached;
  for (auto& [rank, f] : walks) {
    try {
      for (int r : fromValue<std::vector<int>>(f.value(), "discover result")) reached.insert(r);
    } catch (const std::exception& e) {
      throw RpcError(
          fmt::format("{} failed while finding the graph on worker {}: {}", what, workerName(rank), e.what()));
    }
  }

  // Phase 2: run this worker's part here; the others run theirs as gradients reach them.
  const Millis timeout = agent_.options().rpcTimeout;
  uint64_t seen = 0;
  auto deadline = Clock::now() + timeout;
  // Pass-throughs: a send here whose tensor was a received one, unchanged and used for nothing
  // else, only hands its gradient on. Its gradient goes straight from the worker that computes it
  // to the worker that sent the tensor here, one transfer instead of two. Decided once discovery
  // is over everywhere (only then are the dependency counts final).
  std::vector<std::pair<int, Future<Value>>> plans;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    round->participants.insert(reached.begin(), reached.end());
    for (auto it = round->expected.begin(); it != round->expected.end();) {
      const std::shared_ptr<SendNode>& send = ctx->sends.at(*it);
      const auto& edges = send->nextEdges();
      auto* recv = edges.size() == 1 ? dynamic_cast<RecvNode*>(edges[0].fn.get()) : nullptr;
      if (recv == nullptr || recv->from() == send->to() || round->task->pendingInputs(recv) != 1 ||
          round->task->hasInput(recv) || round->task->hasInput(send.get())) {
        ++it;
        continue;
      }
      plans.emplace_back(send->to(),
                         agent_.send(send->to(), Op::Autograd, "redirect",
                                     List{toValue(id), Value(static_cast<int64_t>(round->number)),
                                          Value(static_cast<int64_t>(send->id())), Value(int64_t{recv->from()}),
                                          Value(static_cast<int64_t>(recv->sendId()))}));
      round->task->skip(send.get());
      round->task->skip(recv);
      it = round->expected.erase(it);
    }
  }
  for (auto& [rank, f] : plans) {
    if (auto e = (f.wait(), f.exception()))
      throw RpcError(
          fmt::format("{} failed while planning with worker {}: {}", what, workerName(rank), describeException(e)));
  }
  for (;;) {
    drain(ctx, round);
    std::unique_lock<std::mutex> lock(ctx->mu);
    if (!round->error.empty()) throw RpcError(fmt::format("{} failed: {}", what, round->error));
    bool othersDone = true;
    for (int p : round->participants)
      if (p != self_ && !round->done.count(p)) othersDone = false;
    if (round->finished && round->outstanding == 0 && othersDone) return;
    if (round->task->hasReady() && !round->executing) continue;
    if (round->progress != seen) {
      seen = round->progress;
      deadline = Clock::now() + timeout;
    }
    if (ctx->cv.wait_until(lock, deadline) == std::cv_status::timeout && round->progress == seen &&
        round->error.empty() && !(round->task->hasReady() && !round->executing)) {
      std::vector<std::string> missing;
      for (int p : round->participants)
        if (p != self_ && !round->done.count(p)) missing.push_back(workerName(p));
      std::string waiting = !round->finished
                                ? fmt::format("this worker still waits for gradients{}", missing.empty() ? "" : "; ")
                                : (round->outstanding ? "gradients sent from here are unacknowledged; " : "");
      throw RpcTimeoutError(fmt::format("{} made no progress for {} ms: {}{}", what, timeout.count(), waiting,
                                        missing.empty() ? std::string()
                                                        : fmt::format("worker(s) {} did not finish their part",
                                                                      fmt::join(missing, ", "))));
    }
  }
}

void DistAutograd::drain(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round) {
  std::unique_lock<std::mutex> lock(ctx->mu);
  if (round->executing || round->finished || !round->error.empty()) return;
  round->executing = true;
  RunningRound running{this, ctx, round};
  RunningRound* outer = std::exchange(tRound, &running);
  struct Restore {
    RunningRound* outer;
    ~Restore() { tRound = outer; }
  } restore{outer};
  ag::GraphTask& task = *round->task;
  ag::GraphTask::ExecScope scope(task);
  std::vector<Tensor> in;
  try {
    while (ag::Node* node = task.popReady(in)) {
      lock.unlock();
      std::vector<Tensor> out = task.runNode(node, std::move(in));
      lock.lock();
      task.propagate(node, std::move(out));
    }
    if (task.finished()) {
      // This worker's part is over: run what hooks queued (DDP's end of backward) on this thread.
      lock.unlock();
      task.runCallbacks();
      lock.lock();
      round->finished = true;
      ++round->progress;
    }
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    round->executing = false;
    ++round->progress;
    ctx->cv.notify_all();
    throw;
  }
  round->executing = false;
  ctx->cv.notify_all();
}

void DistAutograd::drainOnWorker(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round) {
  try {
    drain(ctx, round);
  } catch (const std::exception& e) {
    reportFailure(ctx, round, fmt::format("worker '{}' failed running its part: {}", agent_.self().name, e.what()));
    return;
  }
  maybeReportDone(ctx, round);
}

void DistAutograd::sendGradient(int to, uint64_t sendId, Tensor grad) {
  auto ctx = tRound->ctx;
  auto round = tRound->round;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (auto r = round->redirects.find({to, sendId}); r != round->redirects.end()) std::tie(to, sendId) = r->second;
    ++round->outstanding;
  }
  agent_
      .send(to, Op::Autograd, "grads",
            List{toValue(ctx->id), Value(static_cast<int64_t>(round->number)), Value(static_cast<int64_t>(sendId)),
                 Value(grad.contiguous())})
      .addCallback([this, ctx, round, to](Future<Value> f) {
        std::string error;
        if (auto e = f.exception())
          error = fmt::format("the gradient for worker {} could not be delivered: {}", workerName(to),
                              describeException(e));
        {
          std::lock_guard<std::mutex> lock(ctx->mu);
          --round->outstanding;
          ++round->progress;
          if (!error.empty() && round->error.empty() && ctx->id.owner == self_) round->error = error;
          ctx->cv.notify_all();
        }
        if (ctx->id.owner == self_) return;
        if (!error.empty()) reportFailure(ctx, round, error);
        else maybeReportDone(ctx, round);
      });
}

void DistAutograd::maybeReportDone(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round) {
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (!round->finished || round->outstanding > 0 || round->reported || !round->error.empty()) return;
    round->reported = true;
    if (ctx->round == round) ctx->round = nullptr;
  }
  agent_.send(ctx->id.owner, Op::Autograd, "done", List{toValue(ctx->id), Value(static_cast<int64_t>(round->number))})
      .addCallback([](Future<Value> f) { (void)f.exception(); });
}

void DistAutograd::reportFailure(const std::shared_ptr<Context>& ctx, const std::shared_ptr<Round>& round,
                                 std::string message) {
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (round->reported) return;
    round->reported = true;
    if (round->error.empty()) round->error = message;
    if (ctx->round == round) ctx->round = nullptr;
  }
  agent_
      .send(ctx->id.owner, Op::Autograd, "abort",
            List{toValue(ctx->id), Value(static_cast<int64_t>(round->number)), Value(std::move(message))})
      .addCallback([](Future<Value> f) { (void)f.exception(); });
}

// ---- serving -----------------------------------------------------------------------------------

Future<Value> DistAutograd::serve(int from, const std::string& what, const Value& body) {
  if (body.kind() != Kind::List) throw RpcError(fmt::format("malformed autograd {} request", what));
  const List& l = body.toList();
  if (what == "join") {
    ContextId id = idFrom(listOf(body, 1, "join"), "join");
    if (id.owner != self_)
      throw RpcError(fmt::format("worker '{}' does not own context {}", agent_.self().name, id.str()));
    auto ctx = find(id);
    if (!ctx) return Future<Value>::ready(Value(false));
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->peers.insert(from);
    return Future<Value>::ready(Value(true));
  }
  if (what == "release") {
    ContextId id = idFrom(listOf(body, 1, "release"), "release");
    if (id.owner != from) throw RpcError(fmt::format("rank {} released context {} it does not own", from, id.str()));
    drop(id);
    return Future<Value>::ready(Value());
  }
  if (what == "discover") return serveDiscover(l);
  if (what == "redirect") {
    // [id, round, send id on the owner, target rank, target send id], from the owner.
    const List& b = listOf(body, 5, "redirect");
    ContextId id = idFrom(b, "redirect");
    uint64_t number = fromValue<uint64_t>(b[1], "round");
    uint64_t sid = fromValue<uint64_t>(b[2], "send id");
    int target = fromValue<int>(b[3], "target rank");
    uint64_t targetSend = fromValue<uint64_t>(b[4], "target send id");
    if (id.owner != from) throw RpcError(fmt::format("rank {} planned for context {} it does not own", from, id.str()));
    if (target < 0 || target >= agent_.worldSize() || target == self_)
      throw RpcError(fmt::format("malformed autograd redirect to rank {}", target));
    auto ctx = find(id);
    if (!ctx) throw RpcError(fmt::format("worker '{}' does not hold context {}", agent_.self().name, id.str()));
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (!ctx->round || ctx->round->number != number)
      throw RpcError(
          fmt::format("worker '{}' runs no backward round {} of context {}", agent_.self().name, number, id.str()));
    ctx->round->redirects[{from, sid}] = {target, targetSend};
    ctx->peers.insert(target);
    return Future<Value>::ready(Value());
  }
  if (what == "grads") return serveGrads(from, l);
  if (what == "done" || what == "abort") {
    const List& b = listOf(body, what == "done" ? 2 : 3, what.c_str());
    ContextId id = idFrom(b, what.c_str());
    uint64_t number = fromValue<uint64_t>(b[1], "round");
    auto ctx = find(id);
    if (!ctx || id.owner != self_) return Future<Value>::ready(Value());  // ended meanwhile
    std::lock_guard<std::mutex> lock(ctx->mu);
    auto& round = ctx->round;
    if (!round || round->number != number) return Future<Value>::ready(Value());
    if (what == "done") round->done.insert(from);
    else if (round->error.empty()) round->error = fromValue<std::string>(b[2], "abort message");
    ++round->progress;
    ctx->cv.notify_all();
    return Future<Value>::ready(Value());
  }
  if (what == "peer_failed") {
    const List& b = listOf(body, 3, "peer_failed");
    ContextId id = idFrom(b, "peer_failed");
    int rank = fromValue<int>(b[1], "rank");
    auto ctx = find(id);
    if (!ctx || id.owner != self_) return Future<Value>::ready(Value());
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (ctx->round && ctx->round->error.empty()) {
      ctx->round->error = fmt::format("worker {} is gone (worker {} noticed: {})", workerName(rank), workerName(from),
                                      fromValue<std::string>(b[2], "why"));
      ctx->cv.notify_all();
    }
    return Future<Value>::ready(Value());
  }
  throw RpcError(fmt::format("unknown autograd request '{}'", what));
}

Future<Value> DistAutograd::serveDiscover(const List& body) {
  const List& b = body;
  if (b.size() != 4) throw RpcError("malformed autograd discover request");
  ContextId id = idFrom(b, "discover");
  uint64_t number = fromValue<uint64_t>(b[1], "round");
  bool retain = fromValue<bool>(b[2], "retain");
  auto ids = fromValue<std::vector<uint64_t>>(b[3], "send ids");
  auto ctx = find(id);
  if (!ctx)
    throw RpcError(fmt::format("distributed autograd context {} is not held by worker '{}' (it was released)", id.str(),
                               agent_.self().name));
  std::map<int, List> next;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (!ctx->round || ctx->round->number != number) {
      if (ctx->round && ctx->round->number > number) throw RpcError("a discover for an old round arrived");
      auto round = std::make_shared<Round>();
      round->number = number;
      round->task = std::make_unique<ag::GraphTask>(retain, ctx.get());
      round->task->setLock(&ctx->mu);
      ctx->round = round;
    }
    auto& round = *ctx->round;
    std::vector<ag::Node*> fresh;
    for (uint64_t sid : ids) {
      auto it = ctx->sends.find(sid);
      if (it == ctx->sends.end())
        throw RpcError(fmt::format("worker '{}' recorded no send {} in context {}", agent_.self().name, sid, id.str()));
      if (!round.expected.insert(sid).second) continue;
      auto f = round.task->discover(it->second);
      round.task->expectExternal(it->second.get());
      fresh.insert(fresh.end(), f.begin(), f.end());
    }
    next = recvsByWorker(fresh);
  }
  std::vector<Future<Value>> walks;
  for (auto& [rank, sids] : next)
    walks.push_back(
        agent_.send(rank, Op::Autograd, "discover",
                    List{toValue(id), Value(static_cast<int64_t>(number)), Value(retain), Value(std::move(sids))}));
  const int self = self_;
  return whenAll(walks).then([walks, self](Future<void> all) {
    all.wait();
    std::set<int> ranks{self};
    for (const auto& w : walks)
      for (int r : fromValue<std::vector<int>>(w.value(), "discover result")) ranks.insert(r);
    return toValue(std::vector<int>(ranks.begin(), ranks.end()));
  });
}

Future<Value> DistAutograd::serveGrads(int from, const List& b) {
  if (b.size() != 4) throw RpcError("malformed autograd grads request");
  ContextId id = idFrom(b, "grads");
  uint64_t number = fromValue<uint64_t>(b[1], "round");
  uint64_t sid = fromValue<uint64_t>(b[2], "send id");
  Tensor grad = fromValue<Tensor>(b[3], "gradient");
  auto ctx = find(id);
  if (!ctx)
    throw RpcError(fmt::format("distributed autograd context {} is not held by worker '{}' (it was released)", id.str(),
                               agent_.self().name));
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    round = ctx->round;
    if (!round || round->number != number)
      throw RpcError(
          fmt::format("worker '{}' runs no backward round {} of context {}", agent_.self().name, number, id.str()));
    auto it = ctx->sends.find(sid);
    if (it == ctx->sends.end() || !round->expected.count(sid))
      throw RpcError(
          fmt::format("worker '{}' expects no gradient for send {} in context {}", agent_.self().name, sid, id.str()));
    const ag::TensorMeta& meta = it->second->outputMeta()[0];
    if (grad.sizes() != meta.sizes || grad.dtype() != meta.dtype)
      throw RpcError(fmt::format("gradient {} {} for a tensor of {} {}", grad.dtype(), shapeStr(grad.sizes()),
                                 meta.dtype, shapeStr(meta.sizes)));
    round->expected.erase(sid);
    round->task->deliver(it->second.get(), 0, std::move(grad));
    ++round->progress;
    ctx->cv.notify_all();
  }
  (void)from;
  // Acknowledged at once; what the gradient unblocked runs on the pool (on the owner, on the
  // thread in backward()).
  if (id.owner != self_ && !runOnPool_([this, ctx, round] { drainOnWorker(ctx, round); }))
    throw RpcError("the agent has shut down");
  return Future<Value>::ready(Value());
}

// ---- failures and shutdown ---------------------------------------------------------------------

void DistAutograd::onPeerFailed(int rank, const std::string& why) {
  std::vector<std::shared_ptr<Context>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : contexts_) all.push_back(c);
  }
  for (auto& ctx : all) {
    if (ctx->id.owner == rank) {
      drop(ctx->id);  // its owner is gone: nobody will release it
      continue;
    }
    bool involved;
    {
      std::lock_guard<std::mutex> lock(ctx->mu);
      involved = ctx->peers.count(rank) || (ctx->round && ctx->round->participants.count(rank));
      if (involved && ctx->id.owner == self_ && ctx->round && ctx->round->error.empty()) {
        ctx->round->error = fmt::format("worker {} is gone: {}", workerName(rank), why);
        ctx->cv.notify_all();
      }
    }
    if (involved && ctx->id.owner != self_)
      agent_.send(ctx->id.owner, Op::Autograd, "peer_failed", List{toValue(ctx->id), Value(int64_t{rank}), Value(why)})
          .addCallback([](Future<Value> f) { (void)f.exception(); });
  }
}

void DistAutograd::shutdown() {
  std::map<ContextId, std::shared_ptr<Context>> dying;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    dying.swap(contexts_);
  }
  for (auto& [id, ctx] : dying) {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (ctx->round && ctx->round->error.empty()) {
      ctx->round->error = "the RPC agent shut down";
      ctx->cv.notify_all();
    }
  }
}

}  // namespace cohort::rpc
