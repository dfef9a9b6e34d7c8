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
 * A task, and the Work it holds, should not keep the last reference to the queue's owner (Works'
 * abort functions hold their backend weakly for this reason). If one does, the owner and this
 * queue are destroyed on that worker when the task's captures go: stop() then joins the other
 * workers and detaches this one, which finds the queue's state (shared with every worker) stopped
 * and ends, instead of joining itself.
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
  bool exclusive = true;              // runs alone
  std::vector<const void*> storages;  // shareable ops: the storages it reads or writes
};

class OpQueue {
 public:
  // `key` is the owning backend's (Backend::completionKey()): the queue fails the Works it drops.
  explicit OpQueue(Work::CompletionKey key, int threads = 1);
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
  // Everything the workers touch: it outlives the queue while a worker still runs.
  struct State {
    explicit State(Work::CompletionKey k) : key(k) {}
    Work::CompletionKey key;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    int threads = 1;
    int running = 0;
    bool exclusiveRunning = false;
    std::vector<const void*> inFlight;  // storages of the shareable ops that run
    bool stop = false;
    bool headCanStart() const;  // with mu held
  };
  static void loop(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::vector<std::thread> workers_;
};

}  // namespace cohort::dist
