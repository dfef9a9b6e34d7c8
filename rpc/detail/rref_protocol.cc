#include <cohort/rpc/detail/rref_protocol.h>

#include <algorithm>
#include <cstdint>

#include <cohort/core/util/check.h>
#include <cohort/core/util/logging.h>
#include <cohort/rpc/detail/dist_autograd.h>
#include <cohort/rpc/rref.h>

namespace cohort::rpc {

namespace {

// Walks a value tree for the rrefs it carries.
void collectRRefs(const Value& v, std::vector<std::shared_ptr<RRefHandle>>& out) {
  switch (v.kind()) {
    case Kind::RRef: out.push_back(v.toRRef()); break;
    case Kind::List:
      for (const auto& x : v.toList()) collectRRefs(x, out);
      break;
    case Kind::Dict:
      for (const auto& [k, x] : v.toDict()) collectRRefs(x, out);
      break;
    default: break;
  }
}

RRefId idFrom(const Value& v) {
  const List& l = v.toList();
  if (l.size() < 2) throw RpcError("malformed rref request: no rref id");
  int64_t c = l[0].toInt(), loc = l[1].toInt();
  if (c < 0 || c > INT32_MAX) throw RpcError(fmt::format("malformed rref request: creator rank {}", c));
  return RRefId{static_cast<int32_t>(c), static_cast<uint64_t>(loc)};
}

}  // namespace

// ---- RRefHandle ----------------------------------------------------------------------------

RRefHandle::~RRefHandle() {
  if (auto a = agent_.lock()) a->releaseRRef(*this);
}
std::shared_ptr<RpcAgent> RRefHandle::agent() const { return agent_.lock(); }

// ---- RRefProtocol --------------------------------------------------------------------------

RRefProtocol::RRefProtocol(RpcAgent& agent, Hooks hooks) : agent_(agent), hooks_(std::move(hooks)) {}

RRefProtocol::~RRefProtocol() = default;

Value RRefProtocol::idValue(const RRefId& id) {
  return Value(List{Value(int64_t{id.creator}), Value(static_cast<int64_t>(id.local))});
}

size_t RRefProtocol::ownedCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owned_.size();
}

void RRefProtocol::dropOwned() {
  std::map<RRefId, Owned> dying;  // values may hold rrefs whose release takes mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    dying.swap(owned_);
  }
  dying.clear();
}

// ---- the owner's side ----------------------------------------------------------------------

void RRefProtocol::serve(int from, Frame& frame, const Respond& respond) {
  switch (frame.op) {
    case Op::RRefCreate: {
      // body: [creator, local, type name, args]. Counted here, in arrival order, for the creator.
      const List& l = frame.body.toList();
      if (l.size() != 4) throw RpcError("malformed rref create request");
      RRefId id = idFrom(frame.body);
      if (id.creator != from)
        throw RpcError(fmt::format("rank {} created an rref in the name of rank {}", from, id.creator));
      Future<Value> value;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (owned_.count(id)) throw RpcError("rref created twice");
        owned_[id] = Owned{1, value, l[2].toStr()};
      }
      uint64_t reqId = frame.id;
      std::string fn = frame.function;
      auto task = [this, from, frame = std::move(frame), respond, value]() mutable {
        Value args = std::move(frame.body.toList()[3]);
        Future<Value> r = hooks_.dispatch(frame.function, std::move(args), frame.context);
        r.addCallback([value](Future<Value> d) mutable {
          if (auto e = d.exception()) value.setError(e);
          else value.setValue(d.value());
        });
        hooks_.respond(from, frame, r.then([](Future<Value> d) {
          d.wait();
          return Value();
        }),
                       respond);
      };
      if (!hooks_.runOnPool(std::move(task))) respond(hooks_.errorFrame(reqId, fn, "the agent has shut down"));
      return;
    }
    case Op::RRefFetch: {
      hooks_.respond(from, frame, ownedValue(idFrom(frame.body)), respond);
      return;
    }
    case Op::RRefCall: {
      const List& l = frame.body.toList();
      if (l.size() != 3) throw RpcError("malformed rref call request");
      Future<Value> value = ownedValue(idFrom(frame.body));
      Future<Value> result;
      value.addCallback([this, result, fn = frame.function, args = l[2], tag = frame.context](Future<Value> v) mutable {
        if (auto e = v.exception()) {
          result.setError(e);
          return;
        }
        if (args.kind() != Kind::List) {
          result.setError(std::make_exception_ptr(RpcError("malformed rref call request: arguments are not a list")));
          return;
        }
        List full;
        full.push_back(v.value());
        for (auto& a : args.toList()) full.push_back(std::move(a));
        if (!hooks_.runOnPool([this, result, fn, tag, full = std::move(full)]() mutable {
              Future<Value> r = hooks_.dispatch(fn, Value(std::move(full)), tag);
              r.addCallback([result](Future<Value> d) mutable {
                if (auto e = d.exception()) result.setError(e);
                else result.setValue(d.value());
              });
            })) {
          result.setError(std::make_exception_ptr(RpcError("the agent has shut down")));
        }
      });
      hooks_.respond(from, frame, result, respond);
      return;
    }
    case Op::RRefAddRef: {
      incRef(idFrom(frame.body), "a fork");
      hooks_.respond(from, frame, Future<Value>::ready(Value()), respond);
      return;
    }
    case Op::RRefDecRef: {
      decRef(idFrom(frame.body));
      hooks_.respond(from, frame, Future<Value>::ready(Value()), respond);
      return;
    }
    case Op::Call:
    case Op::Barrier:
    case Op::Autograd: break;
  }
  COHORT_CHECK(false, "{} is not an RRef request", opName(frame.op));
}

