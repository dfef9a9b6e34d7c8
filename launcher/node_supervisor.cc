#include <cohort/launcher/node_supervisor.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/cpu_affinity.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/job_profile.h>
#include <cohort/launcher/rendezvous.h>
#include <cohort/launcher/worker_group.h>

extern char** environ;

namespace cohort::launcher {

COHORT_ENV_KNOB(kOmpThreads, "OMP_NUM_THREADS", "",
                "Threads per process for OpenMP and OpenBLAS; cohortrun sets 1 for its workers unless it is set");

namespace {

using Clock = std::chrono::steady_clock;

int gWake[2] = {-1, -1};
std::atomic<bool> gSupervising{false};

void onSignal(int sig) {
  if (sig != SIGCHLD && !gSupervising.load()) {
    // No worker exists (rendezvous, or between rounds): nothing to stop, leave at once.
    _exit(128 + sig);
  }
  int saved = errno;
  unsigned char b = sig == SIGCHLD ? 0 : static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(gWake[1], &b, 1);
  (void)ignored;
  errno = saved;
}

void installSignals() {
  if (gWake[0] < 0) {
    if (::pipe2(gWake, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("cohortrun: cannot create the signal pipe");
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// The first terminating signal waiting in the pipe, or 0.
int drainWake() {
  unsigned char buf[64];
  int sig = 0;
  ssize_t n;
  while ((n = ::read(gWake[0], buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != 0 && sig == 0) sig = buf[i];
    }
  }
  return sig;
}

void say(const std::string& msg) { fmt::print(stderr, "cohortrun: {}\n", msg); }

std::vector<std::string> baseEnvironment() {
  static const char* kOverridden[] = {"RANK",
                                      "LOCAL_RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",
                                      "GROUP_WORLD_SIZE",
                                      "ROLE_RANK",
                                      "ROLE_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "COHORT_RUN_ID",
                                      "COHORT_RESTART_COUNT",
                                      "COHORT_MAX_RESTARTS",
                                      "COHORT_STORE_HOSTED_BY_LAUNCHER"};
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    bool drop = false;
    for (const char* o : kOverridden) drop = drop || name == o;
    if (!drop) out.push_back(kv);
  }
  return out;
}

std::vector<WorkerSpec> workerSpecs(const LaunchOptions& o, const RoundInfo& info, bool setOmp,
                                    const std::vector<int>& cpus) {
  std::vector<std::string> base = baseEnvironment();
  if (setOmp) base.push_back("OMP_NUM_THREADS=1");
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < o.nproc; ++local) {
    WorkerSpec s;
    s.localRank = local;
    if (!cpus.empty()) s.cpus = util::cpuSlice(cpus, local, o.nproc);
    s.globalRank = info.rankOffset + local;
    s.env = base;
    auto add = [&](const char* k, const auto& v) { s.env.push_back(fmt::format("{}={}", k, v)); };
    add("RANK", s.globalRank);
    add("LOCAL_RANK", local);
    add("WORLD_SIZE", info.worldSize);
    add("LOCAL_WORLD_SIZE", o.nproc);
    add("GROUP_RANK", info.groupRank);
    add("GROUP_WORLD_SIZE", info.numNodes);
    add("ROLE_RANK", s.globalRank);
    add("ROLE_WORLD_SIZE", info.worldSize);
    add("MASTER_ADDR", info.masterAddr);
    add("MASTER_PORT", info.masterPort);
    add("COHORT_RUN_ID", o.rdzvId);
    add("COHORT_RESTART_COUNT", info.round);
    add("COHORT_MAX_RESTARTS", o.maxRestarts);
    add("COHORT_STORE_HOSTED_BY_LAUNCHER", 1);
    if (!o.profileDir.empty()) add("COHORT_PROFILE", std::filesystem::absolute(o.profileDir).string());
    specs.push_back(std::move(s));
  }
  return specs;
}

std::string failureSummary(const RoundInfo& info, const WorkerExit& e, const std::vector<std::string>& lines,
                           const std::string& logDir) {
  const NodeEntry& node = info.nodes.at(info.groupRank);
  std::string s = fmt::format("rank {} (local rank {} on node {}, host {}, pid {}) {}", e.globalRank, e.localRank,
                              node.groupRank, node.host, e.pid, e.describe());
  if (!logDir.empty()) s += fmt::format("; its logs: {}/rank_{}.{{stdout,stderr}}", logDir, e.globalRank);
  if (lines.empty()) {
    s += "\n  (it wrote nothing)";
  } else {
    s += fmt::format("\n  last {} lines of its output:", lines.size());
    for (auto& l : lines) s += fmt::format("\n    [{}]: {}", e.globalRank, l);
  }
  return s;
}

// After a profiled job: the workers merged their traces when the window closed; a job that ended
// before it left only per-rank files, merged here.
void reportProfile(const std::string& dir) {
  const std::string trace = dir + "/trace.json";
  try {
    if (!std::filesystem::exists(trace)) {
      int n = dist::mergeRankTraceFiles(dir);
      if (n == 0) {
        say(fmt::format("--profile: no rank wrote a trace into {} (did the job reach an optimizer step?)", dir));
        return;
      }
      say(fmt::format("--profile: merged the traces of {} ranks (the job ended before its profiling window closed)",
                      n));
    }
    say(fmt::format("--profile: job trace {} ({} bytes); open it in https://ui.perfetto.dev or chrome://tracing", trace,
                    std::filesystem::file_size(trace)));
  } catch (const std::exception& e) {
    say(fmt::format("--profile: {}", e.what()));
  }
}

}  // namespace

int superviseNode(const LaunchOptions& o) {
  std::string program;
  try {
    program = resolveProgram(o.program);
  } catch (const ValueError& e) {
    say(e.what());
    return 127;
  }
  installSignals();
  const bool setOmp = !kOmpThreads.raw().has_value();
  if (setOmp) {
    say(fmt::format("OMP_NUM_THREADS is not set: each of the {} workers gets OMP_NUM_THREADS=1 (one thread per "
                    "worker); set it to use more",
                    o.nproc));
  }
  std::vector<int> bindCpus;  // the CPUs shared out among the local ranks (--cpu-bind cores)
  if (o.cpuBind == "cores") {
    try {
      bindCpus = util::allowedCpus();
    } catch (const Error& e) {
      say(e.what());
      return 1;
    }
    std::vector<std::string> where;
    for (int local = 0; local < o.nproc; ++local)
      where.push_back(fmt::format("{} on {}", local, util::cpuListString(util::cpuSlice(bindCpus, local, o.nproc))));
    say(fmt::format("--cpu-bind cores: local ranks bound to CPUs: {}", fmt::join(where, ", ")));
    const int perRank = static_cast<int>(bindCpus.size()) / o.nproc;
    if (perRank < 1) {
      say(fmt::format("--cpu-bind cores: {} local ranks share {} CPUs, so some ranks share a CPU", o.nproc,
                      bindCpus.size()));
    } else if (!setOmp) {
      const int omp = std::atoi(kOmpThreads.raw()->c_str());
      if (omp > perRank)
        say(fmt::format("--cpu-bind cores: OMP_NUM_THREADS={} is more threads than the {} CPU(s) a rank is bound to; "
                        "they will share them",
                        omp, perRank));
    }
  }

  std::unique_ptr<Rendezvous> rdzv;
  try {
    rdzv = std::make_unique<Rendezvous>(o, resolveEndpoint(o));
  } catch (const Error& e) {
    say(e.what());
    return 1;
  }
  std::string runDir = o.logDir.empty() ? "" : fmt::format("{}/{}", o.logDir, o.rdzvId);
  const bool needFiles = o.redirects.all || !o.redirects.perRank.empty() || o.tee.all || !o.tee.perRank.empty();
  if (runDir.empty() && needFiles) {
    char tmpl[] = "/tmp/cohortrun_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      say("cannot create a log directory for --redirects/--tee");
      return 1;
    }
    runDir = fmt::format("{}/{}", tmpl, o.rdzvId);
    say(fmt::format("--redirects/--tee without --log-dir: logs go to {}", runDir));
  }

  for (int round = 0;; ++round) {
    RoundInfo info;
    try {
      info = rdzv->join(round);
    } catch (const Error& e) {
      say(e.what());
      return 1;
    }
    say(fmt::format("{}node {} of {}: ranks {}..{} of {}{}, store {}:{}, run '{}'",
                    round > 0 ? fmt::format("restart {} of {}: ", round, o.maxRestarts) : std::string(), info.groupRank,
                    info.numNodes, info.rankOffset, info.rankOffset + o.nproc - 1, info.worldSize,
                    rdzv->isHost() ? " (hosting the rendezvous at " + rdzv->endpoint().str() + ")" : std::string(),
                    info.masterAddr, info.masterPort, o.rdzvId));
    LogConfig logs;
    logs.attemptDir = runDir.empty() ? "" : fmt::format("{}/attempt_{}", runDir, round);
    logs.redirects = o.redirects;
    logs.tee = o.tee;
    logs.localRanksFilter = o.localRanksFilter;
    WorkerGroup group(program, o.programArgs, logs);
    gSupervising = true;
    try {
      group.start(workerSpecs(o, info, setOmp, bindCpus));
    } catch (const Error& e) {
      gSupervising = false;
      say(e.what());
      return 1;
    }

    const auto interval =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(o.monitorInterval));
    auto nextCheck = Clock::now();
    bool markedDone = false;
    std::optional<Outcome> outcome;
    int exitCode = 0;
    bool success = false;
    try {
      while (!outcome && !success) {
        auto wait = std::max(std::chrono::milliseconds(0),
                             std::chrono::duration_cast<std::chrono::milliseconds>(nextCheck - Clock::now()));
        auto exits = group.poll(wait, gWake[0]);
        if (int sig = drainWake()) {
          say(fmt::format("received {}: stopping the workers", signalName(sig)));
          group.signalAll(sig);
          Outcome stop{Outcome::Kind::Stop, 128 + sig,
                       fmt::format("node {} (host {}) received {}", info.groupRank, localHostName(), signalName(sig))};
          group.stop(o.stopTimeout);
          gSupervising = false;
          try {
            rdzv->publishOutcome(round, stop);
            rdzv->leave(round, info.numNodes);
          } catch (const Error&) {
          }
          return 128 + sig;
        }
        for (const auto& e : exits) {
          if (e.ok() || outcome) continue;
          Outcome mine;
          mine.kind = round < o.maxRestarts ? Outcome::Kind::Restart : Outcome::Kind::Fail;
          mine.exitCode = e.shellCode();
          mine.summary = failureSummary(info, e, group.lastLines(e.globalRank), logs.attemptDir);
          say(fmt::format("rank {} {}", e.globalRank, e.describe()));
          outcome = rdzv->publishOutcome(round, mine);
        }
        if (outcome) break;
        if (!markedDone && group.numRunning() == 0) {
          rdzv->markDone(round);
          markedDone = true;
        }
        if (Clock::now() >= nextCheck || markedDone) {
          nextCheck = Clock::now() + interval;
          outcome = rdzv->outcome(round);
          if (!outcome && markedDone && rdzv->numDone(round) >= info.numNodes) success = true;
        }
      }
    } catch (const Error& e) {
      say(fmt::format("lost the rendezvous store at {}: {}; stopping the workers", rdzv->endpoint().str(), e.what()));
      group.stop(o.stopTimeout);
      gSupervising = false;
      return 1;
    }
    if (success) {
      gSupervising = false;
      rdzv->leave(round, info.numNodes);
      say(fmt::format("all {} workers of the job finished", info.worldSize));
      if (!o.profileDir.empty()) reportProfile(o.profileDir);
      return 0;
    }
    group.stop(o.stopTimeout);
    gSupervising = false;
    if (outcome->kind == Outcome::Kind::Restart) {
      say(fmt::format("restarting every node's workers ({} of {} restarts) after a failure:\n  {}", round + 1,
                      o.maxRestarts, outcome->summary));
      continue;
    }
    if (outcome->kind == Outcome::Kind::Stop) {
      say(fmt::format("the job was stopped: {}", outcome->summary));
    } else {
      say(fmt::format("job FAILED after {} attempt{} (--max-restarts {}):\n  {}", round + 1, round ? "s" : "",
                      o.maxRestarts, outcome->summary));
    }
    exitCode = outcome->exitCode;
    rdzv->leave(round, info.numNodes);
    return exitCode;
  }
}

}  // namespace cohort::launcher
