// Helpers for the RPC tests: workers as forked processes meeting through a FileStore in a
// temporary directory. Each child runs a body that returns its report ("ok" or what went wrong);
// the parent kills children past the deadline, so a hang fails the test instead of blocking it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "distributed/fork_util.h"

#include <cohort/distributed/store/file_store.h>
#include <cohort/rpc/rpc.h>

namespace cohort::rpc::testing {

using dist::testing::TempDir;
using namespace std::chrono_literals;

inline RpcOptions testOptions(const TempDir& dir) {
  RpcOptions o;
  o.store = std::make_shared<dist::FileStore>(dir.file("store"), Millis(20'000));
  o.initTimeout = Millis(20'000);
  o.shutdownTimeout = Millis(20'000);
  o.rpcTimeout = Millis(20'000);
  return o;
}

// fmt rather than "w" + std::to_string(rank): GCC 12 at -O3 reports a false -Wrestrict on that.
inline std::string workerName(int rank) { return fmt::format("w{}", rank); }

// Forks `n` workers; each joins as "w<rank>" and runs body(rank) (its report), then shuts down
// gracefully unless the body already did. Returns the reports by rank; a child that crashed or
// was killed reports so.
inline std::vector<std::string> runWorkers(int n, const std::function<std::string(int)>& body,
                                           const std::function<void(int, RpcOptions&)>& configure = {},
                                           std::chrono::seconds deadline = std::chrono::seconds(60)) {
  TempDir dir;
  auto results = dist::testing::runForked(n, deadline, dir.path(), [&](int rank) -> std::string {
    std::string report;
    try {
      RpcOptions o = testOptions(dir);
      if (configure) configure(rank, o);
      init(workerName(rank), rank, n, o);
      report = body(rank);
      shutdown();
    } catch (const std::exception& e) {
      report += std::string("exception: ") + e.what();
    }
    return report;
  });
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    std::string rep = results[r].report;
    if (results[r].killedByWatchdog) rep += " [killed by the test's deadline]";
    else if (!WIFEXITED(results[r].status)) rep += " [crashed]";
    out.push_back(rep);
  }
  return out;
}

// Runs fn; returns "" when it throws nothing, else "<type>: <message>".
template <typename F>
std::string errorOf(F&& fn) {
  try {
    fn();
  } catch (const RpcTimeoutError& e) {
    return std::string("RpcTimeoutError: ") + e.what();
  } catch (const RpcError& e) {
    return std::string("RpcError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "";
}

}  // namespace cohort::rpc::testing
