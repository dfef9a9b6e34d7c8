// The staged collectives of HierarchicalBackend (see hierarchical_backend.h), run on its worker:
// each is a short sequence of stages over the intra-node shm backend and the leaders' backend.
#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/hierarchical/hierarchical_backend.h>

namespace cohort::dist::hierarchical_backend {

namespace {

// float16/bfloat16 sums and products travel as float32, so every stage accumulates in float32
// and the result is rounded once; min and max are exact in any type.
bool widens(DType d, ReduceOp op) {
  return (d == DType::Float16 || d == DType::BFloat16) && op != ReduceOp::Min && op != ReduceOp::Max;
}

// Avg runs as Sum through the stages and divides once at the end.
ReduceOp stageOp(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

}  // namespace

void HierarchicalBackend::allreduceStaged(Tensor& tensor, ReduceOp op, const WorkPtr& work) {
  if (tensor.numel() == 0 || size() == 1) return;  // Avg over one rank is the value itself
  const bool wide = widens(tensor.dtype(), op);
  Tensor buf = wide ? tensor.to(DType::Float32) : tensor;
  const ReduceOp sop = stageOp(op);
  if (intra_) {
    stage(work, OpType::Reduce, intra_, "reduce to the node leader",
          [&](const WorkPtr& w) { intra_->reduce(buf, ReduceOptions{.op = sop, .root = 0}, w); });
  }
  if (inter_) {
    stage(work, OpType::Allreduce, inter_, "allreduce across node leaders",
          [&](const WorkPtr& w) { inter_->allreduce(buf, AllreduceOptions{.op = sop}, w); });
  }
  if (intra_) {
    stage(work, OpType::Broadcast, intra_, "broadcast from the node leader",
          [&](const WorkPtr& w) { intra_->broadcast(buf, BroadcastOptions{.root = 0}, w); });
  }
  if (op == ReduceOp::Avg) buf.div_(Scalar(static_cast<double>(size())));
  if (wide) tensor.copy_(buf);
}

void HierarchicalBackend::broadcastStaged(Tensor& tensor, int root, const WorkPtr& work) {
  if (tensor.numel() == 0 || size() == 1) return;
  const int rootNode = layout_.nodeOf[root];
  const bool onRootNode = layout_.nodeOf[rank()] == rootNode;
  if (intra_ && onRootNode) {
    stage(work, OpType::Broadcast, intra_, "broadcast from the root on its node",
          [&](const WorkPtr& w) { intra_->broadcast(tensor, BroadcastOptions{.root = layout_.localRank[root]}, w); });
  }
  if (inter_) {
    stage(work, OpType::Broadcast, inter_, "broadcast across node leaders",
          [&](const WorkPtr& w) { inter_->broadcast(tensor, BroadcastOptions{.root = rootNode}, w); });
  }
  if (intra_ && !onRootNode) {
    stage(work, OpType::Broadcast, intra_, "broadcast from the node leader",
          [&](const WorkPtr& w) { intra_->broadcast(tensor, BroadcastOptions{.root = 0}, w); });
  }
}

void HierarchicalBackend::reduceStaged(Tensor& tensor, ReduceOp op, int root, const WorkPtr& work) {
  if (tensor.numel() == 0 || size() == 1) return;
  const bool wide = widens(tensor.dtype(), op);
  const bool isRoot = rank() == root;
  // Only the root's tensor changes: the others reduce from a copy.
  Tensor buf = wide ? tensor.to(DType::Float32) : (isRoot ? tensor : tensor.clone());
  const ReduceOp sop = stageOp(op);
  const int rootNode = layout_.nodeOf[root];
  if (intra_) {
    stage(work, OpType::Reduce, intra_, "reduce to the node leader",
          [&](const WorkPtr& w) { intra_->reduce(buf, ReduceOptions{.op = sop, .root = 0}, w); });
  }
  if (inter_) {
    stage(work, OpType::Reduce, inter_, "reduce across node leaders",
          [&](const WorkPtr& w) { inter_->reduce(buf, ReduceOptions{.op = sop, .root = rootNode}, w); });
  }
  if (intra_ && layout_.nodeOf[rank()] == rootNode && layout_.localRank[root] != 0) {
    stage(work, OpType::Broadcast, intra_, "broadcast from the node leader to the root",
          [&](const WorkPtr& w) { intra_->broadcast(buf, BroadcastOptions{.root = 0}, w); });
  }
  if (!isRoot) return;
  if (op == ReduceOp::Avg) buf.div_(Scalar(static_cast<double>(size())));
  if (wide) tensor.copy_(buf);
}

void HierarchicalBackend::allgatherStaged(Tensor& full, const Tensor& input, const WorkPtr& work) {
  const int64_t n = input.numel();
  if (n == 0) return;
  const Tensor in = input.reshape({-1});
  if (size() == 1) {
    full.copy_(in);
    return;
  }
  const DType dtype = input.dtype();
  const int node = layout_.nodeOf[rank()];
  const std::vector<int>& members = layout_.nodes[node];
  const int64_t maxNode = static_cast<int64_t>(layout_.maxNodeSize());
  // This node's inputs, on its leader, padded to the largest node so every leader sends one size.
  Tensor block = isLeader() ? empty({maxNode * n}, TensorOptions{.dtype = dtype}) : Tensor();
  if (intra_) {
    std::vector<Tensor> outs;
    if (isLeader())
      for (size_t i = 0; i < members.size(); ++i) outs.push_back(block.narrow(0, static_cast<int64_t>(i) * n, n));
    stage(work, OpType::Gather, intra_, "gather to the node leader",
          [&](const WorkPtr& w) { intra_->gather(outs, in, GatherOptions{.root = 0}, w); });
  } else {
    block.narrow(0, 0, n).copy_(in);
  }
  if (isLeader()) {
    Tensor blocks = block;
    if (inter_) {
      blocks = empty({layout_.numNodes() * maxNode * n}, TensorOptions{.dtype = dtype});
      stage(work, OpType::AllgatherIntoTensor, inter_, "allgather across node leaders",
            [&](const WorkPtr& w) { inter_->allgatherIntoTensor(blocks, block, AllgatherOptions{}, w); });
    }
    // From node blocks to rank order.
    for (int k = 0; k < layout_.numNodes(); ++k) {
      for (size_t i = 0; i < layout_.nodes[k].size(); ++i) {
        full.narrow(0, layout_.nodes[k][i] * n, n)
            .copy_(blocks.narrow(0, (k * maxNode + static_cast<int64_t>(i)) * n, n));
      }
    }
  }
  if (intra_) {
    stage(work, OpType::Broadcast, intra_, "broadcast from the node leader",
          [&](const WorkPtr& w) { intra_->broadcast(full, BroadcastOptions{.root = 0}, w); });
  }
}

}  // namespace cohort::dist::hierarchical_backend
