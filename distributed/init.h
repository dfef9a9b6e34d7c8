/*
 * dist::initProcessGroup(): the one call a training program makes to join its job.
 *
 *   auto pg = dist::initProcessGroup();   // under cohortrun, torchrun-style variables, mpirun or srun
 *
 * Steps, each failing with an error that says what it was doing and for whom:
 *  1. Find this process's place in the job (env/environment.h: rank, world size, master
 *     address and port, from torchrun-style variables, OpenMPI or Slurm).
 *  2. Rank 0 hosts the TCPStoreServer, bound to MASTER_ADDR:MASTER_PORT (so it listens on the
 *     interface the others will dial, not on every interface) — unless the launcher already hosts
 *     it (COHORT_STORE_HOSTED_BY_LAUNCHER=1, as cohortrun does). Every rank connects a TCPStore
 *     client, retrying until the store timeout (rank 0 may start last).
 *  3. Rendezvous: each rank claims its rank number in the store (two processes claiming the same
 *     rank is an error naming it) and publishes its host and pid; everyone waits for all ranks,
 *     and a timeout names the ranks that never arrived. World sizes must agree.
 *  4. Creates the ProcessGroup with the chosen backend (options.backend, else COHORT_BACKEND,
 *     else "auto") and makes it the process's default group.
 * The store server lives as long as rank 0's group (its store). Logging lines get a "rank N"
 * prefix and flight-recorder dumps the rank in their name.
 *
 * Thread model: call from one thread; the default-group accessors are thread-safe.
 */
#pragma once

#include <optional>
#include <string>

#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/env/environment.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/store.h>

namespace cohort::dist {

struct InitOptions {
  std::string backend{};  // empty: COHORT_BACKEND (default "auto")
  std::string groupName = "world";
  Millis timeout = kDefaultGroupTimeout;       // every collective's default timeout
  Millis storeTimeout = kDefaultStoreTimeout;  // store calls, connecting and the rendezvous
  // Skips detection (ranks as threads in tests, programs that know their place).
  std::optional<env::LaunchEnvironment> environment{};
  // nullopt: rank 0 hosts the store unless COHORT_STORE_HOSTED_BY_LAUNCHER=1.
  std::optional<bool> hostStore{};
  // Make the new group the process's default group (an error when one is already set).
  bool setDefault = true;
};

ProcessGroupPtr initProcessGroup(const InitOptions& options = {});

// The default group; ValueError when initProcessGroup() has not run (or it was destroyed).
ProcessGroupPtr defaultProcessGroup();
bool isInitialized();
// Forgets the default group (it is destroyed, with rank 0's store server, when the last
// reference goes). initProcessGroup() may then run again.
void destroyProcessGroup();

}  // namespace cohort::dist
