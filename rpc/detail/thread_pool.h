/*
 * A pool of threads running queued tasks, for the RPC agent's user functions and the completion
 * of callers' futures (docs/thread_model.md). It starts with `threads` and grows, up to
 * `maxThreads`, when it stalls: tasks are queued, every thread is busy and none finished a task
 * for 10 ms (a monitor thread checks). User functions may block on nested calls whose responses
 * need a pool thread to complete, and a fixed pool full of such waiters would deadlock; a pool
 * that merely has a backlog of short tasks does not grow. Tasks must not throw (the agent wraps them). stop() lets
 * queued tasks finish and joins; tasks queued after stop() are dropped.
 */
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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
  static constexpr const char* kThreadName = "cohort-rpc-pool";  // at most 15 characters (Linux)

  // poll: how long a thread that finished a task polls for the next before it sleeps (0: never).
  // name: the threads' name (at most 15 characters). A pool that cannot grow (maxThreads <=
  // threads) runs no monitor thread.
  ThreadPool(int threads, int maxThreads, std::chrono::microseconds poll = std::chrono::microseconds(100),
             const char* name = kThreadName)
      : max_(std::max(threads, maxThreads)), poll_(poll), name_(name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
    if (max_ > threads) monitor_ = std::thread([this] { monitor(); });
  }
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Returns false (and drops the task) once stopped.
  bool run(std::function<void()> task) {
    size_t queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return false;
      tasks_.push_back(std::move(task));
      queued = tasks_.size();
      queued_.store(queued);
    }
    // A thread that is polling takes the task without being woken; wake a sleeping one only for
    // tasks beyond the pollers (a poller checks the queue under the lock before it sleeps).
    if (queued > spinning_.load()) cv_.notify_one();
    return true;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ && threads_.empty()) return;
      stopped_ = true;
      stopping_.store(true);
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
    pthread_setname_np(pthread_self(), name_);  // what debuggers and the thread-model test see
    for (;;) {
      std::function<void()> task;
      spinForWork();
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return stopped_ || !tasks_.empty(); });
        --idle_;
        if (tasks_.empty()) return;  // stopped and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
        queued_.store(tasks_.size());
      }
      task();
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
    }
  }
  // After a task, a thread polls (yielding the CPU) for a short while before it sleeps: in a
  // stream of calls the next request usually arrives within that window, and a thread that is
  // still awake takes it without a futex wake-up and a context switch (tens of µs on a busy
  // virtual machine). Polling stops at once when there is work, and after poll_ without any.
  void spinForWork() {
    if (poll_.count() <= 0) return;
    const auto until = std::chrono::steady_clock::now() + poll_;
    ++spinning_;
    while (queued_.load() == 0 && !stopping_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    --spinning_;
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
  std::atomic<size_t> queued_{0};  // tasks_.size(), readable without the lock
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> spinning_{0};  // threads in spinForWork
  bool stopped_ = false;
  size_t idle_ = 0;
  uint64_t completed_ = 0;
  std::condition_variable monitorCv_;
  std::thread monitor_;
  const int max_;
  const std::chrono::microseconds poll_;
  const char* name_;
  std::vector<std::thread> threads_;
};

}  // namespace cohort::rpc
