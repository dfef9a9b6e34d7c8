#include <cohort/distributed/backend.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

namespace cohort::dist {
namespace {
COHORT_ENV_KNOB(kCollectiveThread, "COHORT_COLLECTIVE_THREAD", "caller",
                "Where the shm and mpi backends run collectives: caller (the issuing thread; the Work is complete "
                "on return; for mpi a timeout ends the job with MPI_Abort) or worker (one thread per group; "
                "asynchronous Works; for mpi a timeout is an exception)");

// A variable that was renamed: set to anything, it is an error naming the new one, so a job
// configured with the old name fails at once instead of silently running with the default. Old
// names are not knobs (`cohortrun --help-env` does not list them).
void rejectRenamed(const char* oldName, const env::Knob& replacement) {
  const char* v = std::getenv(oldName);
  if (v == nullptr) return;
  throw ValueError(fmt::format("environment variable {}='{}' is no longer read: it was renamed {}; unset {} and set {}",
                               oldName, v, replacement.name(), oldName, replacement.name()));
}
}  // namespace

CollectiveThread collectiveThreadFromEnv() {
  rejectRenamed("COHORT_SHM_THREAD", kCollectiveThread);
  rejectRenamed("COHORT_MPI_COLLECTIVE_THREAD", kCollectiveThread);
  const std::string where = kCollectiveThread.str();
  if (where == "caller") return CollectiveThread::Caller;
  if (where == "worker") return CollectiveThread::Worker;
  throw ValueError(fmt::format("COHORT_COLLECTIVE_THREAD must be caller or worker, got '{}'", where));
}

void Backend::unsupported(OpType op) const {
  throw NotSupportedError(fmt::format("backend {} does not support {}", name_, opTypeName(op)));
}

void Backend::allreduce(Tensor&, const AllreduceOptions&, const WorkPtr&) { unsupported(OpType::Allreduce); }
void Backend::allreduceCoalesced(std::vector<Tensor>&, const AllreduceOptions&, const WorkPtr&) {
  unsupported(OpType::AllreduceCoalesced);
}
void Backend::broadcast(Tensor&, const BroadcastOptions&, const WorkPtr&) { unsupported(OpType::Broadcast); }
void Backend::reduce(Tensor&, const ReduceOptions&, const WorkPtr&) { unsupported(OpType::Reduce); }
void Backend::allgather(std::vector<Tensor>&, const Tensor&, const AllgatherOptions&, const WorkPtr&) {
  unsupported(OpType::Allgather);
}
void Backend::allgatherIntoTensor(Tensor&, const Tensor&, const AllgatherOptions&, const WorkPtr&) {
  unsupported(OpType::AllgatherIntoTensor);
}
void Backend::allgatherCoalesced(std::vector<std::vector<Tensor>>&, const std::vector<Tensor>&, const AllgatherOptions&,
                                 const WorkPtr&) {
  unsupported(OpType::AllgatherCoalesced);
}
void Backend::reduceScatter(Tensor&, std::vector<Tensor>&, const ReduceScatterOptions&, const WorkPtr&) {
  unsupported(OpType::ReduceScatter);
}
void Backend::reduceScatterTensor(Tensor&, const Tensor&, const ReduceScatterOptions&, const WorkPtr&) {
  unsupported(OpType::ReduceScatterTensor);
}
void Backend::alltoall(Tensor&, const Tensor&, const AlltoallOptions& opts, const WorkPtr&) {
  unsupported(opts.inputSplitSizes.empty() && opts.outputSplitSizes.empty() ? OpType::Alltoall : OpType::AlltoallV);
}
void Backend::alltoallList(std::vector<Tensor>&, std::vector<Tensor>&, const AlltoallOptions&, const WorkPtr&) {
  unsupported(OpType::AlltoallList);
}
void Backend::gather(std::vector<Tensor>&, const Tensor&, const GatherOptions&, const WorkPtr&) {
  unsupported(OpType::Gather);
}
void Backend::scatter(Tensor&, const std::vector<Tensor>&, const ScatterOptions&, const WorkPtr&) {
  unsupported(OpType::Scatter);
}
void Backend::barrier(const BarrierOptions&, const WorkPtr&) { unsupported(OpType::Barrier); }

Tensor Backend::allocateCommBuffer(const Shape& sizes, DType dtype, Millis) { return zeros(sizes, {.dtype = dtype}); }
void Backend::send(const Tensor&, int, const SendRecvOptions&, const WorkPtr&) { unsupported(OpType::Send); }
void Backend::recv(Tensor&, int, const SendRecvOptions&, const WorkPtr&) { unsupported(OpType::Recv); }

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};
Registry& registry() {
  static Registry r;  // function-local: backends register from static initializers in other files
  return r;
}
}  // namespace

void registerBackend(const std::string& name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

bool hasBackend(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.count(name) != 0;
}

std::vector<std::string> availableBackends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

BackendPtr createBackend(const std::string& name, const StorePtr& store, int rank, int size,
                         const BackendOptions& opts) {
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::vector<std::string> names;
      for (const auto& [n, f] : r.factories) names.push_back(n);
      throw NotSupportedError(
          fmt::format("no collective backend named '{}' in this build (available: {})", name,
                      names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
    }
    factory = it->second;
  }
  return factory(store, rank, size, opts);
}

}  // namespace cohort::dist
