/*
 * FunctionRef<R(Args...)>: a non-owning reference to a callable, for parameters that are called
 * (or not) before the function returns. Unlike std::function it never allocates or copies the
 * callable, so hot paths can take optional, lazily evaluated arguments for free. The referenced
 * callable must outlive every call (a lambda passed as an argument lives until the call returns).
 */
#pragma once

#include <type_traits>
#include <utility>

namespace cohort {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
      FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): binds like std::function does
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  explicit operator bool() const { return call_ != nullptr; }
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace cohort
