/*
 * rpc::Value: the typed values an RPC carries (arguments, results, RRef contents), and the
 * conversions between them and C++ types.
 *
 * A Value is one of: none, bool, int (int64), double, string, tensor, list, dict (string keys,
 * ordered), rref (a remote reference; see rref.h). Lists and dicts nest to any depth the wire
 * limits allow (wire.h). Values are plain data: copying one copies lists and dicts, while tensors
 * and rrefs inside are handles (a copied tensor aliases the same storage).
 *
 * Convert<T> maps C++ types onto Values: bool, every integer type (range-checked), float, double,
 * std::string, Tensor, std::vector<T>, std::map<std::string, T>, std::tuple<T...>, std::pair,
 * std::optional<T> (none when empty), Value itself, and RRef<T> (rref.h). Converting a Value of the
 * wrong kind throws RpcError naming where in the call it was ("argument 2: expected int64, got
 * string") — this is how a function's typed signature is enforced on the callee.
 *
 * Threads: Values are not synchronised; hand one to another thread, don't share it while writing.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>

namespace cohort::rpc {

class RRefHandle;  // rref.h
class Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value>;

enum class Kind : uint8_t { None = 0, Bool, Int, Double, String, Tensor, List, Dict, RRef };
const char* kindName(Kind k);

class Value {
 public:
  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Tensor t) : v_(std::move(t)) {}
  Value(List l) : v_(std::move(l)) {}
  Value(Dict d) : v_(std::move(d)) {}
  Value(std::shared_ptr<RRefHandle> r) : v_(std::move(r)) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool isNone() const { return kind() == Kind::None; }

  // Accessors throw RpcError naming the expected and actual kinds.
  bool toBool() const { return get<bool>(Kind::Bool); }
  int64_t toInt() const { return get<int64_t>(Kind::Int); }
  double toDouble() const { return get<double>(Kind::Double); }
  const std::string& toStr() const { return get<std::string>(Kind::String); }
  const Tensor& toTensor() const { return get<Tensor>(Kind::Tensor); }
  Tensor& toTensor() { return getMut<Tensor>(Kind::Tensor); }
  const List& toList() const { return get<List>(Kind::List); }
  List& toList() { return getMut<List>(Kind::List); }
  const Dict& toDict() const { return get<Dict>(Kind::Dict); }
  Dict& toDict() { return getMut<Dict>(Kind::Dict); }
  const std::shared_ptr<RRefHandle>& toRRef() const { return get<std::shared_ptr<RRefHandle>>(Kind::RRef); }

  // A short description for messages: "int64 7", "list of 3", "tensor float32 [2, 3]".
  std::string describe() const;

 private:
  template <typename T>
  const T& get(Kind want) const {
    if (kind() != want) throwKind(want);
    return std::get<T>(v_);
  }
  template <typename T>
  T& getMut(Kind want) {
    if (kind() != want) throwKind(want);
    return std::get<T>(v_);
  }
  [[noreturn]] void throwKind(Kind want) const;

  std::variant<std::monostate, bool, int64_t, double, std::string, Tensor, List, Dict, std::shared_ptr<RRefHandle>> v_;
};

// Deep equality (tensors compare dtype, shape and bytes; rrefs compare identity).
bool operator==(const Value& a, const Value& b);

// Calls fn on every tensor in `v`, in the order the wire encodes them (lists in order, dicts in
// key order), with its position among them.
void forEachTensor(Value& v, const std::function<void(Tensor&, uint32_t)>& fn);

// ---- C++ type <-> Value ------------------------------------------------------------------------

template <typename T, typename Enable = void>
struct Convert;  // specialised below (and for RRef<T> in rref.h)

namespace detail {
[[noreturn]] void throwConvert(const std::string& where, const std::string& expected, const Value& got);
std::string joinWhere(const std::string& where, const std::string& inner);
}  // namespace detail

template <typename T>
Value toValue(T&& v) {
  return Convert<std::decay_t<T>>::to(std::forward<T>(v));
}
// `where` names the position for the error message ("argument 1", "result").
template <typename T>
T fromValue(const Value& v, const std::string& where = "value") {
  return Convert<T>::from(v, where);
}
template <typename T>
std::string typeName() {
  return Convert<T>::name();
}

template <>
struct Convert<Value> {
  static Value to(Value v) { return v; }
  static Value from(const Value& v, const std::string&) { return v; }
  static std::string name() { return "any"; }
};

template <>
struct Convert<bool> {
  static Value to(bool b) { return Value(b); }
  static bool from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::Bool) detail::throwConvert(where, "bool", v);
    return v.toBool();
  }
  static std::string name() { return "bool"; }
};

template <typename T>
struct Convert<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static Value to(T i) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (i > static_cast<T>(std::numeric_limits<int64_t>::max())) {
        throw RpcError(fmt::format("integer {} does not fit the wire's int64", i));
      }
    }
    return Value(static_cast<int64_t>(i));
  }
  static T from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::Int) detail::throwConvert(where, name(), v);
    int64_t i = v.toInt();
    bool fits;
    if constexpr (std::is_signed_v<T>) {
      fits = i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
             i <= static_cast<int64_t>(std::numeric_limits<T>::max());
    } else {
      fits = i >= 0 && static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    }
    if (!fits) throw RpcError(fmt::format("{}: integer {} is out of range for {}", where, i, name()));
    return static_cast<T>(i);
  }
  static std::string name() { return fmt::format("{}int{}", std::is_signed_v<T> ? "" : "u", sizeof(T) * 8); }
};

template <typename T>
struct Convert<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static Value to(T d) { return Value(static_cast<double>(d)); }
  static T from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::Double) detail::throwConvert(where, "double", v);
    return static_cast<T>(v.toDouble());
  }
  static std::string name() { return sizeof(T) == 4 ? "float" : "double"; }
};

template <>
struct Convert<std::string> {
  static Value to(std::string s) { return Value(std::move(s)); }
  static std::string from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::String) detail::throwConvert(where, "string", v);
    return v.toStr();
  }
  static std::string name() { return "string"; }
};
template <>
struct Convert<const char*> {
  static Value to(const char* s) { return Value(std::string(s)); }
  static std::string name() { return "string"; }
};

template <>
struct Convert<Tensor> {
  static Value to(Tensor t) { return Value(std::move(t)); }
  static Tensor from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::Tensor) detail::throwConvert(where, "tensor", v);
    return v.toTensor();
  }
  static std::string name() { return "tensor"; }
};

template <typename T>
struct Convert<std::vector<T>> {
  static Value to(const std::vector<T>& xs) {
    List l;
    l.reserve(xs.size());
    for (const auto& x : xs) l.push_back(Convert<T>::to(x));
    return Value(std::move(l));
  }
  static std::vector<T> from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::List) detail::throwConvert(where, name(), v);
    std::vector<T> out;
    const List& l = v.toList();
    out.reserve(l.size());
    for (size_t i = 0; i < l.size(); ++i) out.push_back(Convert<T>::from(l[i], fmt::format("{}[{}]", where, i)));
    return out;
  }
  static std::string name() { return "list<" + Convert<T>::name() + ">"; }
};

template <typename T>
struct Convert<std::map<std::string, T>> {
  static Value to(const std::map<std::string, T>& m) {
    Dict d;
    for (const auto& [k, x] : m) d.emplace(k, Convert<T>::to(x));
    return Value(std::move(d));
  }
  static std::map<std::string, T> from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::Dict) detail::throwConvert(where, name(), v);
    std::map<std::string, T> out;
    for (const auto& [k, x] : v.toDict()) out.emplace(k, Convert<T>::from(x, fmt::format("{}[\"{}\"]", where, k)));
    return out;
  }
  static std::string name() { return "dict<string, " + Convert<T>::name() + ">"; }
};

template <typename T>
struct Convert<std::optional<T>> {
  static Value to(const std::optional<T>& o) { return o ? Convert<T>::to(*o) : Value(); }
  static std::optional<T> from(const Value& v, const std::string& where) {
    if (v.isNone()) return std::nullopt;
    return Convert<T>::from(v, where);
  }
  static std::string name() { return "optional<" + Convert<T>::name() + ">"; }
};

template <typename... Ts>
struct Convert<std::tuple<Ts...>> {
  static Value to(const std::tuple<Ts...>& t) {
    List l;
    std::apply([&](const auto&... xs) { (l.push_back(toValue(xs)), ...); }, t);
    return Value(std::move(l));
  }
  static std::tuple<Ts...> from(const Value& v, const std::string& where) {
    if (v.kind() != Kind::List) detail::throwConvert(where, name(), v);
    const List& l = v.toList();
    if (l.size() != sizeof...(Ts)) {
      throw RpcError(fmt::format("{}: expected a tuple of {} elements, got {}", where, sizeof...(Ts), l.size()));
    }
    return fromList(l, where, std::index_sequence_for<Ts...>{});
  }
  static std::string name() {
    std::string s = "tuple<";
    size_t i = 0;
    ((s += (i++ ? ", " : "") + Convert<Ts>::name()), ...);
    return s + ">";
  }

 private:
  template <size_t... I>
  static std::tuple<Ts...> fromList(const List& l, const std::string& where, std::index_sequence<I...>) {
    return std::tuple<Ts...>(Convert<Ts>::from(l[I], fmt::format("{}[{}]", where, I))...);
  }
};

template <typename A, typename B>
struct Convert<std::pair<A, B>> {
  static Value to(const std::pair<A, B>& p) {
    return Convert<std::tuple<A, B>>::to(std::tuple<A, B>(p.first, p.second));
  }
  static std::pair<A, B> from(const Value& v, const std::string& where) {
    auto t = Convert<std::tuple<A, B>>::from(v, where);
    return {std::move(std::get<0>(t)), std::move(std::get<1>(t))};
  }
  static std::string name() { return Convert<std::tuple<A, B>>::name(); }
};

}  // namespace cohort::rpc
