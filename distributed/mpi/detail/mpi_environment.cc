#include <cohort/distributed/mpi/detail/mpi_environment.h>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>

namespace cohort::dist::mpi_backend {

namespace {
std::mutex& holderMutex() {
  static std::mutex mu;
  return mu;
}
// The static reference that keeps MPI initialised until exit; destroyed with the other statics.
std::shared_ptr<MpiEnvironment>& holder() {
  static std::shared_ptr<MpiEnvironment> env;
  return env;
}
}  // namespace

const char* MpiEnvironment::threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "unknown";
  }
}

std::string MpiEnvironment::errorString(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  int cls = 0;
  MPI_Error_class(code, &cls);
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return fmt::format("{} (MPI error class {})", std::string(text, len), cls);
}

std::shared_ptr<MpiEnvironment> MpiEnvironment::get() {
  std::lock_guard<std::mutex> lock(holderMutex());
  auto& env = holder();
  if (!env) {
    std::shared_ptr<MpiEnvironment> fresh(new MpiEnvironment());
    fresh->init();
    env = std::move(fresh);
  }
  return env;
}

void MpiEnvironment::init() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw DistError("backend mpi: MPI was already finalised in this process and cannot be initialised again");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&level_);
  } else {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level_);
    if (rc != MPI_SUCCESS) {
      throw DistError(fmt::format("backend mpi: MPI_Init_thread failed: {}", errorString(rc)));
    }
    ownsInit_ = true;
  }
  if (level_ < MPI_THREAD_SERIALIZED) {
    throw DistError(
        fmt::format("backend mpi: MPI provides only {} but cohort calls MPI from its own threads and needs at least "
                    "MPI_THREAD_SERIALIZED{}",
                    threadLevelName(level_),
                    ownsInit_ ? "" : " (the program called MPI_Init itself: use MPI_Init_thread)"));
  }
  // Errors come back as codes, turned into DistErrors, instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank_);
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize_);
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  if (found && ub) tagUb_ = *ub;
  COHORT_LOG(Debug, "backend mpi: MPI initialised with {}; MPI_COMM_WORLD rank {} of {}", threadLevelName(level_),
             worldRank_, worldSize_);
}

std::unique_lock<std::mutex> MpiEnvironment::lock() {
  if (multiThreaded()) return std::unique_lock<std::mutex>();
  return std::unique_lock<std::mutex>(serialMu_);
}

MpiEnvironment::~MpiEnvironment() {
  if (!ownsInit_) return;
  if (stuck()) {
    COHORT_LOG(Warning,
               "backend mpi: not calling MPI_Finalize because a collective that timed out is still blocked inside "
               "MPI; mpirun will end the job");
    return;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace cohort::dist::mpi_backend
