/*
 * The launcher's node supervisor (what torchelastic calls an agent): rendezvous, start this
 * node's workers, supervise them, restart the job, report. superviseNode() is all of cohortrun
 * after argument parsing.
 *
 *   round = 0
 *   loop:  join the rendezvous round -> ranks [offset, offset + nproc) of world size W
 *          start the workers (environment below)
 *          supervise every --monitor-interval: reap workers, forward their output, read the
 *          round's outcome in the store
 *            a worker of this node failed -> outcome: restart while round < --max-restarts, else fail
 *            outcome restart  -> stop the workers (SIGTERM, --stop-timeout, SIGKILL), round += 1
 *            outcome fail     -> stop them, print the summary, exit with the failed worker's code
 *            every node's workers exited 0 -> exit 0
 *            SIGINT/SIGTERM/SIGHUP -> forwarded to every worker, then stopped; outcome stop for
 *                                     the other nodes; exit 128 + signal
 *
 * --max-restarts counts restarts of the job, not per node: every node restarts together, and the
 * round number is the restart count (COHORT_RESTART_COUNT), so no node can exceed it.
 *
 * Environment of each worker: the launcher's, plus RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT (the round's store, hosted by the launcher: COHORT_STORE_HOSTED_BY_LAUNCHER=1),
 * COHORT_RUN_ID, COHORT_RESTART_COUNT, COHORT_MAX_RESTARTS, and OMP_NUM_THREADS=1 when the user
 * did not set it (one thread per worker; a notice says so).
 *
 * Thread model: the main thread; installs handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD.
 */
#pragma once

#include <cohort/launcher/options.h>

namespace cohort::launcher {

// Runs the job on this node and returns cohortrun's exit code.
int superviseNode(const LaunchOptions& options);

}  // namespace cohort::launcher
