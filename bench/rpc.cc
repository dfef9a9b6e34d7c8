// RPC figures between two processes on this host (the parent calls, a forked child serves), the
// same four that bench/rpc_torch.py measures for PyTorch's RPC:
//   tiny rpcSync round trip; a 16 MiB tensor sent and acknowledged (callee returns its size); a
//   16 MiB tensor echoed back; N concurrent rpcAsync calls in flight (calls/s).
// It prints only what it measured; scripts/bench_rpc.sh runs it and bench/rpc_torch.py in one
// invocation and prints both measured columns side by side.
// Usage: rpc [--iters N] [--concurrent N] [--reps R] [--no-shm] [--copy-threads N] [--json]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/rpc/rpc.h>

#include "harness/ranks.h"

using namespace cohort;
using Clock = std::chrono::steady_clock;

static double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  CLI::App app{"cohort RPC benchmark: two processes on this host"};
  int iters = 2000, concurrent = 10000, reps = 5;
  bool noShm = false;
  int copyThreads = 0;
  app.add_option("--iters", iters, "tiny calls per repetition");
  app.add_option("--concurrent", concurrent, "rpcAsync calls in flight at once");
  app.add_option("--reps", reps, "repetitions (medians are reported)");
  app.add_flag("--no-shm", noShm, "use TCP (uv) between the two processes");
  bool jsonLine = false;
  app.add_flag("--json", jsonLine, "print one JSON line (as bench/rpc_torch.py --json does) instead of the table");
  app.add_option("--copy-threads", copyThreads,
                 "threads reading one large tensor (RpcOptions::copyThreads; 0: one per core, at most 4)")
      ->check(CLI::Range(0, 64));
  CLI11_PARSE(app, argc, argv);

  rpc::registerFunction("noop", [](int64_t x) { return x; });
  rpc::registerFunction("nbytes", [](Tensor t) { return static_cast<int64_t>(t.nbytes()); });
  rpc::registerFunction("echo", [](Tensor t) { return t; });

  char tmpl[] = "/tmp/cohort_bench_rpc_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto options = [&] {
    rpc::RpcOptions o;
    o.store = std::make_shared<dist::FileStore>(dir + "/store", rpc::Millis(60'000));
    o.useShm = !noShm;
    o.numWorkerThreads = 2;
    o.copyThreads = copyThreads;
    return o;
  };
  // The server and the client are two ranks of the process harness (tests/harness/ranks.h): a
  // rank that fails or hangs ends the run.
  testing::RankOptions ranks;
  ranks.limit = std::chrono::minutes(10);
  ranks.stopOnFailure = true;
  ranks.tag = "rpc";
  auto results = testing::runRanks(
      2,
      [&](int rank, std::ostream&) -> int {
        if (rank == 1) {
          rpc::init("server", 1, 2, options());
          rpc::shutdown();
          return 0;
        }
        rpc::init("client", 0, 2, options());

        std::vector<double> tiny, send16, echo16, conc, perCall;
        int64_t wrongTotal = 0;
        perCall.reserve(static_cast<size_t>(iters) * reps);
        Tensor big = ones({4 * 1024 * 1024});                                      // 16 MiB of float32
        for (int i = 0; i < 200; ++i) rpc::rpcSync<int64_t>("server", "noop", i);  // warm-up
        rpc::rpcSync<int64_t>("server", "nbytes", big);
        for (int r = 0; r < reps; ++r) {
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) {
            auto c0 = Clock::now();
            rpc::rpcSync<int64_t>("server", "noop", i);
            perCall.push_back(seconds(c0, Clock::now()));
          }
          tiny.push_back(seconds(t0, Clock::now()) / iters);

          const int bigIters = 20;
          t0 = Clock::now();
          for (int i = 0; i < bigIters; ++i) rpc::rpcSync<int64_t>("server", "nbytes", big);
          send16.push_back(seconds(t0, Clock::now()) / bigIters);

          t0 = Clock::now();
          for (int i = 0; i < bigIters; ++i) rpc::rpcSync<Tensor>("server", "echo", big);
          echo16.push_back(seconds(t0, Clock::now()) / bigIters);

          std::vector<Future<int64_t>> fs;
          fs.reserve(concurrent);
          t0 = Clock::now();
          for (int i = 0; i < concurrent; ++i) fs.push_back(rpc::rpcAsync<int64_t>("server", "noop", i));
          int64_t wrong = 0;
          for (int i = 0; i < concurrent; ++i) wrong += fs[i].value() != i;
          conc.push_back(concurrent / seconds(t0, Clock::now()));
          if (wrong)
            std::fprintf(stderr, "ERROR: %lld concurrent calls returned wrong values\n", static_cast<long long>(wrong));
          wrongTotal += wrong;
        }
        rpc::shutdown();

        const double bytes = 16.0 * 1024 * 1024;
        std::sort(perCall.begin(), perCall.end());
        auto pct = [&](double q) {
          return perCall[std::min(perCall.size() - 1, static_cast<size_t>(q * perCall.size()))] * 1e6;
        };
        const std::string transport = noShm ? "uv (TCP)" : "shm";
        const std::string threads = copyThreads == 0 ? "auto" : std::to_string(copyThreads);
        if (jsonLine) {
          std::printf("{\"impl\": \"cohort\", \"label\": \"cohort (transport %s, copy threads %s)\", \"reps\": %d, "
                      "\"tiny_us\": %.3f, \"tiny_p50_us\": %.3f, \"tiny_p90_us\": %.3f, \"tiny_p99_us\": %.3f, "
                      "\"send16_ms\": %.4f, \"send16_gbs\": %.4f, \"echo16_ms\": %.4f, \"concurrent_calls_s\": %.1f, "
                      "\"concurrent\": %d, \"wrong\": %lld}\n",
                      transport.c_str(), threads.c_str(), reps, median(tiny) * 1e6, pct(0.5), pct(0.9), pct(0.99),
                      median(send16) * 1e3, bytes / median(send16) / 1e9, median(echo16) * 1e3, median(conc),
                      concurrent, static_cast<long long>(wrongTotal));
        } else {
          std::printf("cohort RPC, 2 processes, transport %s, copy threads %s, medians of %d repetitions\n",
                      transport.c_str(), threads.c_str(), reps);
          std::printf("%-44s %9.1f us\n", "rpcSync of a tiny function (round trip)", median(tiny) * 1e6);
          std::printf("%-44s %9.1f us / %.1f us / %.1f us\n", "  its p50 / p90 / p99 over all calls", pct(0.5),
                      pct(0.9), pct(0.99));
          std::printf("%-44s %9.2f ms (%.2f GB/s)\n", "16 MiB tensor sent, callee returns its size",
                      median(send16) * 1e3, bytes / median(send16) / 1e9);
          std::printf("%-44s %9.2f ms\n", "16 MiB tensor echoed back", median(echo16) * 1e3);
          std::printf("%-44s %9.0f calls/s (all %d completed)\n", "concurrent rpcAsync in flight", median(conc),
                      concurrent);
        }
        return wrongTotal != 0 ? 1 : 0;
      },
      ranks);
  std::filesystem::remove_all(dir);
  return testing::failedRanks(results).empty() ? 0 : 1;
}
