/*
 * OpQueue: one worker thread that runs a process group's ops in the order they were issued — the
 * execution model of the gloo backend, the hierarchical backend and the shm backend's worker mode.
 * A backend posts (work, task) pairs; the task runs the op and completes its Work.
 *
 * Stopping (stop() or the destructor) lets the op that is running finish, fails every op still
 * queued with "the process group was destroyed before the op ran" (a DistError on its Work), and
 * joins the thread; post() after that fails the Work at once. SIGPIPE is blocked on the worker, so
 * a write to a peer's closed socket is an EPIPE the op reports, not a signal that kills the
 * process (see gloo_backend.cc).
 */
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <cohort/distributed/work.h>

namespace cohort::dist {

class OpQueue {
 public:
  OpQueue();
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Runs `task` on the worker after every op posted before it; once stopped, fails `work`
  // instead. Tasks must not throw (they complete their Work with the error).
  void post(WorkPtr work, std::function<void()> task);
  void stop();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<WorkPtr, std::function<void()>>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace cohort::dist
