/*
 * Reducer: DDP's gradient machinery. Owns the buckets (flat gradient buffers; each parameter's
 * .grad is a view into its bucket, or with gradientAsBucketView = false a tensor of its own that
 * is copied in and out), the post-accumulate-grad hooks that mark parameters ready, and the
 * per-iteration state.
 *
 * One synchronised iteration:
 *  - prepareForForward(): at the first forward after the first synchronised backward, rebuilds
 *    the buckets in the order gradients actually became ready (rank 0's order, broadcast, so every
 *    rank buckets alike).
 *  - prepareForBackward(outputs): arms the hooks; with findUnusedParameters (or staticGraph's
 *    first iteration) walks the autograd graph from `outputs` to find the parameters this forward
 *    did not use.
 *  - backward: each parameter's hook copies its gradient into the bucket (unless .grad already is
 *    the bucket view) and marks it ready; the first hook also marks the unused parameters ready
 *    and queues finalize on the autograd engine. A bucket whose parameters are all ready is handed
 *    to the comm hook at once, buckets strictly in index order, so every rank issues the same
 *    collectives in the same order while backward goes on.
 *  - finalize (end of backward, same thread): launches the used-parameter bitmap's all-reduce
 *    (findUnusedParameters), waits for every bucket within the group's timeout, copies results
 *    back, and leaves .grad undefined for parameters no rank used.
 * A parameter that got no gradient without findUnusedParameters is reported by name at the end of
 * that backward (after the remaining buckets were reduced with zeros, so peers don't hang).
 *
 * Inside a distributed autograd context (rpc/autograd.h) gradients go to the context, not to
 * .grad: the hooks read each gradient with autograd::gradOf() and copy it into its bucket, and
 * finalize writes each averaged gradient back into the context (a copy of its bucket slice, so
 * the next iteration's backward cannot change a context's gradients). .grad is never touched.
 *
 * Devices: the parameters are on one device (the CPU or one GPU) and the buckets live there; the
 * small control tensors (the rebuild order, the used-parameter bitmap, DDP's model check and Join
 * flags) go through the group's CPU backend when it has one, else through the parameters' device
 * (a group with only "nccl"), as controlDevice() says.
 *
 * Threads: everything runs on the thread that calls forward and backward.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/process_group.h>

namespace cohort::dist {

struct ReducerOptions {
  double bucketCapMb = 25.0;
  double firstBucketCapMb = 1.0;
  bool findUnusedParameters = false;
  bool staticGraph = false;
  // true: each parameter's .grad is a view into its bucket (no copies, no second gradient-sized
  // buffer). false: .grad stays a tensor of its own; the gradient is copied into the bucket when
  // it is ready and the reduced value copied back at the end of backward (PyTorch's default).
  bool gradientAsBucketView = true;
};

// Bucket assignment: parameter indices per bucket, taking `order` (parameter indices, first
// ready first). A parameter joins the open bucket, which closes once it holds at least the cap
// (firstCapBytes for the first bucket) or when the next parameter's dtype differs; as PyTorch's
// compute_bucket_assignment_by_size. Exposed for tests.
std::vector<std::vector<size_t>> assignBuckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                               size_t firstCapBytes, size_t capBytes);

// Where DDP's small control collectives run: the CPU when `pg` has a CPU backend, else `params`.
Device controlDevice(const ProcessGroup& pg, Device params);

class Reducer {
 public:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names, ProcessGroupPtr pg, ReducerOptions opts);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void setCommHook(CommHookPtr hook);  // before the first synchronised backward
  const CommHookPtr& commHook() const { return hook_; }

  // Checks the previous iteration finished; with `sync`, rebuilds the buckets when due.
  void prepareForForward(bool sync);
  // `sync`: this iteration's backward reduces (false under noSync: gradients only accumulate).
  void prepareForBackward(const std::vector<Tensor>& outputs, bool sync);

  // For Join: plays this rank's part of one synchronised iteration without data (zero
  // gradients), so ranks that still have data can finish theirs.
  void shadowBackward();

  // Introspection (tests, logging, the benchmark).
  size_t numBuckets() const { return buckets_.size(); }
  std::vector<std::vector<std::string>> bucketParameterNames() const;
  uint64_t syncedIterations() const { return iterations_; }
  bool bucketsRebuilt() const { return rebuilt_; }
  // Seconds the last synchronised backward's end spent waiting for its buckets: the part of the
  // communication that backward did not hide (the benchmark's overlap figure).
  double lastExposedWaitS() const { return exposedWaitS_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // parameter indices, in buffer order
    std::vector<int64_t> offsets;
    std::vector<Tensor> views;  // views[i]: params[i]'s gradient inside buffer
    Tensor buffer;
    size_t pending = 0;
    bool launched = false;
    Future<Tensor> result;
  };

  void buildBuckets(const std::vector<size_t>& order);
  void rebuildBuckets();
  void onGradAccumulated(size_t index);
  void markReady(size_t index);
  void launchReadyBuckets();
  void launch(size_t b);
  void finalize();
  void waitBuckets();
  void waitRound(const WorkPtr& usedWork);
  void endRound();
  void resetIteration();
  void copyReducedIntoGrads(const int32_t* globallyUsed);
  std::string paramLabel(size_t index) const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroupPtr pg_;
  ReducerOptions opts_;
  Device control_;  // controlDevice() of the group and the parameters' device
  CommHookPtr hook_;
  std::vector<int> hookHandles_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // parameter -> (bucket, slot)

  // Per iteration.
  bool expectHooks_ = false;
  bool finalizeQueued_ = false;
  bool finalized_ = false;  // this forward's backward is over: another one is an error
  bool unusedMarked_ = false;
  size_t nextLaunch_ = 0;
  std::vector<char> ready_;
  std::vector<char> locallyUsed_;
  std::vector<size_t> unused_;  // parameters this forward did not use
  bool unusedKnown_ = false;    // staticGraph: unused_ found once and kept

  // Bucket rebuilding.
  bool rebuilt_ = false;
  bool rebuildPending_ = false;
  std::vector<size_t> readyOrder_;

  uint64_t iterations_ = 0;
  double exposedWaitS_ = 0;
};

}  // namespace cohort::dist
