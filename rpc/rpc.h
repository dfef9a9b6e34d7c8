/*
 * The RPC layer's front door: join the job's RPC workers, call functions on them, hold remote
 * references, and leave.
 *
 *   rpc::registerFunction("add", [](int64_t a, int64_t b) { return a + b; });
 *   rpc::init("trainer0", rank, worldSize, {.store = store});
 *   int64_t s = rpc::rpcSync<int64_t>("ps", "add", 1, 2);
 *   Future<Tensor> f = rpc::rpcAsync<Tensor>("ps", "step", grad);
 *   rpc::shutdown();   // waits for every worker's outstanding calls
 *
 * One agent per process (the current agent) serves the free functions; init() makes it and
 * shutdown() ends it, after which init() may run again. Errors: RpcError (and RpcTimeoutError)
 * as agent.h lists them; rpcSync rethrows them, rpcAsync's future carries them.
 *
 * Threads: every function here is thread-safe; rpcSync blocks the calling thread until the
 * response or the call's deadline.
 */
#pragma once

#include <string>
#include <utility>

#include <cohort/rpc/agent.h>
#include <cohort/rpc/registry.h>
#include <cohort/rpc/rref.h>
#include <cohort/rpc/value.h>

namespace cohort::rpc {

// Starts this process's agent (options.agent, "tensorpipe" by default) and waits for all
// `worldSize` workers. RpcError when a worker is already running here, the name is taken, or the
// others do not arrive within options.initTimeout.
AgentPtr init(const std::string& name, int rank, int worldSize, RpcOptions options = {});
// Graceful by default (agent.h). No-op when no agent runs.
void shutdown(bool graceful = true);
// The current agent; RpcError when init() has not run.
AgentPtr currentAgent();
bool isInitialized();
WorkerInfo getWorkerInfo(const std::string& name);
WorkerInfo getWorkerInfo();  // this worker

namespace detail {
template <typename R>
Future<R> typed(Future<Value> f, std::string fn) {
  return f.then([fn = std::move(fn)](Future<Value> d) -> R {
    if constexpr (std::is_void_v<R>) {
      d.wait();
    } else {
      return fromValue<R>(d.value(), "result of '" + fn + "'");
    }
  });
}
}  // namespace detail

template <typename R = Value, typename... Args>
Future<R> rpcAsync(Timeout timeout, const std::string& to, const std::string& fn, Args&&... args) {
  return detail::typed<R>(currentAgent()->call(to, fn, List{toValue(std::forward<Args>(args))...}, timeout.value), fn);
}
template <typename R = Value, typename... Args>
Future<R> rpcAsync(const std::string& to, const std::string& fn, Args&&... args) {
  return rpcAsync<R>(Timeout{Millis(0)}, to, fn, std::forward<Args>(args)...);
}
template <typename R = Value, typename... Args>
R rpcSync(Timeout timeout, const std::string& to, const std::string& fn, Args&&... args) {
  // No deadline of its own: the call's future fails with RpcTimeoutError at its deadline. The
  // result is converted here, on the calling thread: with no callback on the call's future, the
  // agent completes it straight from the transport thread, one thread hand-off fewer.
  Future<Value> f = currentAgent()->call(to, fn, List{toValue(std::forward<Args>(args))...}, timeout.value);
  if constexpr (std::is_void_v<R>) f.wait();
  else return fromValue<R>(f.takeValue(), "result of '" + fn + "'");
}
template <typename R = Value, typename... Args>
R rpcSync(const std::string& to, const std::string& fn, Args&&... args) {
  return rpcSync<R>(Timeout{Millis(0)}, to, fn, std::forward<Args>(args)...);
}

// Runs fn(args...) on `to` and returns a reference to its result, which stays there.
template <typename T, typename... Args>
RRef<T> remote(const std::string& to, const std::string& fn, Args&&... args) {
  return RRef<T>(
      currentAgent()->createRemote(to, fn, List{toValue(std::forward<Args>(args))...}, typeName<T>(), Millis(0)));
}

// A reference owned by this worker to `value` (for example a parameter of a module held here, to
// hand to a DistributedOptimizer): on this worker toHere() returns `value` itself (a tensor is
// the same tensor, not a copy); other workers fetch copies or call functions on it.
template <typename T>
RRef<T> makeRRef(T value) {
  return RRef<T>(currentAgent()->createLocalRRef(toValue(std::move(value)), typeName<T>()));
}

}  // namespace cohort::rpc
