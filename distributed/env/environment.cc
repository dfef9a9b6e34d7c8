#include <cohort/distributed/env/environment.h>

#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/env/nodelist.h>

namespace cohort::dist::env {
namespace {

using cohort::env::Knob;

COHORT_ENV_KNOB(kRank, "RANK", "", "Global rank of this process (torchrun-style launch)");
COHORT_ENV_KNOB(kWorldSize, "WORLD_SIZE", "", "Number of processes in the job (torchrun-style launch)");
COHORT_ENV_KNOB(kLocalRank, "LOCAL_RANK", "", "Rank of this process on its host (torchrun-style launch)");
COHORT_ENV_KNOB(kLocalWorldSize, "LOCAL_WORLD_SIZE", "", "Processes on this host (torchrun-style launch)");
COHORT_ENV_KNOB(kMasterAddr, "MASTER_ADDR", "",
                "Host of rank 0's store (required for torchrun-style launch; overrides OpenMPI/Slurm guesses)");
COHORT_ENV_KNOB(
    kMasterPort, "MASTER_PORT", "",
    "Port of rank 0's store (required for torchrun-style launch; OpenMPI/Slurm derive one from the job id)");
COHORT_ENV_KNOB(kOmpiRank, "OMPI_COMM_WORLD_RANK", "", "Set by OpenMPI's mpirun: global rank");
COHORT_ENV_KNOB(kOmpiSize, "OMPI_COMM_WORLD_SIZE", "", "Set by OpenMPI's mpirun: number of processes");
COHORT_ENV_KNOB(kOmpiLocalRank, "OMPI_COMM_WORLD_LOCAL_RANK", "", "Set by OpenMPI's mpirun: rank on this host");
COHORT_ENV_KNOB(kOmpiLocalSize, "OMPI_COMM_WORLD_LOCAL_SIZE", "", "Set by OpenMPI's mpirun: processes on this host");
COHORT_ENV_KNOB(kOmpiJobId, "OMPI_MCA_ess_base_jobid", "",
                "Set by OpenMPI's mpirun: job id (the default store port is derived from it)");
COHORT_ENV_KNOB(kSlurmProcId, "SLURM_PROCID", "", "Set by Slurm's srun: global rank");
COHORT_ENV_KNOB(kSlurmNtasks, "SLURM_NTASKS", "", "Set by Slurm: number of tasks");
COHORT_ENV_KNOB(kSlurmNprocs, "SLURM_NPROCS", "", "Set by older Slurm: number of tasks (when SLURM_NTASKS is not)");
COHORT_ENV_KNOB(kSlurmLocalId, "SLURM_LOCALID", "", "Set by Slurm's srun: task rank on this node");
COHORT_ENV_KNOB(kSlurmNtasksPerNode, "SLURM_NTASKS_PER_NODE", "",
                "Set by Slurm with --ntasks-per-node (the job's request: a smaller srun step keeps it)");
COHORT_ENV_KNOB(kSlurmStepTasksPerNode, "SLURM_STEP_TASKS_PER_NODE", "",
                "Set by Slurm's srun: the step's tasks on each node, compressed (\"2(x3),1\")");
COHORT_ENV_KNOB(kSlurmTasksPerNode, "SLURM_TASKS_PER_NODE", "",
                "Set by Slurm: tasks on each node, compressed (\"2(x3),1\"; srun sets the step's)");
COHORT_ENV_KNOB(kSlurmNodeId, "SLURM_NODEID", "", "Set by Slurm: index of this node in the allocation");
COHORT_ENV_KNOB(kSlurmStepNodeList, "SLURM_STEP_NODELIST", "", "Set by Slurm's srun: the step's nodes (compressed)");
COHORT_ENV_KNOB(kSlurmJobNodeList, "SLURM_JOB_NODELIST", "", "Set by Slurm: the allocation's nodes (compressed)");
COHORT_ENV_KNOB(kSlurmNodeList, "SLURM_NODELIST", "", "Set by older Slurm: the allocation's nodes (compressed)");
COHORT_ENV_KNOB(kSlurmJobId, "SLURM_JOB_ID", "", "Set by Slurm: job id (the default store port is derived from it)");

constexpr uint16_t kFallbackPort = 29500;
constexpr uint16_t kDerivedPortBase = 20000;  // below Linux's ephemeral range (32768+)

const std::vector<const Knob*>& allLaunchKnobs() {
  static const std::vector<const Knob*> kKnobs = {&kRank,
                                                  &kWorldSize,
                                                  &kLocalRank,
                                                  &kLocalWorldSize,
                                                  &kMasterAddr,
                                                  &kMasterPort,
                                                  &kOmpiRank,
                                                  &kOmpiSize,
                                                  &kOmpiLocalRank,
                                                  &kOmpiLocalSize,
                                                  &kOmpiJobId,
                                                  &kSlurmProcId,
                                                  &kSlurmNtasks,
                                                  &kSlurmNprocs,
                                                  &kSlurmLocalId,
                                                  &kSlurmNtasksPerNode,
                                                  &kSlurmStepTasksPerNode,
                                                  &kSlurmTasksPerNode,
                                                  &kSlurmNodeId,
                                                  &kSlurmStepNodeList,
                                                  &kSlurmJobNodeList,
                                                  &kSlurmNodeList,
                                                  &kSlurmJobId};
  return kKnobs;
}

const char* kLookedFor =
    "torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; optional LOCAL_RANK, LOCAL_WORLD_SIZE), "
    "OpenMPI mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, "
    "OMPI_COMM_WORLD_LOCAL_SIZE; MASTER_ADDR for multi-host jobs), "
    "Slurm srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE "
    "with SLURM_NODEID or SLURM_NTASKS_PER_NODE, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST or SLURM_NODELIST)";

std::string foundVariables() {
  std::vector<std::string> found;
  for (const Knob* k : allLaunchKnobs()) {
    if (auto v = k->raw()) found.push_back(fmt::format("{}={}", k->name(), *v));
  }
  return found.empty() ? std::string("none of them") : fmt::format("{}", fmt::join(found, ", "));
}

[[noreturn]] void fail(LaunchSource source, const std::string& problem) {
  throw ValueError(
      fmt::format("cannot initialise from the environment: {} launch detected, but {}. Found: {}. Looked for: {}",
                  launchSourceName(source), problem, foundVariables(), kLookedFor));
}

// Parses a decimal integer in [lo, hi]; names the variable and the source when it is not.
int64_t parseInt(LaunchSource source, const char* name, const std::string& value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  bool ok = !value.empty() && value.size() <= 18;
  for (size_t i = 0; ok && i < value.size(); ++i) {
    char c = value[i];
    if (c < '0' || c > '9') ok = false;
    else v = v * 10 + (c - '0');
  }
  if (!ok) fail(source, fmt::format("{}='{}' is not a non-negative integer", name, value));
  if (v < lo || v > hi) fail(source, fmt::format("{}={} is out of range [{}, {}]", name, v, lo, hi));
  return v;
}

class Reader {
 public:
  explicit Reader(LaunchSource source) : source_(source) {}
  std::optional<std::string> get(const Knob& k) const { return k.raw(); }
  // Records a missing variable instead of failing at once, so one error names all of them.
  std::string need(const Knob& k) {
    auto v = k.raw();
    if (!v) missing_.push_back(k.name());
    return v.value_or("");
  }
  void need(const char* alternatives) { missing_.push_back(alternatives); }
  void throwIfMissing() const {
    if (!missing_.empty()) fail(source_, fmt::format("{} missing", fmt::join(missing_, ", ")));
  }
  int64_t integer(const Knob& k, const std::string& v, int64_t lo, int64_t hi) const {
    return parseInt(source_, k.name(), v, lo, hi);
  }

