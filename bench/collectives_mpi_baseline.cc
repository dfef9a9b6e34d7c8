/*
 * The bare-MPI baseline for bench/collectives: the same ops, sizes, method and output as cohort's
 * program (collectives_common.h), straight on OpenMPI's blocking collectives with MPI_COMM_WORLD,
 * in place where MPI allows it (allreduce, as cohort's mpi backend runs it).
 *
 *   mpirun -np 2 build-bench/bench/collectives_mpi_baseline [--ops allreduce] [--min-bytes 4] ...
 *
 * ops map to MPI_Allreduce (MPI_IN_PLACE, MPI_SUM), MPI_Allgather, MPI_Reduce_scatter_block,
 * MPI_Bcast (root 0) and MPI_Alltoall.
 */
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "collectives_common.h"

using namespace cohort_bench;

namespace {

// Sizes the buffers for `op` at `bytes` and returns one call of it.
std::function<void()> makeOp(const std::string& op, size_t bytes, int n, FloatBuffer& in, FloatBuffer& out) {
  const size_t count = bytes / 4, chunk = count / static_cast<size_t>(n);
  const int c = static_cast<int>(count), k = static_cast<int>(chunk);
  const bool inPlace = op == "allreduce" || op == "broadcast";
  in.assign(op == "allgather" ? chunk : count, 0.0f);
  out.assign(inPlace ? 0 : (op == "reduce_scatter" ? chunk : count), 0.0f);
  if (op == "allreduce") {
    return [&in, c] { MPI_Allreduce(MPI_IN_PLACE, in.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
  }
  if (op == "broadcast") return [&in, c] { MPI_Bcast(in.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD); };
  if (op == "allgather") {
    return [&in, &out, k] { MPI_Allgather(in.data(), k, MPI_FLOAT, out.data(), k, MPI_FLOAT, MPI_COMM_WORLD); };
  }
  if (op == "reduce_scatter") {
    return [&in, &out, k] { MPI_Reduce_scatter_block(in.data(), out.data(), k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
  }
  if (op == "alltoall") {
    return [&in, &out, k] { MPI_Alltoall(in.data(), k, MPI_FLOAT, out.data(), k, MPI_FLOAT, MPI_COMM_WORLD); };
  }
  std::fprintf(stderr, "collectives_mpi_baseline: unknown op '%s'\n", op.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bare OpenMPI collectives, the baseline for bench/collectives"};
  SweepOptions sweep;
  bool threadMultiple = false;
  sweep.addTo(app);
  app.add_flag("--thread-multiple", threadMultiple,
               "initialise with MPI_Init_thread(MPI_THREAD_MULTIPLE), as cohort's mpi backend does");
  CLI11_PARSE(app, argc, argv);

  if (threadMultiple) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (rank == 0) {
    printHeader("mpi",
                threadMultiple ? "bare OpenMPI, MPI_COMM_WORLD, MPI_THREAD_MULTIPLE" : "bare OpenMPI, MPI_COMM_WORLD",
                n);
  }
  FloatBuffer in, out;
  for (const auto& op : splitCsv(sweep.ops)) {
    for (size_t bytes : sizeList(op, sweep.minBytes, sweep.maxBytes, sweep.factor, n)) {
      auto call = makeOp(op, bytes, n, in, out);
      long wrong = checkedCall(op, rank, n, in, out, call);
      int iters = sweep.itersAt(bytes);
      for (int i = 0; i < sweep.warmup; ++i) call();
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) call();
      double secs = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      long total = 0;
      MPI_Reduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) printRow(op, bytes, "float", secs, n, total);
    }
  }
  MPI_Finalize();
  return 0;
}
