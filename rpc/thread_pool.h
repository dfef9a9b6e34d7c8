/*
 * A pool of threads running queued tasks, for the RPC agent's user functions and the completion
 * of callers' futures (docs/thread_model.md). It starts with `threads` and grows, up to
 * `maxThreads`, whenever a task is queued while every thread is busy: user functions may block on
 * nested calls whose responses need a pool thread to complete, and a fixed pool full of such
 * waiters would deadlock. Tasks must not throw (the agent wraps them). stop() lets queued tasks
 * finish and joins; tasks queued after stop() are dropped.
 */
#pragma once

#include <condition_variable>
#include <algorithm>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cohort::rpc {

class ThreadPool {
 public:
  ThreadPool(int threads, int maxThreads) : max_(std::max(threads, maxThreads)) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Returns false (and drops the task) once stopped.
  bool run(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return false;
      tasks_.push_back(std::move(task));
      if (idle_ < tasks_.size() && static_cast<int>(threads_.size()) < max_) {
        threads_.emplace_back([this] { loop(); });
      }
    }
    cv_.notify_one();
    return true;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ && threads_.empty()) return;
      stopped_ = true;
    }
    cv_.notify_all();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) {
      if (t.get_id() == std::this_thread::get_id()) t.detach();  // stopped from one of its own tasks
      else if (t.joinable()) t.join();
    }
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_.size();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return stopped_ || !tasks_.empty(); });
        --idle_;
        if (tasks_.empty()) return;  // stopped and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopped_ = false;
  size_t idle_ = 0;
  const int max_;
  std::vector<std::thread> threads_;
};

}  // namespace cohort::rpc
