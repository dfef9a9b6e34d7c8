#include <cohort/distributed/watchdog/fake_backend.h>

#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>

namespace cohort::dist {

namespace {
std::mutex& optionsMu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, FakeCommOptions>& optionsByGroup() {
  static std::map<std::string, FakeCommOptions> m;
  return m;
}
FakeCommOptions optionsFor(const std::string& group) {
  std::lock_guard<std::mutex> lock(optionsMu());
  auto it = optionsByGroup().find(group);
  return it == optionsByGroup().end() ? FakeCommOptions{} : it->second;
}

const bool kRegistered = [] {
  registerBackend("fake", [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    return std::make_shared<FakeBackend>(store, rank, size, opts);
  });
  return true;
}();
}  // namespace

void setFakeCommOptions(const std::string& group, FakeCommOptions opts) {
  std::lock_guard<std::mutex> lock(optionsMu());
  optionsByGroup()[group] = std::move(opts);
}

void clearFakeCommOptions(const std::string& group) {
  std::lock_guard<std::mutex> lock(optionsMu());
  optionsByGroup().erase(group);
}

FakeBackend::FakeBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts)
    : CommBackend("fake", store, rank, size, opts), barrier_(zeros({1})) {
  (void)kRegistered;
  // The ranks' communicators share one world, found by an id rank 0 makes unique in this process.
  static std::atomic<uint64_t> counter{0};
  std::string id;
  if (rank == 0) {
    id = fmt::format("{}/{}/{}", opts.groupName, ::getpid(), counter.fetch_add(1));
    auto world = FakeCommWorld::shared(id, size);
    comm_ = std::make_shared<FakeCommunicator>(world, rank, optionsFor(opts.groupName));
    store->set("fake/world", id);
  } else {
    id = store->getString("fake/world");
    comm_ = std::make_shared<FakeCommunicator>(FakeCommWorld::shared(id, size), rank, optionsFor(opts.groupName));
  }
  watchdog_->addCommunicator(comm_);
}

// The ops still in flight get a few seconds; then the watchdog aborts the communicator (which
// joins its stream) and fails them. The communicator's destructor also joins its stream.
FakeBackend::~FakeBackend() { stopWatchdog(Millis(5000)); }

CommBackend::Target FakeBackend::prepare(Device device) {
  if (!device.isCpu()) {
    throw NotSupportedError(fmt::format("backend fake serves CPU tensors, got a tensor on {}", device));
  }
  return {comm_.get(), nullptr};
}

}  // namespace cohort::dist
