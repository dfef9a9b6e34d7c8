#include <array>
#include <atomic>
#include <mutex>
#include <set>

#include <cohort/core/ops/dispatch.h>
#include <cohort/core/util/check.h>

namespace cohort::dispatch {
namespace {

// One (signature, op name) pair and its kernel per device type. Entries are never freed or moved,
// so a reader that found one may keep the pointer.
struct Entry {
  int signature;
  uint64_t hash;
  std::string op;
  std::array<std::atomic<void*>, kNumDeviceTypes> fn{};
};

// Open addressing over a fixed power-of-two array of entry pointers, written under `mu` and read
// without it: an entry is fully built before its pointer is published (release), and a slot,
// once set, never changes. A lookup probes from the key's hash until it finds the entry or an
// empty slot.
constexpr size_t kSlots = 4096;

struct Table {
  std::mutex mu;
  std::array<std::atomic<Entry*>, kSlots> slots{};
  size_t used = 0;
  std::vector<std::string> signatures;  // signature ids are indices; compared by type name
};

Table& table() {
  static Table* t = new Table();  // registrations run during static initialization of other files
  return *t;
}

// FNV-1a of the name, mixed with the signature id.
uint64_t keyHash(int signature, std::string_view op) {
  uint64_t h = 1469598103934665603ULL ^ (static_cast<uint64_t>(signature) * 0x9E3779B97F4A7C15ULL);
  for (char c : op) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

bool matches(const Entry* e, int signature, uint64_t hash, std::string_view op) {
  return e->hash == hash && e->signature == signature && std::string_view(e->op) == op;
}

// The slot holding (signature, op), or the empty slot where it would go.
size_t probe(const Table& t, int signature, uint64_t hash, std::string_view op) {
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Entry* e = t.slots[i].load(std::memory_order_acquire);
    if (e == nullptr || matches(e, signature, hash, op)) return i;
  }
}

// The id of the signature with this type name (t.mu held). By name: the same function type has
// one name in every shared object, even where the type_info objects differ.
int internSignature(Table& t, const char* name) {
  for (size_t i = 0; i < t.signatures.size(); ++i)
    if (t.signatures[i] == name) return static_cast<int>(i);
  t.signatures.emplace_back(name);
  return static_cast<int>(t.signatures.size() - 1);
}

// The entry of (signature, op), made if absent (t.mu held).
Entry* entryFor(Table& t, std::type_index signature, std::string_view op) {
  const int sig = internSignature(t, signature.name());
  const uint64_t hash = keyHash(sig, op);
  const size_t i = probe(t, sig, hash, op);
  Entry* e = t.slots[i].load(std::memory_order_relaxed);
  if (e == nullptr) {
    COHORT_CHECK(t.used + 1 < kSlots * 3 / 4, "dispatch: more than {} kernels registered", kSlots * 3 / 4);
    e = new Entry{sig, hash, std::string(op)};
    t.slots[i].store(e, std::memory_order_release);
    ++t.used;
  }
  return e;
}

}  // namespace

int signatureId(const std::type_info& signature) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return internSignature(t, signature.name());
}

void registerRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn) {
  COHORT_CHECK(fn != nullptr, "dispatch: a null kernel registered for '{}'", op);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto& slot = entryFor(t, signature, op)->fn[static_cast<size_t>(device)];
  COHORT_CHECK(slot.load(std::memory_order_relaxed) == nullptr,
               "dispatch: a kernel for '{}' on device type {} with this signature is already registered", op,
               static_cast<int>(device));
  slot.store(fn, std::memory_order_release);
}

void* replaceRaw(std::type_index signature, std::string_view op, DeviceType device, void* fn) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return entryFor(t, signature, op)->fn[static_cast<size_t>(device)].exchange(fn, std::memory_order_acq_rel);
}

void* findRaw(int signature, std::string_view op, DeviceType device) {
  const Table& t = table();
  const uint64_t hash = keyHash(signature, op);
  const Entry* e = t.slots[probe(t, signature, hash, op)].load(std::memory_order_acquire);
  return e == nullptr ? nullptr : e->fn[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

std::vector<std::string> opsWithKernels(DeviceType device) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::set<std::string> names;
  for (const auto& slot : t.slots) {
    const Entry* e = slot.load(std::memory_order_relaxed);
    if (e != nullptr && e->fn[static_cast<size_t>(device)].load(std::memory_order_relaxed) != nullptr)
      names.insert(e->op);
  }
  return {names.begin(), names.end()};
}

void throwNoKernel(std::string_view op, Device device) {
  if (device.isCpu())
    throw NotSupportedError(
        fmt::format("{}: no kernel for CPU tensors is registered under this name and signature", op));
  std::string why = opsWithKernels(device.type()).empty()
                        ? fmt::format("this build has no kernels for {} devices", device.isCuda() ? "CUDA" : "these")
                        : "this op has no kernel for that device yet";
  throw NotSupportedError(
      fmt::format("{}: no kernel for tensors on {} ({}); move the tensors with to(Device::cpu())", op, device, why));
}

}  // namespace cohort::dispatch
