#include <cohort/distributed/collective_options.h>

namespace cohort::dist {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Product: return "product";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "unknown";
}

const char* opTypeName(OpType op) {
  switch (op) {
    case OpType::Allreduce: return "allreduce";
    case OpType::AllreduceCoalesced: return "allreduce_coalesced";
    case OpType::Broadcast: return "broadcast";
    case OpType::Reduce: return "reduce";
    case OpType::Allgather: return "allgather";
    case OpType::AllgatherIntoTensor: return "allgather_into_tensor";
    case OpType::AllgatherCoalesced: return "allgather_coalesced";
    case OpType::ReduceScatter: return "reduce_scatter";
    case OpType::ReduceScatterTensor: return "reduce_scatter_tensor";
    case OpType::Alltoall: return "alltoall";
    case OpType::AlltoallV: return "alltoall_v";
    case OpType::AlltoallList: return "alltoall_list";
    case OpType::Gather: return "gather";
    case OpType::Scatter: return "scatter";
    case OpType::Barrier: return "barrier";
    case OpType::Send: return "send";
    case OpType::Recv: return "recv";
  }
  return "unknown";
}

}  // namespace cohort::dist
