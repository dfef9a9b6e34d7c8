// Remote references across three processes: remote() leaves the value on its owner, toHere()
// fetches it, calls run on the owner through the RRef, and the owner deletes the value exactly
// once — only when the last reference anywhere is gone, including references forked to a third
// worker (many at once) and references returned from a call.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <cohort/core/ops/ops.h>

#include "rpc/rpc_test_util.h"

namespace cohort::rpc {
namespace {

using namespace testing;

std::atomic<int64_t> gFreed{0};  // tracked tensors whose memory was freed, on this process
std::mutex gHeldMu;
std::vector<RRef<Tensor>> gHeld;

// A float32 tensor 0..n-1 whose storage counts its own deletion.
Tensor trackedTensor(int64_t n) {
  float* buf = new float[n];
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i);
  auto storage = std::make_shared<Storage>(buf, n * sizeof(float), Device::cpu(), [](void* p) {
    delete[] static_cast<float*>(p);
    gFreed.fetch_add(1);
  });
  return Tensor(std::make_shared<TensorImpl>(storage, 0, Shape{n}, Shape{1}, DType::Float32));
}

const bool kRegistered = [] {
  registerFunction("make_tracked", [](int64_t n) { return trackedTensor(n); });
  registerFunction("tensor_sum", [](Tensor t, double scale) { return t.sum().itemDouble() * scale; });
  registerFunction("freed", [] { return gFreed.load(); });
  registerFunction("owned", [] { return static_cast<int64_t>(currentAgent()->ownedRRefs()); });
  registerFunction("hold", [](RRef<Tensor> r) {
    std::lock_guard<std::mutex> lock(gHeldMu);
    gHeld.push_back(r);
  });
  registerFunction("held_sums", [] {
    std::vector<RRef<Tensor>> held;
    {
      std::lock_guard<std::mutex> lock(gHeldMu);
      held = gHeld;
    }
    double total = 0;
    for (auto& r : held) total += r.toHere().sum().itemDouble();
    return total;
  });
  registerFunction("drop_all", [] {
    std::lock_guard<std::mutex> lock(gHeldMu);
    gHeld.clear();
  });
  // Runs on a user that is not the owner: the returned reference is forked back to the caller.
  registerFunction("make_on", [](std::string owner, int64_t n) { return remote<Tensor>(owner, "make_tracked", n); });
  // Receives a reference to a value it owns.
  registerFunction("sum_owned", [](RRef<Tensor> r) {
    if (!r.isOwner()) throw ValueError("not the owner");
    return r.toHere().sum().itemDouble();
  });
  // Blocks its pool thread on a nested fetch from the owner.
  registerFunction("sum_of", [](RRef<Tensor> r) { return r.toHere().sum().itemDouble(); });
  return true;
}();

// Polls `fn` until it returns `want` (or 10 s pass): decrements travel asynchronously.
template <typename F>
int64_t waitFor(int64_t want, F&& fn) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int64_t v = fn();
  while (v != want && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    v = fn();
  }
  return v;
}

