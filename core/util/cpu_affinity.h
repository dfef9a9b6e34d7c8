/*
 * Binding processes to CPUs: which CPUs a process may run on, how a node's CPUs are shared out
 * among its local ranks, and binding to them (Linux sched_setaffinity).
 *
 * Why: with one compute thread per rank, a rank that the scheduler moves between cores, or whose
 * helper threads (a transport's progress thread) are woken on another rank's core, loses time to
 * migrations and preemptions. mpirun binds its ranks to cores by default and Slurm's srun does with
 * --cpu-bind=cores; cohortrun does with --cpu-bind cores, through cpuSlice below.
 */
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace cohort::util {

// The CPUs the calling thread may run on (sched_getaffinity), ascending.
std::vector<int> allowedCpus();

// The CPUs local rank `localRank` of `localSize` gets when `cpus` are shared out: contiguous,
// disjoint slices of cpus' order, as equal as they can be (the first cpus.size() % localSize ranks
// get one more). With fewer CPUs than ranks, rank r gets cpus[r % cpus.size()] alone (ranks then
// share CPUs, each still kept on one). ValueError when localSize < 1, localRank is outside
// [0, localSize), or cpus is empty.
std::vector<int> cpuSlice(const std::vector<int>& cpus, int localRank, int localSize);

// `cpus` as the kernel's CPU set (for sched_setaffinity where only async-signal-safe calls may
// run, between fork and exec). ValueError when cpus is empty or holds a negative number or one
// past the kernel's set size.
cpu_set_t cpuSet(const std::vector<int>& cpus);

// Binds the calling thread to `cpus` (cpuSet's checks); threads it starts afterwards inherit the binding (call it
// before starting any, to bind the whole process). Error naming the CPUs and the kernel's reason
// when refused (a CPU outside this process's cpuset, or offline).
void bindToCpus(const std::vector<int>& cpus);

// "0-3,8,10-11": the list in the kernel's cpulist format (taskset -c, /sys, Slurm).
std::string cpuListString(const std::vector<int>& cpus);

}  // namespace cohort::util
