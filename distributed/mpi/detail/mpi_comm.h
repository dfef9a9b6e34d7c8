/*
 * MpiComm: owns one MPI communicator (MPI_Comm_free on destruction) together with a reference
 * to the MpiEnvironment, so MPI is never finalised while a communicator lives.
 *
 * A group's communicator is a duplicate of MPI_COMM_WORLD when the group is the whole world (so
 * cohort's traffic never matches the program's own MPI_COMM_WORLD messages), else
 * MPI_Comm_create_group over the group's world ranks, which is collective over the members only:
 * ProcessGroup::newGroup creates a subgroup's backend on its members alone. Errors on the
 * communicator return codes (MPI_ERRORS_RETURN) instead of aborting the job.
 * Created and destroyed on the thread that creates the backend; used by the backend's threads.
 */
#pragma once

#include <cohort/distributed/mpi/detail/mpi_api.h>

#include <memory>
#include <string>
#include <vector>

#include <cohort/distributed/mpi/detail/mpi_environment.h>

namespace cohort::dist::mpi_backend {

class MpiComm {
 public:
  // Collective over the world ranks in `globalRanks` (in group rank order). Throws DistError
  // naming `groupName` when MPI refuses.
  static std::unique_ptr<MpiComm> create(std::shared_ptr<MpiEnvironment> env, const std::vector<int>& globalRanks,
                                         const std::string& groupName);
  ~MpiComm();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MpiEnvironment& env() const { return *env_; }
  // Leaks the communicator instead of freeing it (a thread is still blocked on it).
  void release() { comm_ = MPI_COMM_NULL; }

 private:
  MpiComm(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm);

  std::shared_ptr<MpiEnvironment> env_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace cohort::dist::mpi_backend
