#include <cohort/launcher/rendezvous.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>

namespace cohort::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using dist::Millis;

Millis toMillis(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000.0)); }

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

dist::Bytes bytes(const std::string& s) { return dist::Bytes(s.begin(), s.end()); }

}  // namespace

std::string localHostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

Rendezvous::Rendezvous(const LaunchOptions& options, Endpoint endpoint)
    : options_(options), endpoint_(std::move(endpoint)) {
  const bool mustHost = endpoint_.port == 0 || (options_.nodeRank && *options_.nodeRank == 0);
  const bool mayHost = !options_.nodeRank.has_value();
  if (mustHost || mayHost) {
    dist::TCPStoreServerOptions so;
    so.host = endpoint_.host;
    so.port = endpoint_.port;
    try {
      server_ = std::make_unique<dist::TCPStoreServer>(so);
      endpoint_.port = server_->port();
    } catch (const StoreError& err) {
      if (mustHost) {
        throw StoreError(fmt::format("cohortrun: cannot host the rendezvous store at {} ({}): {}", endpoint_.str(),
                                     endpoint_.origin, err.what()));
      }
      // Without node ranks, the launcher that can bind the endpoint hosts it; this one cannot.
      COHORT_LOG(Debug, "cohortrun: not hosting the rendezvous store at {}: {}", endpoint_.str(), err.what());
    }
  }
  dist::TCPStoreOptions co;
  co.host = endpoint_.host;
  co.port = endpoint_.port;
  co.timeout = toMillis(options_.rdzvTimeout);
  co.connectTimeout = toMillis(options_.rdzvTimeout);
  auto t0 = Clock::now();
  try {
    store_ = std::make_unique<dist::TCPStore>(co);
  } catch (const StoreError& err) {
    throw TimeoutError(fmt::format(
        "cohortrun: rendezvous at {} ({}) failed: the store there could not be reached for {:.1f} s, so 0 of {} "
        "nodes are known to have arrived (is the launcher with --node-rank 0 running, and is {} reachable from "
        "this host?): {}",
        endpoint_.str(), endpoint_.origin, secondsSince(t0), options_.minNodes, endpoint_.host, err.what()));
  }
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::key(int round, const std::string& name) const {
  return fmt::format("cohortrun/{}/{}/{}", options_.rdzvId, round, name);
}

RoundInfo Rendezvous::join(int round) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + toMillis(options_.rdzvTimeout);
  const std::string host = localHostName();
  if (server_) {
    workerServer_.reset();  // the previous round's workers are gone
    dist::TCPStoreServerOptions wo;
    wo.host = endpoint_.host;
    wo.port = 0;
    workerServer_ = std::make_unique<dist::TCPStoreServer>(wo);
    store_->set(key(round, "worker_port"), std::to_string(workerServer_->port()));
  }
  const int index = static_cast<int>(store_->add(key(round, "arrived"), 1)) - 1;
  store_->set(key(round, fmt::format("node/{}", index)),
              fmt::format("{} {} {}", options_.nodeRank.value_or(-1), options_.nproc, host));
  const std::string closedKey = key(round, "closed");
  // The node that completes MAX closes the round; with MIN:MAX the last-call rule below may close it earlier.
  if (index + 1 >= options_.maxNodes) store_->compareSet(closedKey, {}, bytes(std::to_string(options_.maxNodes)));
  int64_t lastCount = -1;
  auto lastChange = Clock::now();
  int closedAt = -1;
  while (true) {
    if (store_->check({closedKey})) {
      std::string v = store_->getString(closedKey);
      closedAt = std::stoi(v);
      break;
    }
    auto now = Clock::now();
    if (now >= deadline) {
      int64_t count = store_->add(key(round, "arrived"), 0);
      throw TimeoutError(fmt::format(
          "cohortrun: rendezvous at {} ({}) timed out after {:.1f} s: {} of {} nodes arrived for round {} of job "
          "'{}' (this node: {} on {}). Check that every node runs cohortrun with the same --rdzv-endpoint, "
          "--rdzv-id and --nnodes",
          endpoint_.str(), endpoint_.origin, secondsSince(t0), count,
          options_.minNodes == options_.maxNodes ? std::to_string(options_.maxNodes)
                                                 : fmt::format("{}..{}", options_.minNodes, options_.maxNodes),
          round, options_.rdzvId,
          options_.nodeRank ? fmt::format("node rank {}", *options_.nodeRank) : std::string("unranked node"), host));
    }
    auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50));
    try {
      store_->wait({closedKey}, std::chrono::duration_cast<Millis>(slice) + Millis(1));
      continue;
    } catch (const TimeoutError&) {
    }
    if (options_.minNodes < options_.maxNodes) {
      int64_t count = store_->add(key(round, "arrived"), 0);
      if (count != lastCount) {
        lastCount = count;
        lastChange = Clock::now();
      } else if (count >= options_.minNodes && secondsSince(lastChange) >= options_.rdzvLastCall) {
        store_->compareSet(closedKey, {}, bytes(std::to_string(count)));
      }
    }
  }
  if (index >= closedAt) {
    throw DistError(fmt::format("cohortrun: arrived as node {} for round {} at {}, but the round had closed with {} "
                                "nodes",
                                index + 1, round, endpoint_.str(), closedAt));
  }

  RoundInfo info;
  info.round = round;
  info.numNodes = closedAt;
  struct Arrival {
    int index;
    NodeEntry e;
  };
  std::vector<Arrival> arrivals;
  int ranked = 0;
  for (int i = 0; i < closedAt; ++i) {
    std::istringstream in(store_->getString(key(round, fmt::format("node/{}", i))));
    Arrival a{i, {}};
    in >> a.e.requestedRank >> a.e.nproc >> a.e.host;
    if (a.e.requestedRank >= 0) ++ranked;
    arrivals.push_back(a);
  }
  if (ranked != 0 && ranked != closedAt) {
    throw ValueError(fmt::format("cohortrun: {} of {} nodes passed --node-rank; pass it on every node or on none",
                                 ranked, closedAt));
  }
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.e.requestedRank < b.e.requestedRank; });
  for (size_t i = 1; i < arrivals.size(); ++i) {
    if (ranked && arrivals[i].e.requestedRank == arrivals[i - 1].e.requestedRank) {
      throw ValueError(fmt::format("cohortrun: two nodes ({} and {}) passed --node-rank {}", arrivals[i - 1].e.host,
                                   arrivals[i].e.host, arrivals[i].e.requestedRank));
    }
  }
  int offset = 0;
  for (size_t g = 0; g < arrivals.size(); ++g) {
    arrivals[g].e.groupRank = static_cast<int>(g);
    if (arrivals[g].index == index) {
      info.groupRank = static_cast<int>(g);
      info.rankOffset = offset;
    }
    offset += arrivals[g].e.nproc;
    info.nodes.push_back(arrivals[g].e);
  }
  info.worldSize = offset;
  info.masterAddr = endpoint_.host;
  std::string port = store_->getString(key(round, "worker_port"));
  info.masterPort = static_cast<uint16_t>(std::stoi(port));
  return info;
}

