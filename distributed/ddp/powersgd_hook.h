/*
 * PowerSGD: a DDP communication hook that sends a low-rank approximation of each gradient matrix
 * instead of the matrix (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
 * Compression for Distributed Optimization", NeurIPS 2019; the algorithm of PyTorch's
 * powerSGD_hook). For an n×m gradient and rank r the wire carries r·(n+m) numbers instead of n·m.
 *
 *   ddp->registerCommHook(dist::powerSGDHook({.matrixApproximationRank = 2, .startPowerSGDIter = 10}));
 *
 * Per bucket, from iteration startPowerSGDIter on (GradBucket::iteration; before it the bucket is
 * averaged exactly, like the default hook, so training settles before compression starts):
 *  - gradients with ndim ≤ 1, and matrices too small to gain (n·m < minCompressionRate·r·(n+m),
 *    r = min(rank, n, m)), are averaged uncompressed: one allreduce of all of them together;
 *  - every other gradient is viewed as M = [shape[0], rest]; with error feedback M += the error this
 *    rank kept from the previous step; then P = M·Q, allreduce P (Sum), orthonormalise P's columns,
 *    Q = Mᵀ·P, allreduce Q (Avg), and the bucket gets P·Qᵀ = P·Pᵀ·avg(M); this rank keeps
 *    error = M − P·Qᵀ for the next step.
 *  P is summed, not averaged: orthonormalisation is invariant to the scale, so dividing would be
 *  wasted work; Q is averaged, so P·Qᵀ is already the averaged approximation.
 *
 * Q starts from a seeded normal draw that is identical on every rank (seed, bucket index and the
 * iteration the state was created), and with warmStart the averaged Q of one step starts the next
 * (one power-iteration step per training step); otherwise every step draws a fresh Q. Each step
 * first orthonormalises Q; a column that vanishes there (Q lost rank) is redrawn, so Q always
 * spans r dimensions. A P column that vanishes in orthonormalisation (the averaged gradient has
 * rank < r) is set to zero rather than divided by ~0. With r ≥ min(n, m) the approximation is the
 * exact average up to rounding.
 *
 * State is per bucket index (Q and the error of each compressed matrix) and remembers the
 * bucket's parameters: when DDP rebuilds its buckets after the first iteration, or the layout of
 * a bucket index changes in any way, that bucket's state starts afresh. Error is only kept for
 * compressed matrices: for averaged tensors the local errors sum to zero over the ranks and would
 * cancel in the next average.
 *
 * Collectives (the comm_hook.h contract): all issued from run(), on the backward thread, in the
 * same order on every rank — the uncompressed allreduce, P's allreduce, (wait for P, bounded by the
 * group's timeout through Work::wait), Q's allreduce. The returned Future decompresses in then().
 * Under Join a joined rank runs the hook on zero gradients; it still adds its error and takes part
 * in every collective, so its Q stays identical to the others' and its leftover error is sent.
 * float32 and float64 gradients are computed in their own dtype; float16/bfloat16 ones in float32.
 *
 * Threads: run() is called on the thread running backward, one bucket at a time; a bucket's
 * decompression (then()) may run on a backend thread, and touches only that bucket's state, which
 * the next run() for the bucket reads only after DDP waited for the previous result.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/distributed/ddp/comm_hook.h>

namespace cohort::dist {

struct PowerSGDOptions {
  int matrixApproximationRank = 1;    // r: columns of P and Q (≥ 1; capped at min(n, m) per matrix)
  uint64_t startPowerSGDIter = 1000;  // iterations before this one use exact averaging
  bool useErrorFeedback = true;
  bool warmStart = true;
  int64_t minCompressionRate = 2;  // compress only when n·m ≥ this × r·(n+m); 0 compresses every matrix
  uint64_t seed = 0;               // Q's initial draw; must be the same on every rank
};

class PowerSGDHook final : public CommHook {
 public:
  // Throws ValueError naming the option when `options` is invalid.
  explicit PowerSGDHook(PowerSGDOptions options);
  ~PowerSGDHook() override;

  std::string name() const override { return "powerSGD"; }
  Future<Tensor> run(ProcessGroup& pg, GradBucket& bucket) override;
  const PowerSGDOptions& options() const { return opts_; }

  // Introspection (tests, logging). `slot` is the parameter's position in its bucket.
  // Whether the gradient in that slot is compressed (false before the bucket first ran compressed).
  bool isCompressed(size_t bucket, size_t slot) const;
  // This rank's error feedback for the slot ([n, m], compute dtype); undefined when not compressed
  // or before the first compressed step.
  Tensor error(size_t bucket, size_t slot) const;
  // The slot's Q ([m, r], the averaged Q of the last step); undefined like error().
  Tensor q(size_t bucket, size_t slot) const;
  // Times a bucket's state was created or reset because its parameters changed.
  uint64_t stateResets() const;

 private:
  struct BucketState;
  std::shared_ptr<BucketState> stateFor(const GradBucket& bucket);
  std::shared_ptr<const BucketState> findState(size_t bucket) const;

  PowerSGDOptions opts_;
  mutable std::mutex mu_;  // guards states_ (the vector, not the states: see the file comment)
  std::vector<std::shared_ptr<BucketState>> states_;
  uint64_t resets_ = 0;
};

// A stateful PowerSGD hook; use one per DistributedDataParallel. Throws ValueError on bad options.
CommHookPtr powerSGDHook(PowerSGDOptions options = {});

}  // namespace cohort::dist