void RRefProtocol::incRef(const RRefId& id, const char* why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(id);
  if (it == owned_.end()) {
    throw RpcError(fmt::format("rref ({}, {}) is unknown on its owner '{}' ({}): its value is gone", id.creator,
                               id.local, agent_.self().name, why));
  }
  ++it->second.count;
}

void RRefProtocol::decRef(const RRefId& id) {
  Future<Value> dying;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owned_.find(id);
    if (it == owned_.end()) {
      throw RpcError(fmt::format("rref ({}, {}) released on '{}' more often than it was counted", id.creator, id.local,
                                 agent_.self().name));
    }
    if (--it->second.count == 0) {
      dying = std::move(it->second.value);
      owned_.erase(it);
    }
  }
}

Future<Value> RRefProtocol::ownedValue(const RRefId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(id);
  if (it == owned_.end()) {
    throw RpcError(fmt::format("rref ({}, {}) is unknown on its owner '{}'", id.creator, id.local, agent_.self().name));
  }
  return it->second.value;
}

// ---- references inside messages ------------------------------------------------------------

std::shared_ptr<RRefHandle> RRefProtocol::makeHandle(int owner, const RRefId& id, std::string typeName) {
  return std::make_shared<RRefHandle>(agent_.weak_from_this(), owner, id, std::move(typeName),
                                      owner == agent_.self().rank);
}

RRefEncoder RRefProtocol::encoderFor(int to) {
  return [this, to](const std::shared_ptr<RRefHandle>& h) {
    RRefWire w{h->owner(), h->id().creator, h->id().local, h->owner() != to, h->typeName()};
    if (h->owner() == agent_.self().rank) incRef(h->id(), "sending it");
    return w;
  };
}

RRefDecoder RRefProtocol::decoderFor(int from) {
  return [this, from](const RRefWire& w) -> std::shared_ptr<RRefHandle> {
    const int worldSize = agent_.worldSize();
    if (w.owner >= worldSize || w.creator >= worldSize) {
      throw RpcError(fmt::format("rref names rank {} in a world of {}", std::max(w.owner, w.creator), worldSize));
    }
    RRefId id{w.creator, w.local};
    if (w.owner == agent_.self().rank) {
      if (!w.counted) incRef(id, fmt::format("sent back by rank {}", from).c_str());
    } else if (!w.counted) {
      throw RpcError(fmt::format("rank {} sent an uncounted reference to an rref owned by rank {}", from, w.owner));
    }
    return makeHandle(w.owner, id, w.typeName);
  };
}

