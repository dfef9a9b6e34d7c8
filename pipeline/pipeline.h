/*
 * Pipeline-parallel training: each pipeline rank holds one or more stages of a model (modules
 * whose outputs feed the next stage) and runs its list of a schedule's actions (schedule.h) every
 * step, exchanging activations and gradients with the other ranks through a Transport.
 *
 *   auto pg = dist::initProcessGroup();
 *   pipeline::Pipeline pipe({myStage}, pipeline::processGroupTransport(pg), lossFn,
 *                           {.schedule = "1f1b", .microbatches = 8});
 *   for (...) {
 *     opt.zeroGrad();
 *     Tensor loss = pipe.step(inputs, targets);   // the batch's loss, on every rank
 *     opt.step();                                 // each rank steps its own stages' parameters
 *   }
 *
 * A step cuts the batch (dim 0) into `microbatches` pieces whose sizes differ by at most one,
 * runs forward and backward of each as the schedule says, and leaves in every parameter's .grad
 * the gradient of the whole batch's loss: with LossReduction::Mean each micro-batch's loss is
 * weighted by its share of the batch (so the result equals one process computing the mean over
 * the batch), with Sum the losses are added. Gradients accumulate across steps until you zero
 * them (accumulating over several steps is just not zeroing). Only the first stage's rank reads
 * `input` and only the last stage's rank reads `target`; other ranks may pass undefined tensors.
 *
 * Every transfer carries its shape and dtype, so micro-batches of different sizes and stages
 * whose outputs change shape between steps need nothing special. The schedule is checked when
 * the pipeline is built (ScheduleError before anything runs). When an action fails on this rank
 * — a peer that died, a receive past the timeout — step() throws the error's type (TimeoutError,
 * DistError, ...) with the message prefixed by this rank, the stage, micro-batch and action.
 *
 * Stages: `stages` are this rank's modules in ascending stage order (with the interleaved
 * schedule, stages r, r + p, r + 2p, ... of a p-rank pipeline; with "v", stages r and 2p - 1 - r;
 * schedule().stagesOf(rank) says which). A stage's forward takes one tensor and returns one; the
 * last stage's output goes to the loss function with the target.
 *
 * Devices: a rank's stages live on its transport's device (a ValueError when a parameter is
 * elsewhere); `input` and `target` are moved there. On GPUs give every rank its own device and
 * build the transport with it, processGroupTransport(pg, Device::cuda(localRank)): with an
 * "nccl" backend in the group activations and gradients go device to device, with only CPU
 * backends (or the RPC transport) they go through the host. The loss step() returns is on the CPU.
 *
 * Pipeline x data parallel: give a stage as a DistributedDataParallel over the group of the
 * ranks holding the same stage in the other pipeline replicas (DeviceMesh, distributed/
 * device_mesh.h, makes those groups). The pipeline runs every forward of the step under DDP's
 * noSync and arms DDP's reducer right before the stage's last backward (B, or W), so the
 * gradients accumulated over all micro-batches are averaged across replicas once per step, the
 * all-reduce overlapping that last backward. Feed each replica its own share of the batch; the
 * losses step() returns are per replica (average them across replicas for the whole batch's).
 * A stage may instead be a FullyShardedDataParallel over that group (every schedule): each
 * micro-batch's backward gathers the stage's units again (FSDP frees them after each backward)
 * and reduce-scatters into the sharded gradients, which accumulate over the step.
 */
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/nn/module.h>
#include <cohort/pipeline/schedule.h>
#include <cohort/pipeline/transport.h>

