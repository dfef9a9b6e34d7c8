/*
 * cohort's collectives, nccl-tests style (see collectives_common.h for the columns and method).
 * Each process is one rank; it joins through dist::initProcessGroup(), so it runs under mpirun
 * (any backend), torchrun-style variables or srun:
 *
 *   mpirun -np 2 build-bench/bench/collectives --backend gloo
 *   mpirun -np 2 build-bench/bench/collectives --backend mpi --ops allreduce --min-bytes 4096 --max-bytes 4096
 *   mpirun -np 4 build-bench/bench/collectives --backend hierarchical --ranks-per-node 2   # 2 simulated nodes x 2
 *
 * scripts/bench_collectives.sh runs it for each backend next to the bare MPI and gloo programs
 * and prints the figures side by side. Rank 0 first measures the memcpy limit while the other
 * ranks wait for it in the rendezvous (they sleep there, so the figure is one core's, unshared).
 */
#include <cstdlib>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/distributed/env/environment.h>
#include <cohort/distributed/init.h>

#include "collectives_common.h"

namespace {

using namespace cohort;
using namespace cohort_bench;
using dist::ProcessGroup;

// Runs `op` once on tensors of `bytes` (the op's larger buffer) and returns a callable that
// issues one op and waits for it.
std::function<void()> makeOp(ProcessGroup& pg, const std::string& op, size_t bytes, Tensor& in, Tensor& out) {
  const int n = pg.size();
  const int64_t count = static_cast<int64_t>(bytes / 4);
  if (op == "allreduce") {
    in = zeros({count});
    return [&pg, &in] { pg.allreduce(in)->wait(); };
  }
  if (op == "broadcast") {
    in = zeros({count});
    return [&pg, &in] { pg.broadcast(in)->wait(); };
  }
  if (op == "allgather") {
    in = zeros({count / n});
    out = zeros({count});
    return [&pg, &in, &out] { pg.allgatherIntoTensor(out, in)->wait(); };
  }
  if (op == "reduce_scatter") {
    in = zeros({count});
    out = zeros({count / n});
    return [&pg, &in, &out] { pg.reduceScatterTensor(out, in)->wait(); };
  }
  if (op == "alltoall") {
    in = zeros({count});
    out = zeros({count});
    return [&pg, &in, &out] { pg.alltoall(out, in)->wait(); };
  }
  throw ValueError(fmt::format("collectives: unknown op '{}' (ops: {})", op, fmt::join(allOps(), ", ")));
}

// One checked call with known inputs; returns the number of wrong output elements.
long checkOnce(ProcessGroup& pg, const std::string& op, Tensor& in, Tensor& out) {
  float* p = in.data<float>();
  for (int64_t i = 0; i < in.numel(); ++i) p[i] = checkValue(pg.rank(), static_cast<size_t>(i));
  if (op == "allreduce") {
    pg.allreduce(in)->wait();
  } else if (op == "broadcast") {
    pg.broadcast(in)->wait();
  } else if (op == "allgather") {
    pg.allgatherIntoTensor(out, in)->wait();
  } else if (op == "reduce_scatter") {
    pg.reduceScatterTensor(out, in)->wait();
  } else if (op == "alltoall") {
    pg.alltoall(out, in)->wait();
  }
  const Tensor& result = (op == "allreduce" || op == "broadcast") ? in : out;
  long wrong = countWrong(op, pg.rank(), pg.size(), result.data<float>(), static_cast<size_t>(result.numel()));
  in.zero_();
  if (out.defined()) out.zero_();
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort collectives benchmark (nccl-tests style); run one process per rank"};
  std::string backend = "gloo";
  SweepOptions sweep;
  bool noMemcpy = false, listBackends = false;
  int ranksPerNode = 0;
  app.add_option("--backend", backend, "cohort backend: gloo, mpi, shm, hierarchical, auto (registered names)")
      ->capture_default_str();
  app.add_option("--ranks-per-node", ranksPerNode,
                 "simulate nodes of this many consecutive ranks (sets COHORT_NODE_ID per rank; 0: real hosts)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sweep.addTo(app);
  app.add_flag("--no-memcpy", noMemcpy, "skip the memcpy limit rows");
  app.add_flag("--list-backends", listBackends, "print the backends this build registered, one per line, and exit");
  CLI11_PARSE(app, argc, argv);
  if (listBackends) {
    for (const auto& name : dist::availableBackends()) std::printf("%s\n", name.c_str());
    return 0;
  }

  try {
    auto opList = splitCsv(sweep.ops);
    for (const auto& op : opList) {
      if (std::find(allOps().begin(), allOps().end(), op) == allOps().end()) {
        throw ValueError(fmt::format("collectives: unknown op '{}' (ops: {})", op, fmt::join(allOps(), ", ")));
      }
    }
    auto where = dist::env::detectEnvironment();
    if (where.rank == 0 && !noMemcpy)
      printMemcpyRows(sizeList("allreduce", sweep.minBytes, sweep.maxBytes, sweep.factor, where.worldSize));

    if (ranksPerNode > 0) ::setenv("COHORT_NODE_ID", fmt::format("sim{}", where.rank / ranksPerNode).c_str(), 1);
    dist::InitOptions init;
    init.backend = backend;
    init.environment = where;
    auto pg = dist::initProcessGroup(init);
    const int n = pg->size();
    if (pg->rank() == 0) {
      const std::string chosen = pg->backend(DeviceType::CPU).name();
      printHeader("cohort",
                  fmt::format("backend {}{}{}", backend, chosen == backend ? "" : " -> " + chosen,
                              ranksPerNode > 0 ? fmt::format(", {} ranks per simulated node", ranksPerNode) : ""),
                  n);
    }

    for (const auto& op : opList) {
      for (size_t bytes : sizeList(op, sweep.minBytes, sweep.maxBytes, sweep.factor, n)) {
        Tensor in, out;
        auto call = makeOp(*pg, op, bytes, in, out);
        long wrong = checkOnce(*pg, op, in, out);
        int iters = sweep.itersAt(bytes);
        for (int i = 0; i < sweep.warmup; ++i) call();
        pg->barrier()->wait();
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) call();
        double secs = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
        // Every rank's count of wrong elements, summed, so a wrong result anywhere shows.
        Tensor w = full({1}, static_cast<double>(wrong), TensorOptions{DType::Float64});
        pg->allreduce(w)->wait();
        if (pg->rank() == 0) printRow(op, bytes, "float", secs, n, static_cast<long>(w.item<double>()));
      }
    }
    pg->barrier()->wait();
    dist::destroyProcessGroup();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives: %s\n", e.what());
    return 1;
  }
  return 0;
}
