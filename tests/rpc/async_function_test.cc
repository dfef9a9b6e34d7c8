// Asynchronous user functions: a registered function returning a Future releases the agent's
// thread at once, and the response goes out when the future completes — here a server with a
// single worker thread batches the calls of three callers and answers them all together.
#include <gtest/gtest.h>

#include <mutex>

#include "rpc/rpc_test_util.h"

namespace cohort::rpc {
namespace {

using namespace testing;

constexpr int kCallers = 3;

struct Batcher {
  std::mutex mu;
  std::vector<std::pair<int64_t, Future<int64_t>>> waiting;
};
Batcher& batcher() {
  static Batcher b;
  return b;
}

const bool kRegistered = [] {
  // Every caller gets the sum of the whole batch, once all kCallers have arrived.
  registerFunction("batched_add", [](int64_t x) -> Future<int64_t> {
    Future<int64_t> mine;
    std::vector<std::pair<int64_t, Future<int64_t>>> full;
    {
      std::lock_guard<std::mutex> lock(batcher().mu);
      batcher().waiting.emplace_back(x, mine);
      if (static_cast<int>(batcher().waiting.size()) == kCallers) full.swap(batcher().waiting);
    }
    int64_t sum = 0;
    for (auto& [v, f] : full) sum += v;
    for (auto& [v, f] : full) f.setValue(sum);
    return mine;
  });
  registerFunction("async_fail", [](std::string why) -> Future<int64_t> {
    Future<int64_t> f;
    std::thread([f, why]() mutable { f.setError(std::make_exception_ptr(ValueError(why))); }).detach();
    return f;
  });
  registerFunction("async_void", []() -> Future<void> { return Future<void>::ready(); });
  return true;
}();

TEST(RpcAsyncFunction, OneServerThreadBatchesManyCallers) {
  auto reports = runWorkers(
      kCallers + 1,
      [](int rank) -> std::string {
        if (rank == 0) return "ok";
        int64_t got = rpcSync<int64_t>("w0", "batched_add", int64_t{rank} * 10);
        return got == 60 ? "ok" : fmt::format("got {}", got);
      },
      [](int rank, RpcOptions& o) {
        if (rank == 0) o.numWorkerThreads = 1;  // a blocking function would serve one caller only
      });
  for (int r = 0; r <= kCallers; ++r) EXPECT_EQ(reports[r], "ok") << "rank " << r;
}

TEST(RpcAsyncFunction, AFailedFutureIsARemoteErrorAndVoidFuturesWork) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    std::string e = errorOf([] { rpcSync<int64_t>("w1", "async_fail", std::string("no capacity")); });
    std::string v = errorOf([] { rpcSync<void>("w1", "async_void"); });
    return e + "|" + v;
  });
  EXPECT_EQ(reports[0], "RpcError: rpc 'async_fail' on worker 'w1' raised ValueError: no capacity|");
  EXPECT_EQ(reports[1], "ok");
}

}  // namespace
}  // namespace cohort::rpc
