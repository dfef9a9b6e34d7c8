/*
 * MpiEnvironment: the process's one owner of MPI_Init_thread and MPI_Finalize.
 *
 * MPI may be initialised once per process and never again after MPI_Finalize, so the environment
 * is created on the first MPI backend and kept until the process exits: a static holder keeps
 * one reference and every backend and communicator keeps another, and MPI_Finalize runs when the
 * last one goes (at exit, after every backend). No MPI call happens after that: get() then throws.
 *
 * Thread level. cohort asks for MPI_THREAD_MULTIPLE (OpenMPI 4.1 as Debian builds it gives it),
 * so groups proceed concurrently, each on the threads that run its collectives (the issuing
 * thread in caller mode, the group's worker in worker mode; mpi_backend.h). When MPI gives only
 * MPI_THREAD_SERIALIZED, every MPI call takes the global lock returned by lock(), as c10d's
 * ProcessGroupMPI does: groups then take turns, one MPI call at a time. Less than
 * MPI_THREAD_SERIALIZED is refused with a DistError.
 *
 * If the program initialised MPI itself, cohort uses that MPI and leaves MPI_Finalize to it.
 * If a thread was left blocked inside MPI (an op past its timeout: MPI has no way to cancel a
 * blocking collective), MPI_Finalize would hang, so it is skipped with a logged warning; mpirun
 * then sees a process exit without finalising and ends the whole job, which is MPI's failure
 * model.
 * Thread-safe.
 */
#pragma once

#include <cohort/distributed/mpi/detail/mpi_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace cohort::dist::mpi_backend {

class MpiEnvironment {
 public:
  // Initialises MPI on first use. Throws DistError when MPI was finalised already or gives less
  // than MPI_THREAD_SERIALIZED.
  static std::shared_ptr<MpiEnvironment> get();
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int threadLevel() const { return level_; }
  bool multiThreaded() const { return level_ >= MPI_THREAD_MULTIPLE; }
  int worldRank() const { return worldRank_; }
  int worldSize() const { return worldSize_; }
  int tagUpperBound() const { return tagUb_; }

  // Held around every MPI call: the process-wide lock under MPI_THREAD_SERIALIZED, an empty
  // (unlocked) lock under MPI_THREAD_MULTIPLE.
  std::unique_lock<std::mutex> lock();
  // A thread stays blocked inside MPI for good (an op past its timeout): skip MPI_Finalize.
  // Counted: a thread that comes back after all unmarks.
  void markStuck() { stuck_.fetch_add(1); }
  void unmarkStuck() { stuck_.fetch_sub(1); }
  bool stuck() const { return stuck_.load() > 0; }

  // "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
  static std::string errorString(int code);
  static const char* threadLevelName(int level);

 private:
  MpiEnvironment() = default;
  void init();

  bool ownsInit_ = false;
  int level_ = MPI_THREAD_SINGLE;
  int worldRank_ = 0;
  int worldSize_ = 1;
  int tagUb_ = 32767;
  std::mutex serialMu_;
  std::atomic<int> stuck_{0};
};

}  // namespace cohort::dist::mpi_backend