 private:
  LaunchSource source_;
  std::vector<std::string> missing_;
};

void validateRanks(LaunchSource source, LaunchEnvironment& e, const char* rankName, const char* sizeName,
                   const char* localRankName, const char* localSizeName) {
  if (e.worldSize < 1) fail(source, fmt::format("{}={} must be at least 1", sizeName, e.worldSize));
  if (e.rank >= e.worldSize) {
    fail(source, fmt::format("{}={} is not below {}={}", rankName, e.rank, sizeName, e.worldSize));
  }
  if (e.localWorldSize < 1) fail(source, fmt::format("{}={} must be at least 1", localSizeName, e.localWorldSize));
  if (e.localWorldSize > e.worldSize) {
    fail(source, fmt::format("{}={} exceeds {}={}", localSizeName, e.localWorldSize, sizeName, e.worldSize));
  }
  if (e.localRank >= e.localWorldSize) {
    fail(source, fmt::format("{}={} is not below {}={}", localRankName, e.localRank, localSizeName, e.localWorldSize));
  }
}

void masterPortFrom(LaunchSource source, LaunchEnvironment& e, const Knob& jobIdKnob) {
  if (auto p = kMasterPort.raw()) {
    e.masterPort = static_cast<uint16_t>(parseInt(source, "MASTER_PORT", *p, 1, 65535));
    e.masterPortOrigin = "MASTER_PORT";
    return;
  }
  if (auto id = jobIdKnob.raw()) {
    // Only the trailing digits matter; job ids may be longer than an int64.
    std::string digits = id->size() > 9 ? id->substr(id->size() - 9) : *id;
    int64_t v = parseInt(source, jobIdKnob.name(), digits, 0, 999'999'999);
    e.masterPort = static_cast<uint16_t>(kDerivedPortBase + v % 10000);
    e.masterPortOrigin = fmt::format("derived from {}={}", jobIdKnob.name(), *id);
    return;
  }
  e.masterPort = kFallbackPort;
  e.masterPortOrigin = fmt::format("default {} (MASTER_PORT unset, no {})", kFallbackPort, jobIdKnob.name());
}

// First host of the first set Slurm node list; nullopt when none is set.
std::optional<std::pair<std::string, std::string>> slurmFirstHost() {
  for (const Knob* k : {&kSlurmStepNodeList, &kSlurmJobNodeList, &kSlurmNodeList}) {
    if (auto v = k->raw()) {
      try {
        return std::make_pair(firstNodeListHost(*v), fmt::format("first host of {}=\"{}\"", k->name(), *v));
      } catch (const ValueError& err) {
        throw ValueError(
            fmt::format("cannot initialise from the environment: {} is malformed: {}", k->name(), err.what()));
      }
    }
  }
  return std::nullopt;
}

LaunchEnvironment fromTorchrun() {
  const auto src = LaunchSource::Torchrun;
  Reader r(src);
  std::string rank = r.need(kRank), world = r.need(kWorldSize), addr = r.need(kMasterAddr), port = r.need(kMasterPort);
  r.throwIfMissing();
  LaunchEnvironment e;
  e.source = src;
  e.worldSize = static_cast<int>(r.integer(kWorldSize, world, 1, 1 << 30));
  e.rank = static_cast<int>(r.integer(kRank, rank, 0, 1 << 30));
  auto lr = r.get(kLocalRank);
  auto lws = r.get(kLocalWorldSize);
  if (lr.has_value() != lws.has_value()) {
    fail(src, lr ? "LOCAL_RANK is set but LOCAL_WORLD_SIZE missing" : "LOCAL_WORLD_SIZE is set but LOCAL_RANK missing");
  }
  if (lr) {
    e.localWorldSize = static_cast<int>(r.integer(kLocalWorldSize, *lws, 1, 1 << 30));
    e.localRank = static_cast<int>(r.integer(kLocalRank, *lr, 0, 1 << 30));
  } else {
    e.localRank = e.rank;
    e.localWorldSize = e.worldSize;
  }
  validateRanks(src, e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  e.masterAddr = addr;
  e.masterAddrOrigin = "MASTER_ADDR";
  e.masterPort = static_cast<uint16_t>(parseInt(src, "MASTER_PORT", port, 1, 65535));
  e.masterPortOrigin = "MASTER_PORT";
  return e;
}

LaunchEnvironment fromOpenMpi() {
  const auto src = LaunchSource::OpenMPI;
  Reader r(src);
  std::string rank = r.need(kOmpiRank), world = r.need(kOmpiSize), lr = r.need(kOmpiLocalRank),
              lws = r.need(kOmpiLocalSize);
  r.throwIfMissing();
  LaunchEnvironment e;
  e.source = src;
  e.worldSize = static_cast<int>(r.integer(kOmpiSize, world, 1, 1 << 30));
  e.rank = static_cast<int>(r.integer(kOmpiRank, rank, 0, 1 << 30));
  e.localWorldSize = static_cast<int>(r.integer(kOmpiLocalSize, lws, 1, 1 << 30));
  e.localRank = static_cast<int>(r.integer(kOmpiLocalRank, lr, 0, 1 << 30));
  validateRanks(src, e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (auto addr = kMasterAddr.raw()) {
    e.masterAddr = *addr;
    e.masterAddrOrigin = "MASTER_ADDR";
  } else if (e.localWorldSize == e.worldSize) {
    e.masterAddr = "127.0.0.1";
    e.masterAddrOrigin = "loopback: every rank is on this host (OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE)";
  } else if (auto first = slurmFirstHost()) {
    e.masterAddr = first->first;
    e.masterAddrOrigin = first->second + " (mpirun inside a Slurm allocation)";
  } else {
    fail(src, fmt::format("the job spans several hosts ({} of {} ranks on this one) and MASTER_ADDR is missing: "
                          "pass rank 0's host, e.g. `mpirun -x MASTER_ADDR=<host> ...`",
                          e.localWorldSize, e.worldSize));
  }
  masterPortFrom(src, e, kOmpiJobId);
  return e;
}

LaunchEnvironment fromSlurm() {
  const auto src = LaunchSource::Slurm;
  Reader r(src);
  std::string rank = r.need(kSlurmProcId);
  std::string world;
  if (auto n = kSlurmNtasks.raw()) world = *n;
  else if (auto n2 = kSlurmNprocs.raw()) world = *n2;
  else r.need("SLURM_NTASKS (or SLURM_NPROCS)");
  std::string lr = r.need(kSlurmLocalId);
  // The tasks on this node: the step's per-node list first. SLURM_NTASKS_PER_NODE is the job's
  // --ntasks-per-node, which a smaller step (`srun -n 1` in a 2-task allocation) inherits
  // unchanged, so it is only the fallback when no list is set.
  const Knob* countsKnob = nullptr;
  for (const Knob* k : {&kSlurmStepTasksPerNode, &kSlurmTasksPerNode}) {
    if (k->raw()) {
      countsKnob = k;
      break;
    }
  }
  auto perNode = kSlurmNtasksPerNode.raw();
  if (!countsKnob && !perNode) r.need("SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE");
  std::optional<std::pair<std::string, std::string>> first;
  auto addr = kMasterAddr.raw();
  if (!addr) {
    first = slurmFirstHost();
    if (!first) r.need("SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST (or MASTER_ADDR)");
  }
  r.throwIfMissing();

  LaunchEnvironment e;
  e.source = src;
  e.worldSize =
      static_cast<int>(parseInt(src, kSlurmNtasks.raw() ? "SLURM_NTASKS" : "SLURM_NPROCS", world, 1, 1 << 30));
  e.rank = static_cast<int>(r.integer(kSlurmProcId, rank, 0, 1 << 30));
  e.localRank = static_cast<int>(r.integer(kSlurmLocalId, lr, 0, 1 << 30));
  const char* localSizeName = kSlurmNtasksPerNode.name();
  if (countsKnob) {
    const std::string list = *countsKnob->raw();
    localSizeName = countsKnob->name();
    std::vector<int> counts;
    try {
      counts = expandTasksPerNode(list);
    } catch (const ValueError& err) {
      fail(src, fmt::format("{} is malformed: {}", countsKnob->name(), err.what()));
    }
    size_t node = 0;
    if (counts.size() > 1) {
      auto id = kSlurmNodeId.raw();
      if (!id)
        fail(src, fmt::format("{}=\"{}\" lists several nodes but SLURM_NODEID is missing", countsKnob->name(), list));
      node = static_cast<size_t>(r.integer(kSlurmNodeId, *id, 0, 1 << 30));
      if (node >= counts.size()) {
        fail(src, fmt::format("SLURM_NODEID={} but {}=\"{}\" lists only {} nodes", node, countsKnob->name(), list,
                              counts.size()));
      }
    }
    e.localWorldSize = counts[node];
  } else {
    e.localWorldSize = static_cast<int>(r.integer(kSlurmNtasksPerNode, *perNode, 1, 1 << 30));
  }
  validateRanks(src, e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", localSizeName);
  if (addr) {
    e.masterAddr = *addr;
    e.masterAddrOrigin = "MASTER_ADDR";
  } else {
    e.masterAddr = first->first;
    e.masterAddrOrigin = first->second;
  }
  masterPortFrom(src, e, kSlurmJobId);
  return e;
}

}  // namespace

const char* launchSourceName(LaunchSource s) {
  switch (s) {
    case LaunchSource::Torchrun: return "torchrun";
    case LaunchSource::OpenMPI: return "OpenMPI";
    case LaunchSource::Slurm: return "Slurm";
  }
  return "unknown";
}

std::string LaunchEnvironment::describe() const {
  return fmt::format("rank {} of {} (local {} of {}) via {}, master {}:{} (address: {}; port: {})", rank, worldSize,
                     localRank, localWorldSize, launchSourceName(source), masterAddr, masterPort, masterAddrOrigin,
                     masterPortOrigin);
}

bool launchEnvironmentPresent() {
  return kRank.raw() || kWorldSize.raw() || kOmpiRank.raw() || kOmpiSize.raw() || kSlurmProcId.raw();
}

LaunchEnvironment detectEnvironment() {
  if (kRank.raw() || kWorldSize.raw()) return fromTorchrun();
  if (kOmpiRank.raw() || kOmpiSize.raw()) return fromOpenMpi();
  if (kSlurmProcId.raw()) return fromSlurm();
  throw ValueError(
      fmt::format("cannot initialise from the environment: no launcher variables found. Looked for: {}. Found: {}. "
                  "Start the program with cohortrun, torchrun-style variables, mpirun or srun",
                  kLookedFor, foundVariables()));
}

}  // namespace cohort::dist::env
