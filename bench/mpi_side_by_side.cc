/*
 * cohort's mpi backend against bare OpenMPI, side by side in one process. For each op and size the
 * program alternates rounds: a block of cohort ops (a ProcessGroup on the mpi backend, each op
 * waited for) and a block of the same MPI call on MPI_COMM_WORLD, on the same tensors' memory,
 * the order swapped every round. Both sides so see the same host state, buffers and alignment:
 * separate runs of two programs, minutes apart, drift by 2-4x on a shared host, and a bare program
 * with its own buffers also differs in their alignment.
 *
 *   mpirun -np 2 build/bench/mpi_side_by_side
 *   mpirun -np 2 build/bench/mpi_side_by_side --ops allreduce --max-bytes 65536 --rounds 31
 *
 * Each row: rank 0's median time per op of each side over the rounds, and the median and range
 * of the per-round ratio cohort / MPI. The MPI calls are those the backend makes for contiguous
 * float32 tensors: MPI_Allreduce (in place), MPI_Bcast, MPI_Allgather, MPI_Reduce_scatter_block,
 * MPI_Alltoall. Results are not checked here (bench/collectives counts wrong elements; the tests
 * check every op): the inputs are zeros, so repeated in-place sums stay finite.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/distributed/init.h>

#include "collectives_common.h"

namespace {

using namespace cohort;
using namespace cohort_bench;
using Clock = std::chrono::steady_clock;

struct Pair {
  std::function<void()> cohort, bare;
};

// The two sides of `op` on tensors of `bytes` (the op's larger buffer).
Pair makePair(dist::ProcessGroup& pg, const std::string& op, size_t bytes, Tensor& in, Tensor& out) {
  const int n = pg.size();
  const int count = static_cast<int>(bytes / 4), chunk = count / n;
  auto f = [](const Tensor& t) { return static_cast<float*>(t.dataPtr()); };
  if (op == "allreduce") {
    in = zeros({static_cast<int64_t>(count)});
    return {[&pg, &in] { pg.allreduce(in)->wait(); },
            [&in, f, count] { MPI_Allreduce(MPI_IN_PLACE, f(in), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }};
  }
  if (op == "broadcast") {
    in = zeros({static_cast<int64_t>(count)});
    return {[&pg, &in] { pg.broadcast(in)->wait(); },
            [&in, f, count] { MPI_Bcast(f(in), count, MPI_FLOAT, 0, MPI_COMM_WORLD); }};
  }
  if (op == "allgather") {
    in = zeros({static_cast<int64_t>(chunk)});
    out = zeros({static_cast<int64_t>(chunk) * n});
    return {[&pg, &in, &out] { pg.allgatherIntoTensor(out, in)->wait(); },
            [&in, &out, f, chunk] {
              MPI_Allgather(f(in), chunk, MPI_FLOAT, f(out), chunk, MPI_FLOAT, MPI_COMM_WORLD);
            }};
  }
  if (op == "reduce_scatter") {
    in = zeros({static_cast<int64_t>(chunk) * n});
    out = zeros({static_cast<int64_t>(chunk)});
    return {[&pg, &in, &out] { pg.reduceScatterTensor(out, in)->wait(); },
            [&in, &out, f, chunk] {
              MPI_Reduce_scatter_block(f(in), f(out), chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }};
  }
  if (op == "alltoall") {
    in = zeros({static_cast<int64_t>(chunk) * n});
    out = zeros({static_cast<int64_t>(chunk) * n});
    return {[&pg, &in, &out] { pg.alltoall(out, in)->wait(); },
            [&in, &out, f, chunk] { MPI_Alltoall(f(in), chunk, MPI_FLOAT, f(out), chunk, MPI_FLOAT, MPI_COMM_WORLD); }};
  }
  throw ValueError(fmt::format("mpi_side_by_side: unknown op '{}' (ops: {})", op, fmt::join(allOps(), ", ")));
}

// Seconds per call of `iters` calls, the ranks started together.
double timeBlock(const std::function<void()>& call, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) call();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort's mpi backend against bare OpenMPI, alternating in one process; run under mpirun"};
  // Here the iterations are those of one block (per side and round), and warm-up is one block of
  // up to `warmup` calls of each side.
  SweepOptions sweep;
  sweep.budget = size_t{64} << 20;
  sweep.minIters = 2;
  sweep.maxIters = 2000;
  sweep.warmup = 20;
  int rounds = 15;
  sweep.addTo(app);
  app.add_option("--rounds", rounds, "alternating rounds per size")->capture_default_str()->check(CLI::Range(1, 1001));
  CLI11_PARSE(app, argc, argv);

  try {
    dist::InitOptions init;
    init.backend = "mpi";
    auto pg = dist::initProcessGroup(init);
    const int n = pg->size();
    if (pg->rank() == 0) {
      std::printf(
          "# cohort mpi backend vs bare MPI on MPI_COMM_WORLD, alternating in one process: %d ranks, %d rounds\n", n,
          rounds);
      std::printf("%-16s %12s %12s %12s %10s %15s\n", "# op", "size(B)", "cohort(us)", "mpi(us)", "ratio",
                  "ratio range");
    }
    for (const auto& op : splitCsv(sweep.ops)) {
      for (size_t bytes : sizeList(op, sweep.minBytes, sweep.maxBytes, sweep.factor, n)) {
        Tensor in, out;
        Pair pair = makePair(*pg, op, bytes, in, out);
        const int iters = sweep.itersAt(bytes);
        if (sweep.warmup > 0) {
          timeBlock(pair.cohort, std::min(iters, sweep.warmup));
          timeBlock(pair.bare, std::min(iters, sweep.warmup));
        }
        std::vector<double> ours, bare, ratio;
        for (int r = 0; r < rounds; ++r) {
          double a, b;
          if (r % 2 == 0) {
            a = timeBlock(pair.cohort, iters);
            b = timeBlock(pair.bare, iters);
          } else {
            b = timeBlock(pair.bare, iters);
            a = timeBlock(pair.cohort, iters);
          }
          ours.push_back(a);
          bare.push_back(b);
          ratio.push_back(a / b);
        }
        if (pg->rank() == 0) {
          auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
          std::printf("%-16s %12zu %12.2f %12.2f %9.2fx %7.2f-%.2fx\n", op.c_str(), bytes, median(ours) * 1e6,
                      median(bare) * 1e6, median(ratio), *lo, *hi);
          std::fflush(stdout);
        }
      }
    }
    dist::destroyProcessGroup();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_side_by_side: %s\n", e.what());
    return 1;
  }
  return 0;
}