std::vector<std::shared_ptr<RRefHandle>> RRefProtocol::forks(const Value& body, int to) const {
  std::vector<std::shared_ptr<RRefHandle>> rrefs;
  collectRRefs(body, rrefs);
  const int self = agent_.self().rank;
  rrefs.erase(std::remove_if(rrefs.begin(), rrefs.end(),
                             [&](const std::shared_ptr<RRefHandle>& h) {
                               return h->owner() == self || h->owner() == to;
                             }),
              rrefs.end());
  return rrefs;
}

// ---- the user's side -----------------------------------------------------------------------

std::shared_ptr<RRefHandle> RRefProtocol::createRemote(const std::string& to, const std::string& fn, List args,
                                                       std::string typeName, Millis timeout) {
  const int self = agent_.self().rank;
  int owner = agent_.worker(to).rank;
  RRefId id{self, nextLocal_.fetch_add(1)};
  if (owner == self) {
    Future<Value> value;
    {
      std::lock_guard<std::mutex> lock(mu_);
      owned_[id] = Owned{1, value, typeName};
    }
    auto h = makeHandle(owner, id, std::move(typeName));
    h->created = value.then([](Future<Value> d) {
      d.wait();
      return Value();
    });
    ContextTag tag;  // the creating function runs in the caller's distributed autograd context
    tag.owner = detail::currentContext().owner;
    tag.local = detail::currentContext().local;
    if (!hooks_.runOnPool([this, fn, args = std::move(args), value, tag]() mutable {
          Future<Value> r = hooks_.dispatch(fn, Value(std::move(args)), tag);
          r.addCallback([value](Future<Value> d) mutable {
            if (auto e = d.exception()) value.setError(e);
            else value.setValue(d.value());
          });
        })) {
      value.setError(std::make_exception_ptr(RpcError("the agent has shut down")));
    }
    return h;
  }
  auto h = makeHandle(owner, id, typeName);
  List body{Value(int64_t{id.creator}), Value(static_cast<int64_t>(id.local)), Value(typeName), Value(std::move(args))};
  h->created = agent_.send(owner, Op::RRefCreate, fn, Value(std::move(body)), timeout);
  return h;
}

std::shared_ptr<RRefHandle> RRefProtocol::createLocal(Value value, std::string typeName) {
  const int self = agent_.self().rank;
  RRefId id{self, nextLocal_.fetch_add(1)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    owned_[id] = Owned{1, Future<Value>::ready(std::move(value)), typeName};
  }
  auto h = makeHandle(self, id, std::move(typeName));
  h->created = Future<Value>::ready(Value());
  return h;
}

Future<Value> RRefProtocol::fetch(const std::shared_ptr<RRefHandle>& h, Millis timeout) {
  if (h->isOwner()) {
    try {
      return ownedValue(h->id());
    } catch (...) {
      return Future<Value>::failed(std::current_exception());
    }
  }
  return agent_.send(h->owner(), Op::RRefFetch, "", idValue(h->id()), timeout);
}

Future<Value> RRefProtocol::callOn(const std::shared_ptr<RRefHandle>& h, const std::string& fn, List args,
                                   Millis timeout) {
  if (h->isOwner()) {
    return fetch(h, timeout).then([this, fn, args = std::move(args)](Future<Value> v) mutable {
      List full;
      full.push_back(v.value());
      for (auto& a : args) full.push_back(std::move(a));
      return agent_.send(agent_.self().rank, Op::Call, fn, Value(std::move(full)));
    });
  }
  List body{Value(int64_t{h->id().creator}), Value(static_cast<int64_t>(h->id().local)), Value(std::move(args))};
  return agent_.send(h->owner(), Op::RRefCall, fn, Value(std::move(body)), timeout);
}

void RRefProtocol::release(const RRefHandle& h) noexcept {
  try {
    if (h.isOwner()) {
      decRef(h.id());
    } else if (agent_.running()) {
      agent_.send(h.owner(), Op::RRefDecRef, "", idValue(h.id()));
    }
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "rpc: releasing rref ({}, {}) failed: {}", h.id().creator, h.id().local, e.what());
  }
}

}  // namespace cohort::rpc
