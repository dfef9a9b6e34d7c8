/*
 * A pool of threads running queued tasks, for the RPC agent's user functions and the completion
 * of callers' futures (docs/thread_model.md). It starts with `threads` and grows, up to
 * `maxThreads`, when it stalls: tasks are queued, every thread is busy and none finished a task
 * for 10 ms (a monitor thread checks). User functions may block on nested calls whose responses
 * need a pool thread to complete, and a fixed pool full of such waiters would deadlock; a pool
 * that merely has a backlog of short tasks does not grow. Tasks must not throw (the agent wraps them). stop() lets queued tasks
 * finish and joins; tasks queued after stop() are dropped.
 */
#pragma once

#include <condition_variable>
#include <algorithm>
#include <chrono>
#include <cstdint>
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
    monitor_ = std::thread([this] { monitor(); });
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
    monitorCv_.notify_all();
    if (monitor_.joinable()) {
      if (monitor_.get_id() == std::this_thread::get_id()) monitor_.detach();
      else monitor_.join();
    }
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
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
    }
  }
  void monitor() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t last = completed_;
    while (!stopped_) {
      monitorCv_.wait_for(lock, std::chrono::milliseconds(10));
      if (stopped_) break;
      if (!tasks_.empty() && idle_ == 0 && completed_ == last && static_cast<int>(threads_.size()) < max_) {
        threads_.emplace_back([this] { loop(); });
      }
      last = completed_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopped_ = false;
  size_t idle_ = 0;
  uint64_t completed_ = 0;
  std::condition_variable monitorCv_;
  std::thread monitor_;
  const int max_;
  std::vector<std::thread> threads_;
};

}  // namespace cohort::rpc
