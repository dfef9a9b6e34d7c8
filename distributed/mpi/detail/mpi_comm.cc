#include <cohort/distributed/mpi/detail/mpi_comm.h>

#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/error.h>

namespace cohort::dist::mpi_backend {

MpiComm::MpiComm(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm) : env_(std::move(env)), comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

std::unique_ptr<MpiComm> MpiComm::create(std::shared_ptr<MpiEnvironment> env, const std::vector<int>& globalRanks,
                                         const std::string& groupName) {
  bool whole = static_cast<int>(globalRanks.size()) == env->worldSize();
  for (size_t i = 0; whole && i < globalRanks.size(); ++i) whole = globalRanks[i] == static_cast<int>(i);
  auto lock = env->lock();
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_SUCCESS;
  if (whole) {
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  } else {
    MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    rc = MPI_Group_incl(world, static_cast<int>(globalRanks.size()), globalRanks.data(), &group);
    if (rc == MPI_SUCCESS) {
      // The tag only tells apart creations that overlap in time; members agree on the name.
      int tag = static_cast<int>(std::hash<std::string>{}(groupName)&0x7fff);
      rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
      MPI_Group_free(&group);
    }
    MPI_Group_free(&world);
  }
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL) {
    throw DistError(fmt::format("backend mpi: could not create the communicator of group '{}' (world ranks [{}]): {}",
                                groupName, fmt::join(globalRanks, ", "),
                                rc != MPI_SUCCESS ? MpiEnvironment::errorString(rc) : "MPI returned MPI_COMM_NULL"));
  }
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(env), comm));
}

MpiComm::~MpiComm() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  auto lock = env_->lock();
  MPI_Comm_free(&comm_);
}

}  // namespace cohort::dist::mpi_backend
