/*
 * OpQueue: the worker thread(s) that run a process group's ops in the order they were issued — the
 * execution model of the gloo backend, the hierarchical backend and the shm backend's worker mode.
 * A backend posts (work, task) pairs; the task runs the op and completes its Work.
 *
 * Ops start in issue order. With one thread (the default) each runs alone. With more, an op
 * posted as shareable (an allreduce: OpFootprint::exclusive = false, with the storages it
 * touches) may start while earlier ops still run, as long as fewer than `threads` run and none of
 * them touches its storages; every other op waits until nothing runs, and holds back the ops
 * behind it until it is done. So DDP's buckets (separate storages) are reduced side by side, an
 * op on a tensor never overtakes or overlaps an earlier op on the same memory, and a barrier or a
 * broadcast still comes after everything issued before it. (The backend must keep concurrent ops
 * apart on the wire: gloo's ops carry their sequence number as tag.)
 *
 * Stopping (stop() or the destructor) lets the ops that are running finish, fails every op still
 * queued with "the process group was destroyed before the op ran" (a DistError on its Work), and
 * joins the threads; post() after that fails the Work at once. SIGPIPE is blocked on the workers,
 * so a write to a peer's closed socket is an EPIPE the op reports, not a signal that kills the
 * process (see gloo_backend.cc).
 */
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/distributed/work.h>

namespace cohort::dist {

// What an op touches, for running ops side by side (see above).
struct OpFootprint {
  bool exclusive = true;                // runs alone
  std::vector<const void*> storages;    // shareable ops: the storages it reads or writes
};

class OpQueue {
 public:
  explicit OpQueue(int threads = 1);
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Runs `task` on a worker once the ops posted before it allow (see above); once stopped, fails
  // `work` instead. Tasks must not throw (they complete their Work with the error).
  void post(WorkPtr work, std::function<void()> task, OpFootprint footprint = {});
  void stop();
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  struct Item {
    WorkPtr work;
    std::function<void()> task;
    OpFootprint footprint;
  };
  void loop();
  bool headCanStart() const;  // with mu_ held

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  int running_ = 0;
  bool exclusiveRunning_ = false;
  std::vector<const void*> inFlight_;  // storages of the shareable ops that run
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace cohort::dist
