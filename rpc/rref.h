/*
 * Remote references. remote<T>(to, fn, args...) runs `fn` on worker `to` and leaves its result
 * there; the caller gets an RRef<T> naming it. The worker holding the value is the owner; every
 * other worker holding an RRef to it is a user.
 *
 *   RRef<Tensor> w = rpc::remote<Tensor>("ps", "make_weights", 1024);
 *   Tensor local = w.toHere();                          // fetch a copy
 *   double n = w.rpcSync<double>("norm");               // runs norm(value) on the owner
 *   rpc::rpcSync<void>("trainer1", "use", w);           // pass the reference on
 *
 * Reference counting (the owner deletes the value exactly once, when the last reference anywhere
 * is gone): each RRefHandle on a user counts +1 at the owner and sends a decrement when it is
 * destroyed; each handle on the owner counts +1 locally. When a message carries an RRef, the
 * receiver's new handle must be counted before anyone can drop theirs:
 *   - sent by the owner: the owner counts it as it encodes the message;
 *   - sent by a user to the owner: the owner counts it as it decodes the message (requests and
 *     decrements from one worker travel on one pipe, in order, and are counted on the I/O thread
 *     in that order, so the sender's own later decrement cannot overtake it);
 *   - sent by a user to a third worker (a fork): the sender first asks the owner to count it and
 *     sends the message only once the owner acknowledged.
 * remote() counts the creator's reference with the creation request itself. A message that is
 * never delivered (its receiver died) leaves its count behind: the value then lives until the
 * owner shuts down.
 *
 * Threads: RRef<T> is a copyable handle (copies in one process share one reference); any thread
 * may use it. Dropping the last copy on a user sends the decrement from that thread without
 * blocking.
 */
#pragma once

#include <memory>
#include <string>

#include <cohort/rpc/agent.h>
#include <cohort/rpc/value.h>

namespace cohort::rpc {

class RRefHandle {
 public:
  RRefHandle(std::weak_ptr<RpcAgent> agent, int owner, RRefId id, std::string typeName, bool isOwner)
      : agent_(std::move(agent)), owner_(owner), id_(id), typeName_(std::move(typeName)), isOwner_(isOwner) {}
  ~RRefHandle();
  RRefHandle(const RRefHandle&) = delete;
  RRefHandle& operator=(const RRefHandle&) = delete;

  int owner() const { return owner_; }
  const RRefId& id() const { return id_; }
  const std::string& typeName() const { return typeName_; }
  bool isOwner() const { return isOwner_; }
  std::shared_ptr<RpcAgent> agent() const;
  // On the creator: completes when the owner ran the creating function (fails with its error).
  Future<Value> created;

 private:
  std::weak_ptr<RpcAgent> agent_;
  int owner_;
  RRefId id_;
  std::string typeName_;
  bool isOwner_;
};

std::shared_ptr<RpcAgent> currentAgent();  // rpc.h

template <typename T>
class RRef {
 public:
  RRef() = default;
  explicit RRef(std::shared_ptr<RRefHandle> h) : h_(std::move(h)) {}

  bool defined() const { return h_ != nullptr; }
  bool isOwner() const { return handle().isOwner(); }
  WorkerInfo owner() const { return agentOf()->worker(handle().owner()); }
  const std::shared_ptr<RRefHandle>& handlePtr() const { return h_; }

  // A copy of the value (on the owner: the value itself, once the creating function finished).
  Future<T> toHereAsync(Millis timeout = Millis(0)) const {
    return agentOf()->fetchRRef(h_, timeout).then([](Future<Value> f) {
      return fromValue<T>(f.value(), "rref value");
    });
  }
  T toHere(Millis timeout = Millis(0)) const { return toHereAsync(timeout).value(); }

  // Runs registered function `fn(value, args...)` on the owner.
  template <typename R, typename... Args>
  Future<R> rpcAsync(const std::string& fn, Args&&... args) const {
    return agentOf()
        ->callOnRRef(h_, fn, List{toValue(std::forward<Args>(args))...}, Millis(0))
        .then([fn](Future<Value> f) -> R {
          if constexpr (std::is_void_v<R>) f.wait();
          else return fromValue<R>(f.value(), "result of '" + fn + "'");
        });
  }
  template <typename R, typename... Args>
  R rpcSync(const std::string& fn, Args&&... args) const {
    auto f = rpcAsync<R>(fn, std::forward<Args>(args)...);
    if constexpr (std::is_void_v<R>) f.wait();
    else return f.takeValue();
  }

 private:
  const RRefHandle& handle() const {
    if (!h_) throw RpcError("an undefined RRef was used");
    return *h_;
  }
  std::shared_ptr<RpcAgent> agentOf() const {
    auto a = handle().agent();
    if (!a) throw RpcError("an RRef was used after its agent shut down");
    return a;
  }
  std::shared_ptr<RRefHandle> h_;
};

template <typename T>
struct Convert<RRef<T>> {
  static Value to(const RRef<T>& r) {
    if (!r.defined()) throw RpcError("an undefined RRef cannot be sent");
    return Value(r.handlePtr());
  }
  static RRef<T> from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::RRef) detail::throwConvert(where, name(), v);
    const auto& h = v.toRRef();
    if (h->typeName() != Convert<T>::name()) {
      throw RpcError(fmt::format("{}: expected {}, got rref<{}>", where, name(), h->typeName()));
    }
    return RRef<T>(h);
  }
  static std::string name() { return "rref<" + Convert<T>::name() + ">"; }
};

}  // namespace cohort::rpc
