/*
 * amp::GradScaler across ranks: the found-inf flag every rank's scaler computes from its own
 * gradients, combined over a process group, so all ranks skip the same steps and keep the same
 * scale (core/amp/grad_scaler.h says why that matters, for DDP and FSDP).
 *
 *   auto ddp = std::make_shared<dist::DistributedDataParallel>(model, pg);
 *   amp::GradScaler scaler({.initScale = 65536}, dist::foundInfAllReduce(pg));
 *   ...
 *   scaler.scale(loss).backward();
 *   scaler.step(opt);     // unscales, all-reduces the flag (MAX), steps or skips on every rank alike
 *   scaler.update();
 *
 * FSDP: fsdp::ShardedGradScaler (<cohort/fsdp/sharded_grad_scaler.h>) does this over the FSDP
 * module's group.
 */
#pragma once

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/tensor/device.h>
#include <cohort/distributed/process_group.h>

namespace cohort::dist {

// A FoundInfReduction that all-reduces the flag (as a one-element float32 tensor on `device`, the
// device the group's backend serves: the CPU for gloo/shm/mpi, a GPU for nccl) with MAX over `pg`
// and waits for it. It keeps `pg` alive. Collective: every rank of `pg` must unscale in step (one
// all-reduce per GradScaler::unscale, also when the scaler unscales from step()). ValueError for a
// null group.
amp::FoundInfReduction foundInfAllReduce(ProcessGroupPtr pg, Device device = Device::cpu());

}  // namespace cohort::dist
