#include <map>
#include <mutex>
#include <set>

#include <cohort/core/ops/dispatch.h>
#include <cohort/core/util/check.h>

namespace cohort::dispatch {
namespace {

// Ordered by (signature, device type, op name). Lookups compare against a string_view, so the
// per-op lookup on a device allocates nothing.
struct Key {
  std::type_index signature;
  DeviceType device;
  std::string op;
};
struct KeyView {
  std::type_index signature;
  DeviceType device;
  std::string_view op;
};
struct KeyLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    if (a.signature != b.signature) return a.signature < b.signature;
    if (a.device != b.device) return a.device < b.device;
    return std::string_view(a.op) < std::string_view(b.op);
  }
};

struct Table {
  std::mutex mu;
  std::map<Key, void*, KeyLess> kernels;
};

Table& table() {
  static Table* t = new Table();  // registrations run during static initialization of other files
  return *t;
}

}  // namespace

void registerRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto [it, inserted] = t.kernels.emplace(Key{signature, device, std::string(op)}, fn);
  COHORT_CHECK(inserted, "dispatch: a kernel for '{}' on device type {} with this signature is already registered", op,
               static_cast<int>(device));
}

void* findRaw(std::type_index signature, std::string_view op, DeviceType device) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.kernels.find(KeyView{signature, device, op});
  return it == t.kernels.end() ? nullptr : it->second;
}

std::vector<std::string> opsWithKernels(DeviceType device) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::set<std::string> names;
  for (const auto& [key, fn] : t.kernels)
    if (key.device == device) names.insert(key.op);
  return {names.begin(), names.end()};
}

void throwNoKernel(std::string_view op, Device device) {
  std::string why = opsWithKernels(device.type()).empty()
                        ? fmt::format("this build has no kernels for {} devices", device.isCuda() ? "CUDA" : "these")
                        : "this op has no kernel for that device yet";
  throw NotSupportedError(
      fmt::format("{}: no kernel for tensors on {} ({}); move the tensors with to(Device::cpu())", op, device, why));
}

}  // namespace cohort::dispatch