TEST(RpcRRef, ValueLivesUntilTheLastReferenceAnywhereIsGone) {
  auto reports = runWorkers(3, [](int rank) -> std::string {
    if (rank != 0) return "ok";
    std::string bad;
    auto freed = [] { return rpcSync<int64_t>("w1", "freed"); };
    auto owned = [] { return rpcSync<int64_t>("w1", "owned"); };
    {
      RRef<Tensor> r = remote<Tensor>("w1", "make_tracked", 4);
      if (r.owner().name != "w1" || r.isOwner()) bad += "owner; ";
      if (r.toHere().toVector<float>() != std::vector<float>{0, 1, 2, 3}) bad += "toHere; ";
      if (r.rpcSync<double>("tensor_sum", 2.0) != 12.0) bad += "rpc through the rref; ";
      if (rpcSync<double>("w1", "sum_owned", r) != 6.0) bad += "sent back to its owner; ";
      // Forks to the third worker: one, then many at once.
      rpcSync<void>("w2", "hold", r);
      std::vector<Future<void>> forks;
      for (int i = 0; i < 20; ++i) forks.push_back(rpcAsync<void>("w2", "hold", r));
      for (auto& f : forks) f.wait(std::chrono::seconds(20));
      if (rpcSync<double>("w2", "held_sums") != 21 * 6.0) bad += "the third worker's toHere; ";
    }
    // This worker's reference is gone; the third worker's keep the value alive.
    if (waitFor(1, owned) != 1) bad += "owned count with w2 holding; ";
    if (freed() != 0) bad += "deleted while w2 still holds references; ";
    rpcSync<void>("w2", "drop_all");
    if (waitFor(1, freed) != 1) bad += "not deleted after the last reference; ";
    if (owned() != 0) bad += "still owned; ";
    // A reference returned from a call on a third worker (a fork from a user, in a response).
    {
      RRef<Tensor> r2 = rpcSync<RRef<Tensor>>("w2", "make_on", std::string("w1"), int64_t{3});
      if (r2.toHere().toVector<float>() != std::vector<float>{0, 1, 2}) bad += "returned rref; ";
    }
    if (waitFor(2, freed) != 2) bad += "the returned rref's value was not deleted; ";
    if (owned() != 0) bad += "owned after all were dropped; ";
    // remote() to oneself: this worker owns it.
    {
      RRef<Tensor> mine = remote<Tensor>("w0", "make_tracked", 2);
      if (!mine.isOwner() || mine.toHere().numel() != 2) bad += "self-owned; ";
      rpcSync<void>("w2", "hold", mine);
      if (rpcSync<double>("w2", "held_sums") != 1.0) bad += "self-owned forked; ";
    }
    if (gFreed.load() != 0) bad += "self-owned deleted while w2 holds it; ";
    rpcSync<void>("w2", "drop_all");
    if (waitFor(1, [] { return gFreed.load(); }) != 1) bad += "self-owned not deleted; ";
    if (freed() != 2) bad += "w1 deleted more than it should; ";
    return bad.empty() ? "ok" : bad;
  });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
  EXPECT_EQ(reports[2], "ok");
}

// remote() with an RRef owned by a third worker waits for the owner's count before it leaves;
// requests issued after it to the same worker (the fetch of its result) must not overtake it. And
// functions blocked on nested calls must not starve the pool: w2 starts with one thread and runs
// eight such functions at once.
TEST(RpcRRef, RequestsWaitingForAForkKeepTheirOrderAndNestedCallsDoNotStarve) {
  auto reports = runWorkers(
      3,
      [](int rank) -> std::string {
        if (rank != 0) return "ok";
        std::vector<Future<double>> sums;
        for (int i = 0; i < 8; ++i) {
          RRef<Tensor> h = remote<Tensor>("w1", "make_tracked", int64_t{3 + i});
          RRef<double> s = remote<double>("w2", "sum_of", h);
          sums.push_back(s.toHereAsync());
        }
        std::string bad;
        for (int i = 0; i < 8; ++i) {
          double n = 3 + i, want = n * (n - 1) / 2;
          double got = sums[i].value();
          if (got != want) bad += fmt::format("sum {} = {} (want {}); ", i, got, want);
        }
        return bad.empty() ? "ok" : bad;
      },
      [](int rank, RpcOptions& o) {
        if (rank == 2) o.numWorkerThreads = 1;
      });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcRRef, ACreationErrorSurfacesAtToHere) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    RRef<Tensor> r = remote<Tensor>("w1", "make_tracked", std::string("four"));
    return errorOf([&] { r.toHere(); });
  });
  EXPECT_EQ(reports[0], "RpcError: rpc 'rref fetch' on worker 'w1' raised RpcError: 'make_tracked' (int64) -> tensor: "
                        "argument 1: expected int64, got string of 4 bytes");
  EXPECT_EQ(reports[1], "ok");
}

}  // namespace
}  // namespace cohort::rpc
