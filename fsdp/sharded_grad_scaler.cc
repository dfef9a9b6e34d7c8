#include <cohort/fsdp/sharded_grad_scaler.h>

#include <cohort/distributed/grad_scaler.h>

namespace cohort::fsdp {

namespace {

Device shardDevice(const FullyShardedDataParallel& fsdp) {
  return fsdp.numUnits() > 0 ? fsdp.unit(0).shard().device() : Device::cpu();
}

}  // namespace

ShardedGradScaler::ShardedGradScaler(FullyShardedDataParallel& fsdp, amp::GradScalerOptions options)
    : amp::GradScaler(options, dist::foundInfAllReduce(fsdp.processGroup().shared_from_this(), shardDevice(fsdp))) {}

}  // namespace cohort::fsdp