std::optional<Outcome> Rendezvous::outcome(int round) {
  const std::string k = key(round, "outcome");
  if (!store_->check({k})) return std::nullopt;
  std::string v = store_->getString(k);
  std::istringstream in(v);
  Outcome o;
  std::string kind;
  in >> kind >> o.exitCode;
  o.kind = kind == "restart" ? Outcome::Kind::Restart : kind == "stop" ? Outcome::Kind::Stop : Outcome::Kind::Fail;
  auto nl = v.find('\n');
  o.summary = nl == std::string::npos ? "" : v.substr(nl + 1);
  return o;
}

Outcome Rendezvous::publishOutcome(int round, const Outcome& o) {
  const char* kind = o.kind == Outcome::Kind::Restart ? "restart" : o.kind == Outcome::Kind::Stop ? "stop" : "fail";
  std::string v = fmt::format("{} {}\n{}", kind, o.exitCode, o.summary);
  store_->compareSet(key(round, "outcome"), {}, bytes(v));
  return *outcome(round);
}

void Rendezvous::markDone(int round) { store_->add(key(round, "done"), 1); }

int Rendezvous::numDone(int round) { return static_cast<int>(store_->add(key(round, "done"), 0)); }

void Rendezvous::leave(int round, int numNodes) {
  try {
    int64_t left = store_->add(key(round, "left"), 1);
    if (!server_) return;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (left < numNodes && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = store_->add(key(round, "left"), 0);
    }
  } catch (const Error& err) {
    COHORT_LOG(Debug, "cohortrun: leaving the rendezvous: {}", err.what());
  }
}

}  // namespace cohort::launcher
