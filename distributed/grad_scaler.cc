#include <cohort/distributed/grad_scaler.h>

#include <utility>

#include <cohort/core/ops/ops.h>

namespace cohort::dist {

amp::FoundInfReduction foundInfAllReduce(ProcessGroupPtr pg, Device device) {
  COHORT_CHECK_T(ValueError, pg != nullptr, "foundInfAllReduce: the process group is null");
  return [pg = std::move(pg), device](bool localFoundInf) {
    Tensor flag = full({1}, localFoundInf ? 1.0 : 0.0, {.dtype = DType::Float32, .device = device});
    pg->allreduce(flag, {.op = ReduceOp::Max})->wait();
    return flag.to(Device::cpu()).item<float>() > 0.0F;
  };
}

}  // namespace cohort::dist
