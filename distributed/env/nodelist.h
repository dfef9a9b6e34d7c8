/*
 * Slurm's compressed host lists and task counts, expanded.
 *
 * Host lists (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST, scontrol show hostnames):
 *   "node[01-04,07],gpu-[1-2]a,login1"  ->  node01 node02 node03 node04 node07 gpu-1a gpu-2a login1
 *   "rack[1-2]-node[01-02]"            ->  rack1-node01 rack1-node02 rack2-node01 rack2-node02
 * Commas split hosts only outside brackets; a name may hold several bracket groups (expanded
 * left to right, the last varying fastest, as Slurm does); a range keeps the zero padding of its
 * lower bound ("08-10" -> 08 09 10). Anything else (an unclosed or nested bracket, an empty item
 * or range, a range running backwards, a non-digit bound, more than kMaxNodeListHosts hosts) is
 * a ValueError that quotes the whole input and says where it went wrong.
 *
 * Task counts (SLURM_TASKS_PER_NODE): "2(x3),1" -> 2 2 2 1, one count per node of the step, in
 * node order.
 *
 * Pure functions of their input; any thread.
 */
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::dist::env {

inline constexpr size_t kMaxNodeListHosts = size_t{1} << 20;

std::vector<std::string> expandNodeList(std::string_view list);
// The first host of the list, without expanding the rest (still validates the whole list).
std::string firstNodeListHost(std::string_view list);

std::vector<int> expandTasksPerNode(std::string_view counts);

}  // namespace cohort::dist::env
