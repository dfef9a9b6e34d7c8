/*
 * Where this process sits in the job, read from the launcher's environment variables.
 *
 * Sources, tried in this order (the first whose marker variable is set wins, so torchrun inside a
 * Slurm allocation is torchrun, and mpirun inside an sbatch script is OpenMPI):
 *  1. torchrun / cohortrun / by hand (marker: RANK or WORLD_SIZE):
 *     RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT required; LOCAL_RANK and LOCAL_WORLD_SIZE
 *     optional (missing: assumed one host, local = global).
 *  2. OpenMPI's mpirun (marker: OMPI_COMM_WORLD_RANK or OMPI_COMM_WORLD_SIZE):
 *     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
 *     Master address: MASTER_ADDR when set; else, when every rank is on this host (LOCAL_SIZE ==
 *     SIZE), 127.0.0.1; else, inside a Slurm allocation, the first host of its node list (mpirun
 *     maps rank 0 to the first allocated node by default); else an error asking for MASTER_ADDR
 *     (`mpirun -x MASTER_ADDR=<rank 0's host>`). mpirun's own URI (OMPI_MCA_orte_hnp_uri) names
 *     the host mpirun runs on, which need not hold rank 0, so it is not used.
 *     Master port: MASTER_PORT when set; else 20000 + (OMPI_MCA_ess_base_jobid mod 10000), so
 *     concurrent mpirun jobs on one host do not collide; else 29500.
 *  3. Slurm's srun (marker: SLURM_PROCID):
 *     SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID; local world size from this
 *     node's entry (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE ("2(x3),1"),
 *     which srun sets for the step, else SLURM_NTASKS_PER_NODE (the job's --ntasks-per-node,
 *     which a smaller step such as `srun -n 1` inside the allocation inherits unchanged, so it
 *     is only the fallback). Master address: MASTER_ADDR when set, else the first host of
 *     SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST (the first that is set): srun
 *     places task 0 on the first node of the step. Master port: MASTER_PORT when set, else
 *     20000 + (SLURM_JOB_ID mod 10000), else 29500.
 *     Note: an sbatch script itself has SLURM_PROCID=0; call initProcessGroup from the tasks srun
 *     starts, not from the batch script.
 * Every variable is read through the env-knob registry (core/util/env.h), so `cohortrun
 * --help-env` lists them. Anything missing or malformed is a ValueError that says which source
 * was chosen, what was found, and what every source looks for.
 *
 * Reads the process environment; any thread (getenv is not safe against a concurrent setenv).
 */
#pragma once

#include <cstdint>
#include <string>

namespace cohort::dist::env {

enum class LaunchSource { Torchrun, OpenMPI, Slurm };
const char* launchSourceName(LaunchSource s);  // "torchrun", "OpenMPI", "Slurm"

struct LaunchEnvironment {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  std::string masterAddr;
  uint16_t masterPort = 0;
  LaunchSource source = LaunchSource::Torchrun;
  // How masterAddr and masterPort were chosen ("MASTER_ADDR", "first host of SLURM_JOB_NODELIST
  // \"node[01-04]\"", "derived from SLURM_JOB_ID=1234"...), for logs and error messages.
  std::string masterAddrOrigin;
  std::string masterPortOrigin;

  // "rank 3 of 8 (local 1 of 4) via Slurm, master node01:21234 (first host of ...)"
  std::string describe() const;
};

// Throws ValueError (see above) when no source is found or a variable is missing or malformed.
LaunchEnvironment detectEnvironment();

// True when any source's marker variable is set (detectEnvironment() may still fail).
bool launchEnvironmentPresent();

}  // namespace cohort::dist::env
