/*
 * Internal to ProcessGroup: how far this rank got through its group's collectives, published in
 * the group's store so that the other ranks can tell, when an op times out or fails, who never
 * reached it and who never finished it (hang_diagnosis.h reads it).
 *
 * The value under "progress/<rank>" (in the group's store) is "<last started> <last completed>
 * <last failed>", three sequence numbers; a rank that never published counts as "0 0 0". Only
 * collectives count (send/recv have no sequence number).
 *
 * Publishing. The op's thread only stores to atomics (markStarted/markCompleted/markFailed: no
 * lock, no wake-up; on a rank bound to one core, waking a thread per op costs a context switch).
 * A background thread writes the counters to the store when they changed, at most every 20 ms
 * while ops run and backing off to every 200 ms when idle, so a stalled or dead rank's last
 * published progress is at most that old; publish() writes at once (the diagnosis does, before it
 * reads the others). A failed write is logged at Debug and otherwise ignored: at the end of a job
 * rank 0's store may be gone before the others' last publish.
 *
 * Threads: the mark* calls and publish() may come from any thread; the destructor stops and joins
 * the background thread.
 */
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include <cohort/distributed/store/store.h>

namespace cohort::dist {

// One rank's published counters, as read back from the store.
struct RankProgress {
  uint64_t started = 0, completed = 0, failed = 0;
};

// Reads rank `rank`'s published progress from the group's store ("0 0 0" when it published none).
RankProgress readProgress(Store& store, int rank);

class ProgressPublisher {
 public:
  // Publishes under "progress/<rank>" in `store` (the group's store) from a background thread.
  ProgressPublisher(StorePtr store, int rank);
  ~ProgressPublisher();
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // Collective `seq` was issued (sequence numbers are issued in increasing order).
  void markStarted(uint64_t seq) { started_.store(seq, std::memory_order_relaxed); }
  // Collective `seq` completed, or failed; counters only move forward.
  void markCompleted(uint64_t seq) { atomicMax(completed_, seq); }
  void markFailed(uint64_t seq) { atomicMax(failed_, seq); }

  // Writes the counters to the store now if they changed since the last write; true when it wrote.
  bool publish();

 private:
  static void atomicMax(std::atomic<uint64_t>& a, uint64_t v) {
    uint64_t cur = a.load(std::memory_order_relaxed);
    while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  std::string value() const;
  void loop();

  StorePtr store_;
  std::string key_;
  std::atomic<uint64_t> started_{0}, completed_{0}, failed_{0};
  std::mutex mu_;  // guards stop_ and published_; the counters are atomics
  std::condition_variable cv_;
  bool stop_ = false;
  std::string published_;
  std::mutex publishMu_;  // one store write at a time, in order
  std::thread thread_;
};

}  // namespace cohort::dist
