/*
 * DDP communication hooks: how a ready bucket of gradients is turned into the averaged gradient
 * every rank applies. The reducer calls a hook once per bucket per synchronised backward, on the
 * thread running backward, buckets in index order (the same order on every rank).
 *
 * A hook must issue all of its collectives from inside run(), never from a completion callback:
 * callbacks run on backend threads in whatever order the ops finish, and ranks that issued
 * collectives in different orders would exchange the wrong data. A hook may return a Future
 * that still does local work in then() (decompression), and may wait on a collective inside
 * run() before issuing the next one (PowerSGD does). The Future's value is the averaged gradient
 * with bucket.buffer's shape and dtype; it may be bucket.buffer itself (the reducer copies it
 * back otherwise). Errors travel in the Future and are rethrown at the end of backward.
 *
 * Built in: allreduceHook (the default: allreduce with ReduceOp::Avg), fp16CompressHook and
 * bf16CompressHook (halve the bytes on the wire; the reduction accumulates in float32), and
 * PowerSGD (powersgd_hook.h). Users implement CommHook, or wrap a function with makeCommHook.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/future.h>
#include <cohort/distributed/process_group.h>

namespace cohort::dist {

// One bucket's gradients, as a hook sees them.
struct GradBucket {
  size_t index = 0;                // 0 = the first bucket to become ready (the last layers' parameters)
  bool isLast = false;             // the last bucket of this backward
  Tensor buffer;                   // flat and contiguous: every gradient of the bucket, back to back
  std::vector<Tensor> parameters;  // the bucket's parameters, in buffer order
  std::vector<int64_t> offsets;    // element offset of each parameter's gradient in buffer
  uint64_t iteration = 0;          // synchronised backward passes before this one (for warm-up schedules)

  // The gradient of parameters[i]: a view of buffer with the parameter's shape.
  Tensor gradient(size_t i) const;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts the bucket's reduction; see the file comment for the rules.
  virtual Future<Tensor> run(ProcessGroup& pg, GradBucket& bucket) = 0;
};
using CommHookPtr = std::shared_ptr<CommHook>;

// The default: averages bucket.buffer in place (allreduce, ReduceOp::Avg).
CommHookPtr allreduceHook();
// Sends the bucket as float16 / bfloat16 and writes the average back in the buffer's dtype.
// Error: one rounding of each rank's gradient and one of the average (the reduction itself
// accumulates in float32).
CommHookPtr fp16CompressHook();
CommHookPtr bf16CompressHook();
// A hook from a function (stateless hooks, tests).
CommHookPtr makeCommHook(std::string name, std::function<Future<Tensor>(ProcessGroup&, GradBucket&)> fn);

// Turns a collective's Work into the Future of its first output tensor.
Future<Tensor> firstOutput(const WorkPtr& work);

}  // namespace cohort::dist
