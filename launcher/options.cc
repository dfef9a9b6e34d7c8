#include <cohort/launcher/options.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cohort/config.h>
#include <cohort/core/tensor/device.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

namespace cohort::launcher {
namespace {

int parseInt(const std::string& text, const char* what) {
  try {
    size_t pos = 0;
    long v = std::stol(text, &pos);
    if (pos == text.size() && v >= 0 && v <= (1 << 30)) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  throw ValueError(fmt::format("{}: '{}' is not a non-negative integer", what, text));
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

int resolveNproc(const std::string& v) {
  if (v == "auto" || v == "gpu") {
    int gpus = cudaDeviceCount();
    if (gpus > 0) return gpus;
    if (v == "gpu") throw ValueError("--nproc-per-node gpu: this build or machine has no CUDA device");
  }
  if (v == "auto" || v == "cpu") return std::max(1u, std::thread::hardware_concurrency());
  int n = parseInt(v, "--nproc-per-node (a count, auto, cpu or gpu)");
  if (n < 1) throw ValueError("--nproc-per-node must be at least 1");
  return n;
}

std::string randomRunId() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

struct Parsed {
  LaunchOptions o;
  std::string nnodes = "1";
  std::string redirects = "0", tee = "0", localRanksFilter;
};

// Declares every flag on `app`, writing into `p`.
void declare(CLI::App& app, Parsed& p) {
  LaunchOptions& o = p.o;
  app.prefix_command();  // the first positional is the program; everything after it is its own
  app.add_option("--nnodes", p.nnodes, "number of nodes, N or MIN:MAX")->capture_default_str();
  app.add_option("--nproc-per-node,--nproc_per_node", o.nprocPerNode,
                 "workers on this node: a count, auto (GPUs if any, else cores), cpu or gpu")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", o.nodeRank,
                 "this node's rank in [0, nnodes); without it, nodes are ranked in order of arrival");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzvEndpoint,
                 "host:port of the rendezvous store (hosted by the launcher with node rank 0); required for "
                 "several nodes unless --master-addr is given");
  app.add_option("--rdzv-id,--rdzv_id", o.rdzvId, "job id shared by every node (COHORT_RUN_ID for the workers)");
  app.add_option("--rdzv-timeout,--rdzv_timeout", o.rdzvTimeout, "seconds a rendezvous may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rdzv-last-call,--rdzv_last_call", o.rdzvLastCall,
                 "with --nnodes MIN:MAX, seconds to wait for more nodes once MIN arrived")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--standalone", o.standalone, "single-node job: rendezvous on 127.0.0.1 at a free port");
  app.add_option("--max-restarts,--max_restarts", o.maxRestarts,
                 "restarts of the whole job (every node) allowed after a worker fails")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--monitor-interval,--monitor_interval", o.monitorInterval,
                 "seconds between checks of the other nodes' state")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-timeout,--stop_timeout", o.stopTimeout,
                 "seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-dir,--log_dir", o.logDir,
                 "write each worker's output to <dir>/<run id>/attempt_<n>/rank_<r>.{stdout,stderr}");
  app.add_option("-r,--redirects", p.redirects,
                 "send workers' streams to the log files only: 1 stdout, 2 stderr, 3 both; or per local rank "
                 "0:1,1:2")
      ->capture_default_str();
  app.add_option("-t,--tee", p.tee, "also copy workers' streams to the log files (same values as --redirects)")
      ->capture_default_str();
  app.add_option("--local-ranks-filter,--local_ranks_filter", p.localRanksFilter,
                 "show only these local ranks' output on the console, e.g. 0 or 0,2");
  app.add_option("--master-addr,--master_addr", o.masterAddr,
                 "rendezvous host when no --rdzv-endpoint is given (torchrun's static rendezvous)");
  app.add_option("--master-port,--master_port", o.masterPort, "rendezvous port with --master-addr (default 29500)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--profile", o.profileDir,
                 "profile every rank over a window of steps (COHORT_PROFILE_STEPS, default 1:3) and merge the ranks' "
                 "traces into DIR/trace.json (Chrome trace: open in ui.perfetto.dev)");
  app.add_option("--cpu-bind,--cpu_bind", o.cpuBind,
                 "cores: bind each local rank and its threads to its own share of this launcher's CPUs (equal "
                 "contiguous slices; ranks share CPUs only when there are more ranks than CPUs), as mpirun's "
                 "--bind-to core; none: leave placement to the kernel")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "cores"}));
  app.add_flag("--help-env", o.helpEnv, "list every environment variable the runtime reads, and exit");
  app.add_flag("--version", o.version, "print the version and exit");
}

