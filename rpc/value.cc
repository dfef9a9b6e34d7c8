#include <cohort/rpc/value.h>

#include <cstring>

namespace cohort::rpc {

const char* kindName(Kind k) {
  switch (k) {
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int64";
    case Kind::Double: return "double";
    case Kind::String: return "string";
    case Kind::Tensor: return "tensor";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::RRef: return "rref";
  }
  return "unknown";
}

std::string Value::describe() const {
  switch (kind()) {
    case Kind::None: return "none";
    case Kind::Bool: return toBool() ? "bool true" : "bool false";
    case Kind::Int: return fmt::format("int64 {}", toInt());
    case Kind::Double: return fmt::format("double {}", toDouble());
    case Kind::String: return fmt::format("string of {} bytes", toStr().size());
    case Kind::Tensor: {
      const Tensor& t = toTensor();
      if (!t.defined()) return "undefined tensor";
      return fmt::format("tensor {} {}", t.dtype(), shapeStr(t.sizes()));
    }
    case Kind::List: return fmt::format("list of {}", toList().size());
    case Kind::Dict: return fmt::format("dict of {}", toDict().size());
    case Kind::RRef: return "rref";
  }
  return "unknown";
}

void Value::throwKind(Kind want) const {
  throw RpcError(fmt::format("expected {}, got {}", kindName(want), describe()));
}

static bool tensorsEqual(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.dataPtr(), cb.dataPtr(), ca.nbytes()) == 0;
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::None: return true;
    case Kind::Bool: return a.toBool() == b.toBool();
    case Kind::Int: return a.toInt() == b.toInt();
    case Kind::Double: {
      double x = a.toDouble(), y = b.toDouble();
      return std::memcmp(&x, &y, sizeof x) == 0;  // bitwise: NaNs and signed zeros round-trip exactly
    }
    case Kind::String: return a.toStr() == b.toStr();
    case Kind::Tensor: return tensorsEqual(a.toTensor(), b.toTensor());
    case Kind::List: return a.toList() == b.toList();
    case Kind::Dict: return a.toDict() == b.toDict();
    case Kind::RRef: return a.toRRef() == b.toRRef();
  }
  return false;
}

namespace {
void walkTensors(Value& v, const std::function<void(Tensor&, uint32_t)>& fn, uint32_t& next) {
  switch (v.kind()) {
    case Kind::Tensor: fn(v.toTensor(), next++); break;
    case Kind::List:
      for (auto& x : v.toList()) walkTensors(x, fn, next);
      break;
    case Kind::Dict:
      for (auto& [k, x] : v.toDict()) walkTensors(x, fn, next);
      break;
    default: break;
  }
}
}  // namespace

void forEachTensor(Value& v, const std::function<void(Tensor&, uint32_t)>& fn) {
  uint32_t next = 0;
  walkTensors(v, fn, next);
}

namespace detail {
void throwConvert(const std::string& where, const std::string& expected, const Value& got) {
  throw RpcError(fmt::format("{}: expected {}, got {}", where, expected, got.describe()));
}
std::string joinWhere(const std::string& where, const std::string& inner) { return where + inner; }
}  // namespace detail

}  // namespace cohort::rpc
