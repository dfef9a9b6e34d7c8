/*
 * Job profiling: every rank of a job profiled over the same window of steps, and the ranks'
 * traces merged into one, with no change to the training program.
 *
 *   cohortrun --nproc-per-node 2 --profile DIR build/examples/train_digits --ddp
 *   COHORT_PROFILE=DIR mpirun -np 2 build/examples/train_digits --ddp      (or under srun)
 *
 * With COHORT_PROFILE set, initProcessGroup() calls startJobProfiling(): the ranks measure their
 * clock offset to rank 0's through the group's store (rank 0 publishes its clock the moment every
 * rank has arrived; each rank reads it on waking, less half a store round trip), then each rank
 * runs a profiler::Profile from the end of step COHORT_PROFILE_STEPS's first number (default 1:
 * one warm-up step) for the second number of steps (default 3; steps end in Optimizer::step()).
 * When the window closes, each rank writes DIR/rank<R>.json (its trace on rank 0's clock) and,
 * with memory on, DIR/memory_rank<R>.html, and hands its trace to rank 0 through the store;
 * rank 0 merges them (profiler::mergeTraces) into DIR/trace.json — one process per rank,
 * collectives matched across ranks — and logs the sizes. A rank missing after the store timeout
 * is named and the others are merged without it.
 *
 * A job that ends before the window closes: destroyProcessGroup() (or the process's exit) writes
 * what each rank recorded to DIR/rank<R>.json, and cohortrun --profile merges those files after
 * the workers exit (mergeRankTraceFiles).
 *
 * Threads: the window opens and closes on the thread that calls Optimizer::step().
 */
#pragma once

#include <cstdint>
#include <string>

#include <cohort/distributed/process_group.h>

namespace cohort::dist {

struct JobProfileOptions {
  std::string dir;        // where the traces go (created)
  int64_t skipSteps = 1;  // steps before the window opens
  int64_t steps = 3;      // steps in the window
  bool memory = true;     // record allocations (the memory timeline)
  bool shapes = true;     // record input shapes
};

// From COHORT_PROFILE, COHORT_PROFILE_STEPS ("skip:count"), COHORT_PROFILE_MEMORY ("0"/"1");
// nullopt when COHORT_PROFILE is unset. ValueError naming the variable when malformed.
std::optional<JobProfileOptions> jobProfileOptionsFromEnv();

// Collective over `pg` (every rank calls it): aligns clocks and arms the step window.
void startJobProfiling(const ProcessGroupPtr& pg, const JobProfileOptions& opts);
// Writes what the window recorded so far (if it is still open) to DIR/rank<R>.json; idempotent.
void finishJobProfiling();
// This rank's clock offset to rank 0's, in ns, as startJobProfiling measured it (0 before).
int64_t jobClockOffsetNs();

// Merges every DIR/rank<R>.json into DIR/trace.json; returns the number of ranks merged (0 when
// there are none). Used by cohortrun --profile when a job ended before its window closed.
int mergeRankTraceFiles(const std::string& dir);

}  // namespace cohort::dist
