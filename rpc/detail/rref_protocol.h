/*
 * Internal to RpcAgent: the RRef protocol, both the owner's side (the table of values this worker
 * owns and their reference counts) and the user's side (the requests a handle sends). rref.h is
 * what users see and states the counting rules; this is how the messages carry them out. An RRef
 * is named by (creator rank, creator-local number) and its owner's rank.
 *
 * Requests (wire.h's Op; each body starts with [creator, local]; the owner serves them on the
 * transport's I/O thread of the sender's pipe, in arrival order):
 *   RRefCreate  creator -> owner, remote(). Body [creator, local, type name, args], function fn.
 *               The owner records the value with count 1 (the creator's reference) before it
 *               serves anything later on that pipe, runs fn(args...) on its pool and keeps the
 *               result (or error) as the value; it responds (with none, or the error) once fn has
 *               run: the creator's RRefHandle::created. A creator other than the sender, or an id
 *               already known, is refused.
 *   RRefFetch   user -> owner, toHere(). Responds with the value once fn has run (or its error).
 *   RRefCall    user -> owner, rpcSync/rpcAsync on an RRef. Body [creator, local, args], function
 *               fn: the owner runs fn(value, args...) on its pool and responds with the result.
 *   RRefAddRef  a user forking a reference to a third worker -> owner. The owner counts +1 and
 *               acknowledges; the message carrying the fork leaves only after every acknowledgement
 *               (the agent sends forks() first, in its per-peer order). An unknown id ("its value
 *               is gone") fails the acknowledgement, and with it the message.
 *   RRefDecRef  a user whose last handle went -> owner, from the dropping thread, not waited for.
 *               The owner counts -1 and drops the value at 0. Served even while shutting down.
 * On the owner its own handles count locally: remote() to itself records the value and runs fn
 * on the pool, toHere() reads the table, a call on the value is a call to itself, and dropping a
 * handle counts -1 at once.
 *
 * References inside messages (wire.h's RRefWire says whether the sender counted the receiver's):
 * the owner counts one it sends as it encodes it (encoderFor); one a user sends to the owner goes
 * uncounted and the owner counts it as it decodes it (decoderFor), on the I/O thread, so that the
 * user's own later decrement on the same pipe cannot overtake it; one a user sends to a third
 * worker is counted by the RRefAddRef above. A receiver refuses an uncounted reference it does not
 * own and one naming a rank outside the world.
 *
 * When a worker dies, requests pending to it fail like any call (RpcAgent::failPeer): a creator's
 * `created`, a fetch, a call, a fork's acknowledgement and so the message carrying the fork.
 * Nothing tells an owner that a dead worker's references are gone, nor that a counted reference
 * was never delivered: those counts stay, and the value lives until the owner shuts down.
 * Decrements sent to a dead owner are lost; its users' handles stay, and every use fails naming it.
 * At shutdown the owner drops every value it holds, whatever the counts (dropOwned), and handles
 * released after the agent stopped send nothing.
 *
 * Threads: thread-safe. One lock guards the table and is never held while calling out; values are
 * dropped outside it (a value may hold RRefs, whose release comes back here). User functions run on
 * the agent's pool, through the hooks below.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/core/util/future.h>
#include <cohort/rpc/agent.h>
#include <cohort/rpc/value.h>
#include <cohort/rpc/wire.h>

namespace cohort::rpc {

class RRefProtocol {
 public:
  using Respond = std::function<void(EncodedFrame)>;
  // What the protocol needs of its agent beyond the agent's public methods.
  struct Hooks {
    // Runs `task` on the agent's worker pool; false (the task dropped) once the pool has stopped.
    std::function<bool(std::function<void()> task)> runOnPool;
    // Calls registered function `fn` with `args` (a List), in the distributed autograd context
    // `tag` names (none when its owner is -1); its failures come in the future.
    std::function<Future<Value>(const std::string& fn, Value args, const ContextTag& tag)> dispatch;
    // Responds to `request` from `to` with `result` once it completes (as any response: encoded
    // for `to`, forks counted first; an error result becomes "rpc 'f' on worker 'w' raised ...").
    std::function<void(int to, const Frame& request, Future<Value> result, Respond respond)> respond;
    // An error frame answering request `id` with `message` as it is.
    std::function<EncodedFrame(uint64_t id, const std::string& fn, const std::string& message)> errorFrame;
  };

  RRefProtocol(RpcAgent& agent, Hooks hooks);
  ~RRefProtocol();
  RRefProtocol(const RRefProtocol&) = delete;
  RRefProtocol& operator=(const RRefProtocol&) = delete;

  // ---- the user's side: RpcAgent's createRemote, fetchRRef, callOnRRef and releaseRRef ----
  std::shared_ptr<RRefHandle> createRemote(const std::string& to, const std::string& fn, List args,
                                           std::string typeName, Millis timeout);
  // A reference owned here to `value` (rpc::makeRRef).
  std::shared_ptr<RRefHandle> createLocal(Value value, std::string typeName);
  Future<Value> fetch(const std::shared_ptr<RRefHandle>& h, Millis timeout);
  Future<Value> callOn(const std::shared_ptr<RRefHandle>& h, const std::string& fn, List args, Millis timeout);
  void release(const RRefHandle& h) noexcept;

  // ---- the owner's side ----
  // Serves request `frame` (an RRef op) from `from`, on that pipe's I/O thread. Throws for a
  // malformed or refused request before it takes anything out of `frame` (the agent then responds
  // with the error).
  void serve(int from, Frame& frame, const Respond& respond);
  size_t ownedCount() const;  // values this worker owns that some reference still holds
  void dropOwned();           // shutdown: every owned value goes

  // ---- references inside messages ----
  RRefEncoder encoderFor(int to);
  RRefDecoder decoderFor(int from);
  // The references in `body` that a message to `to` forks to a third worker: an RRefAddRef with
  // body idValue(h->id()) must reach each one's owner, and be acknowledged, before it leaves.
  std::vector<std::shared_ptr<RRefHandle>> forks(const Value& body, int to) const;
  static Value idValue(const RRefId& id);

 private:
  struct Owned {
    int64_t count = 0;
    Future<Value> value;
    std::string typeName;
  };
  void incRef(const RRefId& id, const char* why);
  void decRef(const RRefId& id);
  Future<Value> ownedValue(const RRefId& id);
  std::shared_ptr<RRefHandle> makeHandle(int owner, const RRefId& id, std::string typeName);

  RpcAgent& agent_;
  const Hooks hooks_;
  std::atomic<uint64_t> nextLocal_{1};
  mutable std::mutex mu_;  // owned_
  std::map<RRefId, Owned> owned_;
};

}  // namespace cohort::rpc