namespace cohort::pipeline {

enum class LossReduction { Mean, Sum };

// One parameter held by several stages, each with its own copy: (stage, the parameter's name in
// that stage's module; in the wrapped module for a DistributedDataParallel stage). At the end of every step the
// pipeline adds up the gradients the copies got in that step and gives every copy the sum (split.h: a GPT's tied
// embedding and LM head).
struct TiedParameter {
  std::vector<std::pair<int, std::string>> copies{};
};

struct PipelineOptions {
  std::string schedule = "1f1b";  // a built-in name (schedule.h), unless a Schedule is given
  int microbatches = 4;
  int chunks = 0;     // stages per rank for "interleaved" (0: 2); "v" always holds 2
  int lookahead = 0;  // extra forwards each rank runs ahead in 1f1b, interleaved, v and zb (schedule.h)
  // The backwards of the last splitTail micro-batches split into input and weight halves, the
  // weight halves filling the waits at the end of the step (schedule.h, splitTail); applied to the
  // schedule whether it is named here or given. 0: as the schedule says.
  int splitTail = 0;
  LossReduction lossReduction = LossReduction::Mean;
  Millis timeout = Millis(300'000);   // how long a receive waits for its peer
  std::vector<TiedParameter> tied{};  // parameters whose copies stay in sync (see above)
  // Stages whose forward keeps no activations: each micro-batch's forward is recomputed during
  // its backward (autograd::checkpoint), trading compute for memory. A DistributedDataParallel
  // stage recomputes its wrapped module (DDP's forward, which only broadcasts buffers under the
  // pipeline's noSync, is skipped for it).
  std::vector<int> checkpointStages{};
};

// output of the last stage, target of its micro-batch -> a one-element loss.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// The rows of each of `microbatches` micro-batches a step cuts `rows` into: sizes differing by
// at most one, the first rows % microbatches one larger.
Shape microbatchSizes(int64_t rows, int microbatches);

struct StepTiming {
  std::vector<TimedAction> actions{};  // this rank's actions, seconds since the step began
  double seconds = 0;                  // the whole step on this rank
  double busy = 0;                     // time in F, B, I and W
};

class Pipeline {
 public:
  Pipeline(std::vector<std::shared_ptr<nn::Module>> stages, TransportPtr transport, LossFn loss,
           PipelineOptions options = {});
  // With a schedule of your own (checked here; its ranks must be the transport's size).
  Pipeline(std::vector<std::shared_ptr<nn::Module>> stages, TransportPtr transport, LossFn loss, Schedule schedule,
           PipelineOptions options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One training step (see above). Returns the batch's loss (float64, one element) on every rank.
  Tensor step(const Tensor& input, const Tensor& target);

  // Gradient accumulation over several steps with DDP stages: steps inside the scope leave their
  // gradients on this rank (DDP's reducer is not armed); the first step after it all-reduces the
  // sum, as DDP's own noSync does. Tied copies are still kept in sync every step. Without DDP
  // stages, accumulating is only not zeroing the gradients, and the scope changes nothing.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Pipeline& p) : p_(&p), prev_(p.requireSync_) { p.requireSync_ = false; }
    ~NoSyncGuard() {
      if (p_) p_->requireSync_ = prev_;
    }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Pipeline* p_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard noSync() { return NoSyncGuard(*this); }

  // Scales the gradients of every stage of the pipeline so that their global norm (over all
  // pipeline ranks, a tied parameter counted once) is at most maxNorm, as optim::clipGradNorm does
  // for one model; returns the norm before clipping. Collective over the pipeline's ranks: call
  // it on every rank, after step().
  double clipGradNorm(double maxNorm);

  const Schedule& schedule() const { return schedule_; }
  int rank() const { return transport_->rank(); }
  const std::vector<int>& stageIndices() const { return stageIds_; }
  bool holdsFirstStage() const;
  bool holdsLastStage() const;
  std::vector<Tensor> parameters() const;  // of this rank's stages
  const StepTiming& lastStepTiming() const { return timing_; }

 private:
  struct MicroState;
  struct Tie {
    std::vector<int> ranks;      // ranks holding a copy, ascending
    std::vector<Tensor> local;   // this rank's copies (distinct tensors)
    std::vector<Tensor> before;  // their .grad at the start of the step (undefined: none)
    bool primary = false;        // this rank is the lowest holding a copy (norms count it here)
  };
  void syncTied();
  void run(const Action& a, const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  // The tag of a transfer to `stage` (its input activation, or its output's gradient).
  int64_t tag(bool gradient, int stage, int microbatch) const;
  int64_t lossTagBase() const;  // + the receiving rank
  int64_t tieTagBase() const;   // + the tied parameter's index
  int64_t clipTag() const;
  MicroState& state(int stage, int microbatch);

  std::vector<std::shared_ptr<nn::Module>> stages_;
  std::vector<int> stageIds_;
  TransportPtr transport_;
  LossFn loss_;
  Schedule schedule_;  // with communication
  PipelineOptions options_;
  std::vector<MicroState> states_;  // per (local stage, micro-batch)
  std::vector<Tie> ties_;
  bool requireSync_ = true;
  std::vector<int> lastBackward_;  // per local stage: index of its last B or W in this rank's list
  std::vector<double> lossScale_;
  double lossSum_ = 0;
  StepTiming timing_;
};

}  // namespace cohort::pipeline
