/*
 * A fixed pool of threads running queued tasks, for the RPC agent's user functions and the
 * completion of callers' futures (docs/thread_model.md). Tasks must not throw (the agent wraps
 * them). stop() lets queued tasks finish and joins; tasks queued after stop() are dropped.
 */
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cohort::rpc {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
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
    for (auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id()) t.detach();  // stopped from one of its own tasks
      else if (t.joinable()) t.join();
    }
    threads_.clear();
  }
  bool onPoolThread() const {
    for (const auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id()) return true;
    }
    return false;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !tasks_.empty(); });
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
  std::vector<std::thread> threads_;
};

}  // namespace cohort::rpc
