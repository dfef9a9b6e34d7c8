/*
 * The worker processes of one node for one round, and their output.
 *
 * Spawning. Each worker is forked into its own process group (so stopping it reaches the
 * processes it started too) with PR_SET_PDEATHSIG=SIGKILL (so it dies with the launcher even when
 * the launcher is killed with SIGKILL), stdin from /dev/null, stdout and stderr on pipes, every
 * other descriptor closed, and the environment it was given. Between fork and exec the child
 * calls only async-signal-safe functions: argv and envp are built before the fork.
 *
 * Output. The launcher reads every pipe. Each complete line goes, as the options say, to the
 * console with a "[<rank>]: " prefix (unless --redirects sends that stream to the file only, or
 * --local-ranks-filter hides that local rank), to <log dir>/<run id>/attempt_<n>/rank_<r>.stdout
 * and .stderr, and to a small ring of the last lines kept for the failure summary.
 *
 * Stopping: SIGTERM to every worker's process group, up to `grace` seconds for them to exit, then
 * SIGKILL; every worker is reaped before stop() returns.
 *
 * Thread model: one thread (the agent's) owns a WorkerGroup.
 */
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cohort/launcher/options.h>

namespace cohort::launcher {

struct WorkerSpec {
  int globalRank = 0;
  int localRank = 0;
  std::vector<std::string> env{};  // "NAME=value", the whole environment
  std::vector<int> cpus{};         // bound to these CPUs before the program starts; empty: not bound
};

struct LogConfig {
  std::string attemptDir{};  // empty: no log files
  StreamSpec redirects{};
  StreamSpec tee{};
  std::optional<std::vector<int>> localRanksFilter{};
  size_t lastLines = 10;
};

struct WorkerExit {
  int globalRank = 0;
  int localRank = 0;
  pid_t pid = 0;
  bool signaled = false;
  int value = 0;  // exit code, or the signal number when signaled
  bool ok() const { return !signaled && value == 0; }
  int shellCode() const { return signaled ? 128 + value : value; }  // as a shell reports it
  std::string describe() const;  // "exited with code 3", "was killed by signal 9 (SIGKILL)"
};

class WorkerGroup {
 public:
  WorkerGroup(std::string programPath, std::vector<std::string> args, LogConfig logs);
  ~WorkerGroup();  // stops (SIGKILL) and reaps anything still running
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Throws Error when a pipe, log file or fork fails (workers already started are killed).
  void start(const std::vector<WorkerSpec>& specs);

  // Forwards output and reaps for at most `timeout`, returning early when `wakeFd` (>= 0) becomes
  // readable or a worker exits. Returns the workers that exited during the call.
  std::vector<WorkerExit> poll(std::chrono::milliseconds timeout, int wakeFd);

  size_t numRunning() const;
  size_t size() const { return workers_.size(); }
  void signalAll(int sig);
  // SIGTERM, then SIGKILL after `graceSeconds`; reaps everything and drains the pipes.
  std::vector<WorkerExit> stop(double graceSeconds);

  std::vector<std::string> lastLines(int globalRank) const;
  std::vector<pid_t> pids() const;

 private:
  struct Stream;
  struct Worker;
  void pump(Worker& w, Stream& s);
  std::optional<WorkerExit> reap(Worker& w, bool block);
  void closeStreams(Worker& w);

  std::string programPath_;
  std::vector<std::string> args_;
  LogConfig logs_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// The executable a program name refers to: as given when it contains '/', else searched on
// PATH. Throws ValueError naming the program when there is no such executable.
std::string resolveProgram(const std::string& program);

// "SIGKILL" for 9, "signal 64" when unknown.
std::string signalName(int sig);

}  // namespace cohort::launcher
