/*
 * Future<T>: the one asynchronous result type shared by collective Work, RPC calls and
 * asynchronous user functions. A Future is a cheap, copyable handle to shared state that is
 * completed exactly once, with a value (setValue) or an error (setError), by any thread.
 *
 * Threads: callbacks added with then()/addCallback() run on the thread that completes the future,
 * or immediately on the calling thread when it is already complete; they must not block for long.
 * wait(timeout) throws TimeoutError when the future is still pending after `timeout`, and
 * rethrows the stored error when it failed. Completing a future twice is a broken invariant.
 */
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <cohort/core/util/check.h>

namespace cohort {

template <typename T>
class Future;

namespace detail {
template <typename T>
struct FutureValue {
  using type = T;
};
template <>
struct FutureValue<void> {
  using type = std::monostate;
};
template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {};
}  // namespace detail

template <typename T>
class Future {
 public:
  using Value = typename detail::FutureValue<T>::type;
  using Callback = std::function<void(Future<T>)>;

  // A new, pending future.
  Future() : state_(std::make_shared<State>()) {}

  static Future ready(Value v) requires(!std::is_void_v<T>) {
    Future f;
    f.setValue(std::move(v));
    return f;
  }
  static Future ready() requires(std::is_void_v<T>) {
    Future f;
    f.setValue();
    return f;
  }
  static Future failed(std::exception_ptr e) {
    Future f;
    f.setError(std::move(e));
    return f;
  }

  bool isCompleted() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }
  bool hasError() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done && state_->error != nullptr;
  }
  // The stored error, or nullptr (also while pending).
  std::exception_ptr exception() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->error;
  }

  template <typename V = T>
  void setValue(Value v) requires(!std::is_void_v<V>) {
    complete([&](State& s) { s.value.emplace(std::move(v)); });
  }
  template <typename V = T>
  void setValue() requires(std::is_void_v<V>) {
    complete([&](State& s) { s.value.emplace(); });
  }
  void setError(std::exception_ptr e) {
    COHORT_CHECK(e != nullptr, "Future::setError needs an exception");
    complete([&](State& s) { s.error = std::move(e); });
  }
  // Completes the future only when no callback is attached yet (waiters are woken); returns false,
  // leaving both the future and `v` untouched, otherwise. For producers on threads that must not
  // run user code (an RPC transport thread): they complete inline when only waiters are there,
  // and hand the completion to another thread when callbacks would run.
  template <typename V = T>
  bool setValueIfNoCallbacks(Value& v) requires(!std::is_void_v<V>) {
    return completeIfNoCallbacks([&](State& s) { s.value.emplace(std::move(v)); });
  }
  bool setErrorIfNoCallbacks(const std::exception_ptr& e) {
    COHORT_CHECK(e != nullptr, "Future::setErrorIfNoCallbacks needs an exception");
    return completeIfNoCallbacks([&](State& s) { s.error = e; });
  }
  // Completes with the value or error of `fn()`.
  template <typename F>
  void setFrom(F&& fn) {
    try {
      if constexpr (std::is_void_v<T>) {
        fn();
        setValue();
      } else {
        setValue(fn());
      }
    } catch (...) {
      setError(std::current_exception());
    }
  }

  // Waits until complete. Returns false on timeout (never throws for the timeout).
  template <typename Rep, typename Period>
  bool waitFor(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->done; });
  }
  // Waits until complete; throws TimeoutError after `timeout`, rethrows the stored error.
  template <typename Rep, typename Period>
  void wait(std::chrono::duration<Rep, Period> timeout) const {
    if (!waitFor(timeout)) {
      throw TimeoutError(fmt::format("Future::wait timed out after {} ms",
                                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()));
    }
    rethrowIfFailed();
  }
  // Waits with no deadline: use only where the producer guarantees completion (every cohort
  // producer completes its futures within its own timeout).
  void wait() const {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    lock.unlock();
    rethrowIfFailed();
  }

  // The value: waits (without deadline) and rethrows the error if the future failed.
  const Value& value() const {
    wait();
    return *state_->value;
  }
  // Moves the value out (for single-consumer futures).
  Value takeValue() {
    wait();
    return std::move(*state_->value);
  }

  // Runs cb(*this) once complete (now, if already complete).
  void addCallback(Callback cb) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(cb));
      return;
    }
    lock.unlock();
    cb(*this);
  }

  // Chains: returns a Future of fn(completedFuture)'s result. An exception thrown by fn fails the
  // returned future. If fn returns a Future<U>, the result is flattened into Future<U>.
  template <typename F>
  auto then(F&& fn) const {
    using R = std::invoke_result_t<F, Future<T>>;
    if constexpr (detail::IsFuture<R>::value) {
      using U = typename R::ValueType;
      Future<U> out;
      addCallback([out, fn = std::forward<F>(fn)](Future<T> self) mutable {
        try {
          R inner = fn(self);
          inner.addCallback([out](R done) mutable {
            if (auto e = done.exception()) {
              out.setError(e);
            } else if constexpr (std::is_void_v<U>) {
              out.setValue();
            } else {
              out.setValue(done.value());
            }
          });
        } catch (...) {
          out.setError(std::current_exception());
        }
      });
      return out;
    } else {
      Future<R> out;
      addCallback(
          [out, fn = std::forward<F>(fn)](Future<T> self) mutable { out.setFrom([&]() -> R { return fn(self); }); });
      return out;
    }
  }

  using ValueType = T;

 private:
  struct State {
    mutable std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<Value> value;
    std::exception_ptr error;
    std::vector<Callback> callbacks;
  };

  template <typename Fill>
  void complete(Fill&& fill) {
    std::vector<Callback> cbs;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      COHORT_CHECK(!state_->done, "Future completed twice");
      fill(*state_);
      state_->done = true;
      cbs.swap(state_->callbacks);
    }
    state_->cv.notify_all();
    for (auto& cb : cbs) cb(*this);
  }

  template <typename Fill>
  bool completeIfNoCallbacks(Fill&& fill) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      COHORT_CHECK(!state_->done, "Future completed twice");
      if (!state_->callbacks.empty()) return false;
      fill(*state_);
      state_->done = true;
    }
    state_->cv.notify_all();
    return true;
  }

  void rethrowIfFailed() const {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      e = state_->error;
    }
    if (e) std::rethrow_exception(e);
  }

  std::shared_ptr<State> state_;
};

// A future that completes when all of `futures` have; fails with the first error.
template <typename T>
Future<void> whenAll(const std::vector<Future<T>>& futures) {
  Future<void> out;
  if (futures.empty()) {
    out.setValue();
    return out;
  }
  struct Count {
    std::mutex mu;
    size_t left;
    std::exception_ptr first;
  };
  auto c = std::make_shared<Count>();
  c->left = futures.size();
  for (const auto& f : futures) {
    f.addCallback([c, out](Future<T> done) mutable {
      bool last = false;
      std::exception_ptr err;
      {
        std::lock_guard<std::mutex> lock(c->mu);
        if (auto e = done.exception(); e && !c->first) c->first = e;
        last = --c->left == 0;
        err = c->first;
      }
      if (last) {
        if (err) out.setError(err);
        else out.setValue();
      }
    });
  }
  return out;
}

}  // namespace cohort
