/*
 * Vocabulary shared by ProcessGroup, Backend and Work: reduction ops, collective op types and the
 * options structs every collective takes. A timeout of kDefaultTimeout means "the group's".
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::dist {

using Millis = std::chrono::milliseconds;
inline constexpr Millis kDefaultTimeout{-1};            // use the group's timeout
inline constexpr Millis kDefaultGroupTimeout{600'000};  // 10 minutes

enum class ReduceOp : uint8_t { Sum, Avg, Product, Min, Max };
const char* reduceOpName(ReduceOp op);

enum class OpType : uint8_t {
  Allreduce,
  AllreduceCoalesced,
  Broadcast,
  Reduce,
  Allgather,            // into a list of tensors
  AllgatherIntoTensor,  // into one tensor of world * input size
  AllgatherCoalesced,
  ReduceScatter,        // from a list of tensors
  ReduceScatterTensor,  // from one tensor of world * output size
  Alltoall,             // equal splits of one tensor
  AlltoallV,            // uneven splits of one tensor
  AlltoallList,         // a list of tensors each way
  Gather,
  Scatter,
  Barrier,
  Send,
  Recv,
};
inline constexpr int kNumOpTypes = static_cast<int>(OpType::Recv) + 1;
const char* opTypeName(OpType op);

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Millis timeout = kDefaultTimeout;
};
struct BroadcastOptions {
  int root = 0;
  Millis timeout = kDefaultTimeout;
};
struct ReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  Millis timeout = kDefaultTimeout;
};
struct AllgatherOptions {
  Millis timeout = kDefaultTimeout;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  Millis timeout = kDefaultTimeout;
};
struct AlltoallOptions {
  // For AlltoallV: elements along dim 0 sent to / received from each rank (empty = equal splits).
  std::vector<int64_t> outputSplitSizes{};
  std::vector<int64_t> inputSplitSizes{};
  Millis timeout = kDefaultTimeout;
};
struct GatherOptions {
  int root = 0;
  Millis timeout = kDefaultTimeout;
};
struct ScatterOptions {
  int root = 0;
  Millis timeout = kDefaultTimeout;
};
struct BarrierOptions {
  Millis timeout = kDefaultTimeout;
};
struct SendRecvOptions {
  int tag = 0;
  Millis timeout = kDefaultTimeout;
};

}  // namespace cohort::dist
