/*
 * ShardedGradScaler: amp::GradScaler for FullyShardedDataParallel (torch's ShardedGradScaler).
 * Each rank's optimizer holds only its shards (fsdp->parameters()), so unscale() checks only this
 * rank's slice of every gradient; the found-inf flag is then all-reduced (MAX) over the FSDP
 * module's process group (every rank, also under HYBRID_SHARD), and every rank skips or takes the
 * step alike.
 *
 *   auto fsdp = std::make_shared<fsdp::FullyShardedDataParallel>(model, pg, options);
 *   optim::AdamW opt(fsdp->parameters(), {.lr = 3e-4});
 *   fsdp::ShardedGradScaler scaler(*fsdp, {.initScale = 65536});
 *   for (...) {
 *     opt.zeroGrad();
 *     scaler.scale(loss).backward();   // gradients reduce-scattered into the shards, still scaled
 *     scaler.unscale(opt);             // this rank's shards, then the flag over the group
 *     fsdp->clipGradNorm(1.0);         // the norm over the whole model, of the true gradients
 *     scaler.step(opt);
 *     scaler.update();
 *   }
 *
 * Everything else is amp::GradScaler's (core/amp/grad_scaler.h), the state in training checkpoints
 * included (fsdp/training_checkpoint.h). Like any collective, every rank calls unscale/step in the
 * same order. The scaler keeps the group alive, not the FSDP module.
 */
#pragma once

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

namespace cohort::fsdp {

class ShardedGradScaler : public amp::GradScaler {
 public:
  // The flag travels on the device of the module's shards. ValueError for bad options.
  explicit ShardedGradScaler(FullyShardedDataParallel& fsdp, amp::GradScalerOptions options = {});
};

}  // namespace cohort::fsdp
