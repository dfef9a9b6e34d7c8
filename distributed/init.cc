#include <cohort/distributed/init.h>
#include <cohort/distributed/job_profile.h>

#include <unistd.h>

#include <climits>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/store/tcp_store.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kBackendKnob, "COHORT_BACKEND", "auto",
                "Backend for CPU tensors chosen by initProcessGroup(): auto, gloo, mpi or shm");
COHORT_ENV_KNOB(kHostedByLauncher, "COHORT_STORE_HOSTED_BY_LAUNCHER", "0",
                "1: the launcher hosts the TCP store at MASTER_ADDR:MASTER_PORT, so rank 0 does not");

namespace {

std::mutex gDefaultMu;
ProcessGroupPtr gDefault;

std::string hostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// "world=<n> host=<h> pid=<p>": what each rank publishes at the rendezvous.
struct JoinInfo {
  int worldSize = -1;
  std::string text;
};
JoinInfo parseJoin(const std::string& text) {
  JoinInfo j;
  j.text = text;
  if (text.rfind("world=", 0) == 0) {
    try {
      j.worldSize = std::stoi(text.substr(6));
    } catch (const std::exception&) {
    }
  }
  return j;
}

void rendezvous(Store& store, const env::LaunchEnvironment& e, const std::string& group, Millis timeout,
                const std::string& where) {
  const std::string prefix = fmt::format("cohort_init/{}/", group);
  int64_t claims = store.add(fmt::format("{}claim/{}", prefix, e.rank), 1);
  if (claims > 1) {
    throw DistError(
        fmt::format("initProcessGroup: rank {} of group '{}' was already claimed by another process at the store {} "
                    "(two processes were given the same rank, or the store is left over from an earlier run)",
                    e.rank, group, where));
  }
  store.set(fmt::format("{}rank/{}", prefix, e.rank),
            fmt::format("world={} host={} pid={}", e.worldSize, hostName(), ::getpid()));
  std::vector<std::string> keys;
  for (int r = 0; r < e.worldSize; ++r) keys.push_back(fmt::format("{}rank/{}", prefix, r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < e.worldSize; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(fmt::format(
        "initProcessGroup: ranks [{}] of {} did not join group '{}' at the store {} within {} ms ({} joined; "
        "this is rank {})",
        fmt::join(missing, ", "), e.worldSize, group, where, timeout.count(), e.worldSize - missing.size(), e.rank));
  }
  std::vector<std::string> disagree;
  for (int r = 0; r < e.worldSize; ++r) {
    JoinInfo j = parseJoin(store.getString(keys[r]));
    if (j.worldSize != e.worldSize) disagree.push_back(fmt::format("rank {}: {}", r, j.text));
  }
  if (!disagree.empty()) {
    throw ValueError(fmt::format("initProcessGroup: ranks disagree on the world size (this is rank {} with {}): {}",
                                 e.rank, e.worldSize, fmt::join(disagree, "; ")));
  }
}

}  // namespace

ProcessGroupPtr initProcessGroup(const InitOptions& options) {
  if (options.setDefault) {
    std::lock_guard<std::mutex> lock(gDefaultMu);
    if (gDefault) {
      throw ValueError(fmt::format("initProcessGroup: the default process group ('{}', rank {} of {}) already "
                                   "exists; call destroyProcessGroup() first",
                                   gDefault->name(), gDefault->rank(), gDefault->size()));
    }
  }
  const env::LaunchEnvironment e = options.environment ? *options.environment : env::detectEnvironment();
  if (e.worldSize < 1 || e.rank < 0 || e.rank >= e.worldSize) {
    throw ValueError(fmt::format("initProcessGroup: rank {} is out of range for world size {}", e.rank, e.worldSize));
  }
  if (e.masterAddr.empty() || e.masterPort == 0) {
    throw ValueError(fmt::format("initProcessGroup: the master address and port must be set (got '{}:{}')",
                                 e.masterAddr, e.masterPort));
  }
  const bool host = e.rank == 0 && options.hostStore.value_or(!kHostedByLauncher.flag());
  const std::string where = fmt::format("{}:{}", e.masterAddr, e.masterPort);
  logging::setPrefix(fmt::format("rank {}", e.rank));
  setFlightRecorderProcessRank(e.rank);
  COHORT_LOG(Info, "initProcessGroup: {}{}", e.describe(), host ? "; hosting the store" : "");

  TCPStoreOptions so;
  so.host = e.masterAddr;
  so.port = e.masterPort;
  so.timeout = options.storeTimeout;
  so.connectTimeout = options.storeTimeout;
  so.isServer = host;
  std::shared_ptr<TCPStore> store;
  try {
    store = std::make_shared<TCPStore>(so);
  } catch (const StoreError& err) {
    throw StoreError(fmt::format("initProcessGroup ({}): cannot {} the store: {}", e.describe(),
                                 host ? "host" : "connect to", err.what()));
  }
  rendezvous(*store, e, options.groupName, options.storeTimeout, where);

  ProcessGroupOptions po;
  po.name = options.groupName;
  po.timeout = options.timeout;
  po.backend = options.backend.empty() ? kBackendKnob.str() : options.backend;
  ProcessGroupPtr pg = ProcessGroup::create(store, e.rank, e.worldSize, po);
  if (options.setDefault) {
    std::lock_guard<std::mutex> lock(gDefaultMu);
    if (gDefault) {
      throw ValueError("initProcessGroup: another thread set the default process group meanwhile");
    }
    gDefault = pg;
  }
  if (std::optional<JobProfileOptions> prof = jobProfileOptionsFromEnv()) startJobProfiling(pg, *prof);
  return pg;
}

ProcessGroupPtr defaultProcessGroup() {
  std::lock_guard<std::mutex> lock(gDefaultMu);
  if (!gDefault) {
    throw ValueError("the default process group is not initialised: call dist::initProcessGroup() first");
  }
  return gDefault;
}

bool isInitialized() {
  std::lock_guard<std::mutex> lock(gDefaultMu);
  return gDefault != nullptr;
}

void destroyProcessGroup() {
  finishJobProfiling();  // a profiling window still open: what it recorded goes to its file
  ProcessGroupPtr old;
  {
    std::lock_guard<std::mutex> lock(gDefaultMu);
    old = std::move(gDefault);
  }
  // `old` is released here, outside the lock: its destructor joins backend threads.
}

}  // namespace cohort::dist
