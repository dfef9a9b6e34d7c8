/*
 * The launchers of one job meet here: a TCPStore at the rendezvous endpoint, hosted by one of
 * them (node rank 0, or without node ranks the one that can bind the address), which every
 * launcher, its own host included, talks to as a client.
 *
 * Rounds. The job runs in rounds: round 0 at start, round k after the k-th restart. In a round
 * every launcher arrives (an atomic counter gives it an arrival index), the round closes when
 * MAX nodes arrived (or, with --nnodes MIN:MAX, when at least MIN arrived and no one else came
 * for --rdzv-last-call seconds), and each launcher learns its group rank, the world size and its
 * first global rank. The host also starts a fresh TCPStoreServer per round for the workers
 * (MASTER_ADDR:MASTER_PORT, COHORT_STORE_HOSTED_BY_LAUNCHER=1), so a restarted job never meets
 * the keys of the failed one. A launcher whose workers fail writes the round's outcome (restart,
 * fail or stop, with the exit code and a summary naming node, rank and last log lines); the
 * first writer wins, and every launcher reads it while it supervises.
 *
 * Every call has a deadline: joining waits at most --rdzv-timeout, and a timeout names the
 * endpoint, how long it tried and how many nodes arrived. Keys live under
 * "cohortrun/<run id>/<round>/".
 *
 * Thread model: one thread (the agent's) uses a Rendezvous.
 */
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cohort/distributed/store/tcp_store.h>
#include <cohort/launcher/options.h>

namespace cohort::launcher {

struct NodeEntry {
  int groupRank = 0;
  int requestedRank = -1;  // --node-rank, or -1
  int nproc = 1;
  std::string host;  // the node's host name
};

struct RoundInfo {
  int round = 0;
  int groupRank = 0;
  int numNodes = 1;
  int worldSize = 1;
  int rankOffset = 0;  // this node's first global rank
  std::string masterAddr;
  uint16_t masterPort = 0;
  std::vector<NodeEntry> nodes;  // by group rank
};

struct Outcome {
  enum class Kind { Restart, Fail, Stop };
  Kind kind = Kind::Fail;
  int exitCode = 1;
  std::string summary;
};

class Rendezvous {
 public:
  // Hosts or connects. Throws TimeoutError when the endpoint cannot be reached within the
  // rendezvous timeout (naming it, the time tried and that no node is known to have arrived),
  // StoreError when it cannot be hosted.
  Rendezvous(const LaunchOptions& options, Endpoint endpoint);
  ~Rendezvous();

  RoundInfo join(int round);

  std::optional<Outcome> outcome(int round);
  // Records the round's outcome unless another launcher already did; returns the one that holds.
  Outcome publishOutcome(int round, const Outcome& o);
  void markDone(int round);  // every worker of this node exited 0
  int numDone(int round);
  // Says this launcher is leaving; the host waits (bounded) for every node to say so before its
  // store goes away, so the others can still read the outcome.
  void leave(int round, int numNodes);

  bool isHost() const { return server_ != nullptr; }
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  std::string key(int round, const std::string& name) const;

  LaunchOptions options_;
  Endpoint endpoint_;
  std::unique_ptr<dist::TCPStoreServer> server_;
  std::unique_ptr<dist::TCPStoreServer> workerServer_;
  std::unique_ptr<dist::TCPStore> store_;
};

// This machine's host name.
std::string localHostName();

}  // namespace cohort::launcher
