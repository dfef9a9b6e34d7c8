/*
 * Join: training with uneven inputs. Ranks that run out of data call join(); until every rank has
 * joined, they shadow the collectives of the ranks that still train (one notify all-reduce per
 * iteration, the bucket rebuild, buffer broadcasts, and every bucket's reduction with zero
 * gradients), so nobody waits for a collective that never comes. Gradients are averaged over the
 * whole group's size, joined ranks contributing zeros (PyTorch's divide-by-initial-world-size).
 * When everyone has joined, the parameters and buffers of the last rank to join (the lowest such
 * rank) are broadcast, so every rank ends with the same model.
 *
 *   dist::Join join(*ddp);
 *   for (auto& batch : myShard) { ...forward, backward, step... }
 *   join.join();
 *
 * or dist::joinUneven(*ddp, [&] { ...the loop... }).
 *
 * With throwOnEarlyTermination, the first rank to run out makes every rank throw DistError at its
 * next iteration instead (for jobs where uneven data is a bug).
 * Every rank of the group must use a Join with the same options around its loop; all waits carry
 * the group's timeout. A Join must not be nested, and join() runs once.
 */
#pragma once

#include <cohort/distributed/ddp/distributed_data_parallel.h>

namespace cohort::dist {

struct JoinOptions {
  bool enable = true;  // false: join() is a no-op and forward sends no notification
  bool throwOnEarlyTermination = false;
};

class Join {
 public:
  explicit Join(DistributedDataParallel& ddp, JoinOptions options = {});
  // Leaves join mode. If join() was never called (an exception left the loop), no collective is
  // run here: the peers then fail with the group's TimeoutError naming this rank.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank is out of data: shadow the others until all have joined, then sync the model.
  void join();

 private:
  DistributedDataParallel& ddp_;
  JoinOptions opts_;
  bool joined_ = false;
};

// Runs `loop` inside a Join scope and joins when it returns.
template <typename F>
void joinUneven(DistributedDataParallel& ddp, F&& loop, JoinOptions options = {}) {
  Join join(ddp, options);
  loop();
  join.join();
}

}  // namespace cohort::dist