void finish(Parsed& p, const std::vector<std::string>& remaining) {
  LaunchOptions& o = p.o;
  std::vector<std::string> rest = remaining;
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    // prefix_command() hands an unknown flag on as if it were the program.
    throw ValueError(fmt::format("unknown option {} (options come before the program; put -- before a program "
                                 "whose name starts with '-')",
                                 rest.front()));
  }
  if (o.helpEnv || o.version) return;
  if (rest.empty()) throw ValueError("no program given: cohortrun [options] [--] program [args...]");
  o.program = rest.front();
  o.programArgs.assign(rest.begin() + 1, rest.end());

  auto parts = split(p.nnodes, ':');
  if (parts.size() == 1) {
    o.minNodes = o.maxNodes = parseInt(parts[0], "--nnodes");
  } else if (parts.size() == 2) {
    o.minNodes = parseInt(parts[0], "--nnodes MIN");
    o.maxNodes = parseInt(parts[1], "--nnodes MAX");
  } else {
    throw ValueError(fmt::format("--nnodes '{}' is neither N nor MIN:MAX", p.nnodes));
  }
  if (o.minNodes < 1 || o.maxNodes < o.minNodes) {
    throw ValueError(fmt::format("--nnodes {}: need 1 <= MIN <= MAX", p.nnodes));
  }
  o.nproc = resolveNproc(o.nprocPerNode);
  if (o.nodeRank && (*o.nodeRank < 0 || *o.nodeRank >= o.maxNodes)) {
    throw ValueError(
        fmt::format("--node-rank {} is outside [0, {}) for --nnodes {}", *o.nodeRank, o.maxNodes, p.nnodes));
  }
  o.redirects = parseStreamSpec(p.redirects, "--redirects");
  o.tee = parseStreamSpec(p.tee, "--tee");
  if (!p.localRanksFilter.empty()) {
    std::vector<int> ranks;
    for (auto& s : split(p.localRanksFilter, ',')) ranks.push_back(parseInt(s, "--local-ranks-filter"));
    o.localRanksFilter = ranks;
  }
  if (o.standalone) {
    if (o.maxNodes > 1) throw ValueError("--standalone is a single-node job, but --nnodes asks for several");
    if (!o.rdzvEndpoint.empty() || !o.masterAddr.empty()) {
      throw ValueError("--standalone picks its own rendezvous address; drop --rdzv-endpoint/--master-addr");
    }
  }
  if (o.masterPort && o.masterAddr.empty()) throw ValueError("--master-port needs --master-addr");
  if (o.maxNodes > 1 && o.rdzvEndpoint.empty() && o.masterAddr.empty()) {
    throw ValueError(fmt::format(
        "--nnodes {} needs a rendezvous address every node can reach: pass --rdzv-endpoint host:port (the "
        "same on every node; the node with --node-rank 0 hosts it). cohortrun never defaults to localhost for "
        "several nodes",
        p.nnodes));
  }
  if (!o.rdzvEndpoint.empty()) parseHostPort(o.rdzvEndpoint, "--rdzv-endpoint");
  if (o.rdzvId.empty()) o.rdzvId = o.maxNodes > 1 ? "none" : randomRunId();
}

}  // namespace

int StreamSpec::forLocalRank(int localRank) const {
  if (perRank.empty()) return all;
  for (auto& [r, bits] : perRank) {
    if (r == localRank) return bits;
  }
  return kNoStreams;
}

