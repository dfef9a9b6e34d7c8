/*
 * The function registry: the only code an RPC can run. A worker registers functions by name with
 * their C++ signature; a request names a function and carries its arguments as Values, and the
 * registry converts each argument to the declared parameter type before calling. An unknown name,
 * a wrong argument count or a wrong argument type is an RpcError sent back to the caller (the
 * message names the function and the argument), and the agent carries on. Nothing that arrives is
 * ever interpreted as code.
 *
 *   rpc::registerFunction("add", [](int64_t a, int64_t b) { return a + b; });
 *   rpc::registerFunction("scale", [](Tensor t, double s) { return t.mul(full({}, s)); });
 *   // An asynchronous user function returns a Future: the agent's thread is released at once and
 *   // the response is sent when the future completes.
 *   rpc::registerFunction("push", [&](Tensor grad) -> Future<Tensor> { return server.enqueue(grad); });
 *
 * Supported parameter and result types are those of value.h's Convert<T> (and RRef<T>); a result
 * of Future<T> makes the function asynchronous, void results send none.
 *
 * Threads: registration is thread-safe and may happen before or after rpc::init(); functions run
 * on the agent's worker threads (docs/thread_model.md) and may block or make nested RPCs.
 */
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/util/future.h>
#include <cohort/rpc/value.h>

namespace cohort::rpc {

// Called with the argument list; returns the result (possibly later).
using Handler = std::function<Future<Value>(List args)>;

struct RegisteredFunction {
  std::string name;
  std::string signature;  // "(int64, int64) -> int64", for error messages
  Handler handler;
};

class FunctionRegistry {
 public:
  // The process-wide registry every agent of the process serves.
  static FunctionRegistry& global();

  // Re-registering a name replaces the function (ValueError for an empty name).
  void add(RegisteredFunction f);
  bool remove(const std::string& name);
  // nullptr when unknown.
  std::shared_ptr<const RegisteredFunction> find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  mutable std::shared_mutex mu_;
  std::map<std::string, std::shared_ptr<const RegisteredFunction>> fns_;
};

namespace detail {

template <typename T>
struct FutureInner {
  using type = void;
  static constexpr bool value = false;
};
template <typename T>
struct FutureInner<Future<T>> {
  using type = T;
  static constexpr bool value = true;
};

template <typename R>
std::string resultName() {
  if constexpr (std::is_void_v<R>) return "none";
  else if constexpr (FutureInner<R>::value) {
    using U = typename FutureInner<R>::type;
    if constexpr (std::is_void_v<U>) return "future<none>";
    else return "future<" + typeName<U>() + ">";
  } else return typeName<R>();
}

template <typename R>
Future<Value> wrapResult(R&& r) {
  using D = std::decay_t<R>;
  if constexpr (FutureInner<D>::value) {
    using U = typename FutureInner<D>::type;
    return r.then([](Future<U> done) -> Value {
      if constexpr (std::is_void_v<U>) {
        done.wait();
        return Value();
      } else {
        return toValue(done.value());
      }
    });
  } else {
    return Future<Value>::ready(toValue(std::forward<R>(r)));
  }
}

template <typename R, typename... Args, size_t... I>
Future<Value> invoke(const std::function<R(Args...)>& fn, const List& args, const std::string& name,
                     const std::string& sig, std::index_sequence<I...>) {
  // Arguments convert left to right (braced initialisation orders them), so the first bad one is
  // the one reported.
  auto convert = [&] {
    try {
      return std::tuple<std::decay_t<Args>...>{
          fromValue<std::decay_t<Args>>(args[I], fmt::format("argument {}", I + 1))...};
    } catch (const RpcError& e) {
      throw RpcError(fmt::format("'{}' {}: {}", name, sig, e.what()));
    }
  };
  auto converted = convert();
  if constexpr (std::is_void_v<R>) {
    fn(std::move(std::get<I>(converted))...);
    return Future<Value>::ready(Value());
  } else {
    return wrapResult(fn(std::move(std::get<I>(converted))...));
  }
}

template <typename R, typename... Args>
RegisteredFunction makeFunction(const std::string& name, std::function<R(Args...)> fn) {
  std::string sig = "(";
  size_t i = 0;
  ((sig += (i++ ? ", " : "") + typeName<std::decay_t<Args>>()), ...);
  sig += ") -> " + resultName<R>();
  Handler h = [fn = std::move(fn), name, sig](List args) -> Future<Value> {
    if (args.size() != sizeof...(Args)) {
      throw RpcError(fmt::format("'{}' {} takes {} arguments, got {}", name, sig, sizeof...(Args), args.size()));
    }
    return invoke(fn, args, name, sig, std::index_sequence_for<Args...>{});
  };
  return {name, sig, std::move(h)};
}

}  // namespace detail

// Registers `fn` (any callable with a deducible signature) as `name` in the global registry.
template <typename F>
void registerFunction(const std::string& name, F fn) {
  std::function f = std::move(fn);
  FunctionRegistry::global().add(detail::makeFunction(name, std::move(f)));
}

// Registers a function that takes and returns raw Values (checks its arguments itself).
void registerRawFunction(const std::string& name, std::string signature, Handler handler);

}  // namespace cohort::rpc
