// Send and recv of the MPI backend: the worker issues MPI_Isend/MPI_Irecv in order with the
// collectives, and the poller thread completes them (mpi_backend.cc), so neither blocks the queue.
#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/mpi/detail/mpi_datatype.h>
#include <cohort/distributed/mpi/detail/mpi_state.h>

namespace cohort::dist::mpi_backend {

namespace {
void checkTag(int tag, const MpiComm& comm, const char* op) {
  int ub = comm.env().tagUpperBound();
  if (tag < 0 || tag > ub) {
    throw ValueError(fmt::format("backend mpi: {} tag {} is outside MPI's tag range [0, {}]", op, tag, ub));
  }
}
}  // namespace

void MpiBackend::send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) {
  checkTag(opts.tag, *state_->comm, "send");
  int count = mpiCount(tensor.numel(), "send's tensor");
  auto abortFlag = std::make_shared<std::atomic<bool>>(false);
  State* s = state_.get();  // the closure runs on the state's own worker
  state_->enqueueP2p(
      work,
      [s, work, t = tensor, dst, tag = opts.tag, count,
       abortFlag](MPI_Comm comm) -> std::optional<std::vector<Tensor>> {
        auto op = std::make_shared<P2pOp>();
        op->work = work;
        op->tensor = t;
        op->isRecv = false;
        op->count = count;
        op->type = mpiType(t.dtype());
        op->peer = dst;
        op->tag = tag;
        op->abortRequested = abortFlag;
        char dummy = 0;
        check(MPI_Isend(count ? t.dataPtr() : &dummy, count, op->type, dst, tag, comm, &op->request), "MPI_Isend");
        s->addP2p(std::move(op));
        return std::nullopt;
      },
      abortFlag);
}

void MpiBackend::recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) {
  checkTag(opts.tag, *state_->comm, "recv");
  int count = mpiCount(tensor.numel(), "recv's tensor");
  auto abortFlag = std::make_shared<std::atomic<bool>>(false);
  State* s = state_.get();
  state_->enqueueP2p(
      work,
      [s, work, t = tensor, src, tag = opts.tag, count,
       abortFlag](MPI_Comm comm) -> std::optional<std::vector<Tensor>> {
        auto op = std::make_shared<P2pOp>();
        op->work = work;
        op->tensor = t;
        op->isRecv = true;
        op->count = count;
        op->type = mpiType(t.dtype());
        op->peer = src;
        op->tag = tag;
        op->abortRequested = abortFlag;
        char dummy = 0;
        // A larger message than the tensor fails with MPI_ERR_TRUNCATE; a smaller one is caught by
        // the poller's element count check.
        check(MPI_Irecv(count ? t.dataPtr() : &dummy, count, op->type, src, tag, comm, &op->request), "MPI_Irecv");
        s->addP2p(std::move(op));
        return std::nullopt;
      },
      abortFlag);
}

}  // namespace cohort::dist::mpi_backend
