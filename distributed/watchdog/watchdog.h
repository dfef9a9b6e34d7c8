/*
 * Watchdog: watches every op a communicator backend (comm_backend.h) queued on its communicators
 * (communicator.h) until it completes, and handles the ways it may not — the role of c10d's
 * ProcessGroupNCCL watchdog, written once over the device-neutral interface so the CPU fake
 * communicator exercises exactly the code NCCL runs.
 *
 * One watchdog per backend (per process group), one thread, started with the first op. Each
 * round (every 50 us to 2 ms while ops are in flight, backing off while none completes; every
 * 250 ms when idle) it:
 *  - completes the Works of the ops whose completion reports done (Work::finish with the op's
 *    outputs) and lets go of the tensors it held for them (so their memory outlives the op even
 *    when the caller dropped them), in whatever order they finish;
 *  - publishes this rank's progress on the communicator — the last op that started and the last
 *    that completed, by sequence number — under "progress/<rank>" in the backend's store (a
 *    ProgressPublisher: the op's thread never touches the store);
 *  - polls each communicator's asyncError();
 *  - fails the oldest op past its deadline (its Work's: issue time + timeout);
 *  - every 250 ms, looks for the group's abort signal ("abort" in the backend's store), which the
 *    first rank that fails writes so that every rank stops, not only the one that noticed.
 *
 * On a timeout, an asynchronous error, an abort request (Backend::abort: Work::wait giving up, a
 * user) or another rank's abort signal, in this order:
 *  1. every flight recorder of the process is dumped (dumpFlightRecorders), BEFORE anything is
 *     aborted, so the dump shows the ops as they were (the failed one still "scheduled");
 *  2. for a timeout, the ranks are diagnosed through the store, as c10d's desync debugging does:
 *     from each rank's published host progress (ProcessGroup: the last collective it issued) and
 *     communicator progress (above: the last one that started and completed on it), the ranks
 *     that never arrived at the op — never issued it, or issued it but are stuck before it — and,
 *     when all arrived, those that started it but never finished. E.g.
 *       "allreduce #5 in group 'world' timed out after 500 ms: its communicator did not complete
 *        it (watchdog); ranks that never arrived at it: [2] (rank 2: issued up to #5, its
 *        communicator started up to #4)"
 *     The diagnosis reads the store for at most 500 ms (it waits for peers' late publishes);
 *  3. the abort signal is written (first writer wins, so every rank quotes the root cause);
 *  4. with killOnFailure (COHORT_WATCHDOG_KILL=1) the communicators are aborted, the error is
 *     logged and the process ends with SIGABRT — what a job wants when one rank's failure should
 *     bring the launcher to restart everything. Off by default: the error goes to the Works;
 *  5. every communicator is aborted;
 *  6. every pending Work fails: the culprit with TimeoutError (timeout) or DistError (an
 *     asynchronous error, an abort), the others with the same type naming themselves and the root
 *     cause; every later op of the backend fails at once the same way (errorFor()).
 * Work::wait() then throws on every rank: the culprit's error on the rank that noticed, the
 * propagated one ("rank 1 of group 'world' aborted its communicator: ...") on the others.
 *
 * Threads: track() and the queries may come from any thread. Works complete on the watchdog's
 * thread (their observers and Future callbacks run there; a callback may issue new ops).
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/store/store.h>
#include <cohort/distributed/watchdog/communicator.h>
#include <cohort/distributed/work.h>

namespace cohort::dist {

class ProgressPublisher;

// COHORT_WATCHDOG_KILL: 1 ends the process (SIGABRT) once the watchdog has dumped the flight
// recorders and aborted the communicators; 0 (default) reports the error at wait().
bool watchdogKillFromEnv();

struct WatchdogOptions {
  std::string group = "world";
  int rank = 0;
  int size = 1;
  std::vector<int> globalRanks{};  // for naming ranks in subgroups ("1 (global rank 3)")
  // The backend's store: this rank's communicator progress and the group's abort signal. Null:
  // no diagnosis and no signal (a single process's tests).
  StorePtr store{};
  // The group's store, where ProcessGroup publishes what each rank issued; null: not read.
  StorePtr groupStore{};
  bool killOnFailure = false;
  Millis signalPoll{250};  // how often the abort signal is looked for
};

class Watchdog {
 public:
  // `key` is the owning backend's (Backend::completionKey()).
  Watchdog(Work::CompletionKey key, WatchdogOptions opts);
  ~Watchdog();  // stop(Millis(0)) when not stopped yet
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  const WatchdogOptions& options() const { return opts_; }

  // Its async errors are polled from now on, and it is aborted when the watchdog fails.
  void addCommunicator(CommunicatorPtr comm);

  // Watches `work`'s op: finishes `work` with `outputs` once `done` reports done, holding
  // `keepAlive` (and `outputs`) until then. Once the watchdog has failed, fails `work` at once.
  void track(const WorkPtr& work, CommCompletionPtr done, std::vector<Tensor> keepAlive, std::vector<Tensor> outputs);

  // Null until the watchdog failed; then the error an op issued now fails with (naming it).
  std::exception_ptr errorFor(const Work& work) const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // Fails everything as a timeout would (dump, abort signal, abort, pending Works fail with a
  // DistError quoting `reason`). Returns once done; idempotent.
  void abortAll(const std::string& reason);

  // Waits up to `drain` for the tracked ops to complete, then stops the thread; ops still
  // pending then fail with "the process group was destroyed before the op completed" (their
  // communicators should be aborted afterwards, since they may still touch the memory).
  // Returns true when every op completed.
  bool stop(Millis drain);

  // Ops tracked and not completed yet.
  size_t pending() const;

 private:
  struct Item {
    WorkPtr work;
    CommCompletionPtr done;
    std::vector<Tensor> keepAlive;
    std::vector<Tensor> outputs;
    bool started = false;
  };
  enum class Kind { Timeout, AsyncError, Abort, Propagated };

  void ensureThread();  // mu_ held
  void loop();
  // Steps 1-6 above. `culprit` is the op that timed out (null for the others: the oldest op in
  // flight, if any, is named); `timeout` chooses TimeoutError over DistError.
  void fail(Kind kind, const WorkPtr& culprit, const std::string& why, bool timeout);
  std::string diagnose(uint64_t seq) const;
  void checkSignal();

  const Work::CompletionKey key_;
  const WatchdogOptions opts_;
  std::shared_ptr<ProgressPublisher> progress_;  // made with the thread (it has a thread of its own)

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;
  std::deque<Item> items_;
  std::vector<CommunicatorPtr> comms_;
  bool tracked_ = false;  // an item arrived since the thread last looked
  std::vector<std::string> abortRequests_;
  uint64_t abortsHandled_ = 0, abortsRequested_ = 0;
  std::condition_variable abortCv_;
  bool stop_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point drainUntil_{};
  std::thread thread_;
  std::thread::id threadId_{};

  std::mutex failMu_;  // one failure handled at a time
  std::atomic<bool> failed_{false};
  bool failTimeout_ = false;  // the root cause was a timeout: later errors are TimeoutErrors too
  std::string failMessage_;
};

}  // namespace cohort::dist
