#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <cohort/core/ops/dispatch.h>
#include <cohort/core/util/check.h>

namespace cohort::dispatch {
namespace {

using Key = std::tuple<std::type_index, std::string, DeviceType>;

struct Table {
  std::mutex mu;
  std::map<Key, void*, std::less<>> kernels;
};

Table& table() {
  static Table* t = new Table();  // registrations run during static initialization of other files
  return *t;
}

}  // namespace

void registerRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto [it, inserted] = t.kernels.emplace(Key{signature, std::string(op), device}, fn);
  COHORT_CHECK(inserted, "dispatch: a kernel for '{}' on device type {} with this signature is already registered", op,
               static_cast<int>(device));
}

void* findRaw(std::type_index signature, std::string_view op, DeviceType device) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.kernels.find(Key{signature, std::string(op), device});
  return it == t.kernels.end() ? nullptr : it->second;
}

std::vector<std::string> opsWithKernels(DeviceType device) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::set<std::string> names;
  for (const auto& [key, fn] : t.kernels)
    if (std::get<2>(key) == device) names.insert(std::get<1>(key));
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
