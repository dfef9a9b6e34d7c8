/*
 * The bare-gloo baseline for bench/collectives: the same method and output as cohort's program
 * (collectives_common.h), straight on Debian's libgloo — one TCP device on loopback, a full mesh
 * connected through gloo's own FileStore, and gloo's new-style functions (gloo::allreduce with
 * gloo::sum, gloo::allgather, gloo::broadcast, gloo::alltoall) run on the calling thread.
 * reduce_scatter has no new-style function in this gloo (only a legacy algorithm class, which
 * must not share a context with gloo::allreduce), so it has no baseline row.
 *
 * The rank and world size come from mpirun's variables (OMPI_COMM_WORLD_RANK/SIZE) or RANK and
 * WORLD_SIZE; --store-dir must be an empty directory shared by the ranks (gloo's FileStore never
 * deletes its keys):
 *
 *   d=$(mktemp -d); mpirun -np 2 build-bench/bench/collectives_gloo_baseline --store-dir $d; rm -r $d
 */
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <CLI/CLI.hpp>

#include "collectives_common.h"

using namespace cohort_bench;

namespace {

int envInt(const char* a, const char* b) {
  for (const char* name : {a, b}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  std::fprintf(stderr, "collectives_gloo_baseline: set %s (mpirun does) or %s\n", a, b);
  std::exit(2);
}

using Ctx = std::shared_ptr<gloo::Context>;
using SumFn = void (*)(void*, const void*, const void*, size_t);

// Sizes the buffers for `op` at `bytes` and returns one call of it (empty: no bare gloo function).
std::function<void()> makeOp(const Ctx& ctx, const std::string& op, size_t bytes, FloatBuffer& in, FloatBuffer& out) {
  const size_t count = bytes / 4, chunk = count / static_cast<size_t>(ctx->size);
  const bool inPlace = op == "allreduce" || op == "broadcast";
  in.assign(op == "allgather" ? chunk : count, 0.0f);
  out.assign(inPlace ? 0 : count, 0.0f);
  if (op == "allreduce") {
    return [ctx, &in] {
      gloo::AllreduceOptions o(ctx);
      o.setOutput(in.data(), in.size());
      o.setReduceFunction(static_cast<SumFn>(&gloo::sum<float>));
      gloo::allreduce(o);
    };
  }
  if (op == "broadcast") {
    return [ctx, &in] {
      gloo::BroadcastOptions o(ctx);
      o.setOutput(in.data(), in.size());
      o.setRoot(0);
      gloo::broadcast(o);
    };
  }
  if (op == "allgather") {
    return [ctx, &in, &out] {
      gloo::AllgatherOptions o(ctx);
      o.setInput(in.data(), in.size());
      o.setOutput(out.data(), out.size());
      gloo::allgather(o);
    };
  }
  if (op == "alltoall") {
    return [ctx, &in, &out] {
      gloo::AlltoallOptions o(ctx);
      o.setInput(in.data(), in.size());
      o.setOutput(out.data(), out.size());
      gloo::alltoall(o);
    };
  }
  return {};  // reduce_scatter: no new-style function in this gloo
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bare gloo collectives, the baseline for bench/collectives"};
  std::string storeDir;
  SweepOptions sweep;
  sweep.ops = "allreduce,allgather,broadcast,alltoall";  // gloo has no new-style reduce_scatter
  app.add_option("--store-dir", storeDir, "empty directory shared by the ranks")->required();
  sweep.addTo(app);
  CLI11_PARSE(app, argc, argv);

  const int rank = envInt("OMPI_COMM_WORLD_RANK", "RANK"), n = envInt("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE");
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, device);
    if (rank == 0) printHeader("gloo", "bare gloo 0.5 (Debian), TCP on loopback", n);
    FloatBuffer in, out;
    for (const auto& op : splitCsv(sweep.ops)) {
      for (size_t bytes : sizeList(op, sweep.minBytes, sweep.maxBytes, sweep.factor, n)) {
        auto call = makeOp(ctx, op, bytes, in, out);
        if (!call) {
          if (rank == 0) std::printf("# %s: no bare gloo function, skipped\n", op.c_str());
          break;
        }
        long wrong = checkedCall(op, rank, n, in, out, call);
        int iters = sweep.itersAt(bytes);
        for (int i = 0; i < sweep.warmup; ++i) call();
        gloo::BarrierOptions b(ctx);
        gloo::barrier(b);
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) call();
        double secs = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
        std::vector<float> w = {static_cast<float>(wrong)};
        gloo::AllreduceOptions r(ctx);
        r.setOutput(w.data(), 1);
        r.setReduceFunction(static_cast<SumFn>(&gloo::sum<float>));
        gloo::allreduce(r);
        if (rank == 0) printRow(op, bytes, "float", secs, n, static_cast<long>(w[0]));
      }
    }
    gloo::BarrierOptions b(ctx);
    gloo::barrier(b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_gloo_baseline: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