StreamSpec parseStreamSpec(const std::string& text, const char* flag) {
  StreamSpec s;
  auto bitsOf = [&](const std::string& v) {
    int b = parseInt(v, flag);
    if (b > 3)
      throw ValueError(fmt::format("{} {}: stream values are 0 (none), 1 (stdout), 2 (stderr), 3 (both)", flag, text));
    return b;
  };
  if (text.find(':') == std::string::npos) {
    s.all = bitsOf(text);
    return s;
  }
  for (auto& item : split(text, ',')) {
    auto kv = split(item, ':');
    if (kv.size() != 2) throw ValueError(fmt::format("{} '{}': expected N or LOCAL_RANK:N,...", flag, text));
    s.perRank.emplace_back(parseInt(kv[0], flag), bitsOf(kv[1]));
  }
  return s;
}

std::string Endpoint::str() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

Endpoint parseHostPort(const std::string& text, const char* flag) {
  Endpoint e;
  e.origin = flag;
  std::string hostPart, portPart;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw ValueError(fmt::format("{} '{}': expected [ipv6]:port", flag, text));
    }
    hostPart = text.substr(1, close - 1);
    portPart = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) throw ValueError(fmt::format("{} '{}': expected host:port", flag, text));
    hostPart = text.substr(0, colon);
    portPart = text.substr(colon + 1);
  }
  if (hostPart.empty()) throw ValueError(fmt::format("{} '{}': the host is empty", flag, text));
  int port = parseInt(portPart, flag);
  if (port < 1 || port > 65535) throw ValueError(fmt::format("{} '{}': port out of range [1, 65535]", flag, text));
  e.host = hostPart;
  e.port = static_cast<uint16_t>(port);
  return e;
}

Endpoint resolveEndpoint(const LaunchOptions& o) {
  if (!o.rdzvEndpoint.empty()) return parseHostPort(o.rdzvEndpoint, "--rdzv-endpoint");
  if (!o.masterAddr.empty()) {
    Endpoint e;
    e.host = o.masterAddr;
    e.port = static_cast<uint16_t>(o.masterPort.value_or(29500));
    e.origin = "--master-addr/--master-port";
    return e;
  }
  COHORT_CHECK(o.maxNodes == 1, "several nodes without a rendezvous endpoint");
  Endpoint e;
  e.host = "127.0.0.1";
  e.port = 0;
  e.origin = o.standalone ? "--standalone" : "single node (as --standalone)";
  return e;
}

LaunchOptions parseArgs(const std::vector<std::string>& args) {
  CLI::App app{"cohortrun"};
  Parsed p;
  declare(app, p);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw ValueError(e.what());
  }
  finish(p, app.remaining());
  return p.o;
}

std::string helpEnvText() {
  std::string out = "Environment variables read by cohort programs and cohortrun (default in brackets):\n";
  for (const auto& k : env::allKnobs()) {
    out += fmt::format("  {}{}\n      {}\n", k.name, k.defaultValue.empty() ? "" : fmt::format(" [{}]", k.defaultValue),
                       k.description);
  }
  return out;
}

std::optional<LaunchOptions> parseCommandLine(int argc, char** argv, int* exitCode) {
  CLI::App app{"cohortrun: starts and supervises the worker processes of a cohort job on this node.\n"
               "  cohortrun --standalone --nproc-per-node 2 ./train\n"
               "  cohortrun --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 --nproc-per-node 8 ./train --epochs 3",
               "cohortrun"};
  Parsed p;
  declare(app, p);
  app.footer("Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, "
             "MASTER_PORT, COHORT_RUN_ID, COHORT_RESTART_COUNT, COHORT_MAX_RESTARTS and OMP_NUM_THREADS=1 unless set.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *exitCode = app.exit(e);
    return std::nullopt;
  }
  try {
    finish(p, app.remaining());
  } catch (const ValueError& e) {
    fmt::print(stderr, "cohortrun: {}\nRun with --help for more information.\n", e.what());
    *exitCode = 2;
    return std::nullopt;
  }
  if (p.o.version) {
    fmt::print("cohortrun {}\n", COHORT_VERSION);
    *exitCode = 0;
    return std::nullopt;
  }
  if (p.o.helpEnv) {
    fmt::print("{}", helpEnvText());
    *exitCode = 0;
    return std::nullopt;
  }
  return p.o;
}

}  // namespace cohort::launcher
