// EnvGuard: sets and unsets environment variables for one test and puts every touched variable
// back afterwards. It starts by clearing every launcher variable, so tests behave the same when
// ctest itself runs under mpirun, srun or torchrun.
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kLaunchVars) unset(name);
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

  EnvGuard& set(const std::string& name, const std::string& value) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
    return *this;
  }
  EnvGuard& unset(const std::string& name) {
    save(name);
    ::unsetenv(name.c_str());
    return *this;
  }

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* v = std::getenv(name.c_str());
    saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
  }

  static constexpr const char* kLaunchVars[] = {"RANK",
                                                "WORLD_SIZE",
                                                "LOCAL_RANK",
                                                "LOCAL_WORLD_SIZE",
                                                "MASTER_ADDR",
                                                "MASTER_PORT",
                                                "OMPI_COMM_WORLD_RANK",
                                                "OMPI_COMM_WORLD_SIZE",
                                                "OMPI_COMM_WORLD_LOCAL_RANK",
                                                "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                "OMPI_MCA_ess_base_jobid",
                                                "SLURM_PROCID",
                                                "SLURM_NTASKS",
                                                "SLURM_NPROCS",
                                                "SLURM_LOCALID",
                                                "SLURM_NTASKS_PER_NODE",
                                                "SLURM_STEP_TASKS_PER_NODE",
                                                "SLURM_TASKS_PER_NODE",
                                                "SLURM_NODEID",
                                                "SLURM_STEP_NODELIST",
                                                "SLURM_JOB_NODELIST",
                                                "SLURM_NODELIST",
                                                "SLURM_JOB_ID",
                                                "COHORT_STORE_HOSTED_BY_LAUNCHER",
                                                "COHORT_BACKEND"};
  std::map<std::string, std::optional<std::string>> saved_;
};
