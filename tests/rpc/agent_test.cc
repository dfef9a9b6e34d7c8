// The TensorPipe agent across processes: typed sync and async calls with tensors of every dtype
// and size 0 to 64 MiB, chained futures, remote exceptions, unknown functions and wrong argument
// types, per-call timeouts, a peer that dies with calls pending, the shared secret, malformed
// frames, and graceful shutdown with calls in flight.
#include <gtest/gtest.h>

#include <pthread.h>

#include <thread>

#include <cohort/core/ops/ops.h>
#include <cohort/rpc/detail/thread_pool.h>
#include <cohort/rpc/tensorpipe/detail/parallel_cma.h>
#include <cohort/rpc/tensorpipe/tensorpipe_agent.h>

#include "rpc/rpc_test_util.h"

namespace cohort::rpc {
namespace {

using namespace testing;

const bool kRegistered = [] {
  registerFunction("add", [](int64_t a, int64_t b) { return a + b; });
  registerFunction("echo", [](Value v) { return v; });
  registerFunction("concat", [](std::vector<std::string> parts, std::map<std::string, int64_t> counts) {
    std::string s;
    for (const auto& p : parts) s += p;
    for (const auto& [k, n] : counts) s += fmt::format("|{}={}", k, n);
    return s;
  });
  registerFunction("nbytes", [](Tensor t) { return static_cast<int64_t>(t.nbytes()); });
  registerFunction("fail", [](int64_t x) -> int64_t { throw ValueError(fmt::format("bad input {}", x)); });
  registerFunction("sleep_ms", [](int64_t ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  });
  registerFunction("die", [](int64_t code) -> int64_t { std::_Exit(static_cast<int>(code)); });
  registerFunction("whoami", [] { return getWorkerInfo().name; });
  return true;
}();

Tensor sample(DType dtype, const Shape& shape) {
  Tensor t = arange(0, static_cast<double>(shapeNumel(shape)), 1, {.dtype = DType::Float64});
  return t.to(dtype).reshape(shape).contiguous();
}

TEST(RpcAgent, SyncAndAsyncCallsCarryEveryKindOfValue) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    std::string bad;
    if (rpcSync<int64_t>("w1", "add", 40, 2) != 42) bad += "add; ";
    if (rpcSync<std::string>("w1", "whoami") != "w1") bad += "whoami; ";
    if (rpcSync<std::string>("w0", "whoami") != "w0") bad += "call to self; ";
    std::string c = rpcSync<std::string>("w1", "concat", std::vector<std::string>{"a", "b"},
                                         std::map<std::string, int64_t>{{"x", 1}, {"y", 2}});
    if (c != "ab|x=1|y=2") bad += "concat gave " + c + "; ";
    // Tensors of every dtype, empty and not, echoed back equal.
    for (int d = 0; d < kNumDTypes; ++d) {
      for (const Shape& shape : {Shape{0}, Shape{}, Shape{3, 5}, Shape{1000}}) {
        Tensor t = sample(static_cast<DType>(d), shape);
        Value back = rpcSync("w1", "echo", t);
        if (!(back == Value(t))) bad += fmt::format("echo {} {}; ", dtypeName(t.dtype()), shapeStr(shape));
      }
    }
    // 64 MiB each way, and nested values.
    Tensor big = sample(DType::Float32, {16, 1024, 1024});
    if (rpcSync<int64_t>("w1", "nbytes", big) != int64_t{64} << 20) bad += "nbytes of 64 MiB; ";
    if (!(rpcSync<Tensor>("w1", "echo", big).toVector<float>() == big.toVector<float>())) bad += "echo of 64 MiB; ";
    Value nested(List{Value(Dict{{"t", Value(sample(DType::BFloat16, {2, 2}))}}), Value(List{Value(true), Value()})});
    if (!(rpcSync("w1", "echo", nested) == nested)) bad += "nested; ";
    // Async calls and chained futures.
    std::vector<Future<int64_t>> fs;
    for (int i = 0; i < 100; ++i) fs.push_back(rpcAsync<int64_t>("w1", "add", i, 1000));
    Future<int64_t> chained = rpcAsync<int64_t>("w1", "add", 1, 2)
                                  .then([](Future<int64_t> f) { return rpcAsync<int64_t>("w1", "add", f.value(), 10); })
                                  .then([](Future<int64_t> f) { return f.value() * 2; });
    for (int i = 0; i < 100; ++i) {
      if (fs[i].value() != i + 1000) bad += fmt::format("async {}; ", i);
    }
    if (chained.value() != 26) bad += fmt::format("chained gave {}; ", chained.value());
    // docs/thread_model.md: callbacks never run on a transport thread — a callback attached before
    // the response arrives runs on the agent's pool (rpcSync, with no callback, is completed
    // straight from the transport thread).
    for (int i = 0; i < 20; ++i) {
      Future<std::string> where = rpcAsync<int64_t>("w1", "sleep_ms", 2).then([](Future<int64_t> f) {
        f.wait();
        char name[16] = {};
        pthread_getname_np(pthread_self(), name, sizeof name);
        return std::string(name);
      });
      if (where.value() != ThreadPool::kThreadName)
        bad += fmt::format("a callback ran on thread '{}'; ", where.value());
    }
    auto agent = std::dynamic_pointer_cast<TensorPipeAgent>(currentAgent());
    if (!agent || agent->transportTo(1) != "shm") bad += "the peer on this host is not reached over shm; ";
    return bad.empty() ? "ok" : bad;
  });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
}

TEST(RpcAgent, RemoteExceptionsAndBadCallsComeBackAsRpcErrors) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    std::string out;
    out += errorOf([] { rpcSync<int64_t>("w1", "fail", 7); }) + "\n";
    out += errorOf([] { rpcSync<int64_t>("w1", "nope", 7); }) + "\n";
    out += errorOf([] { rpcSync<int64_t>("w1", "add", 1, "two"); }) + "\n";
    out += errorOf([] { rpcSync<int64_t>("w1", "add", 1); }) + "\n";
    out += errorOf([] { rpcSync<std::string>("w1", "add", 1, 2); }) + "\n";
    out += errorOf([] { rpcSync<int64_t>("nobody", "add", 1, 2); }) + "\n";
    // The agent carries on.
    out += std::to_string(rpcSync<int64_t>("w1", "add", 2, 3));
    return out;
  });
  std::vector<std::string> lines;
  std::stringstream ss(reports[0]);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 7u) << reports[0];
  EXPECT_EQ(lines[0], "RpcError: rpc 'fail' on worker 'w1' raised ValueError: bad input 7");
  EXPECT_EQ(lines[1], "RpcError: rpc 'nope' on worker 'w1' raised RpcError: no function named 'nope' is registered");
  EXPECT_EQ(lines[2], "RpcError: rpc 'add' on worker 'w1' raised RpcError: 'add' (int64, int64) -> int64: argument 2: "
                      "expected int64, got string of 3 bytes");
  EXPECT_EQ(lines[3], "RpcError: rpc 'add' on worker 'w1' raised RpcError: 'add' (int64, int64) -> int64 takes 2 "
                      "arguments, got 1");
  EXPECT_EQ(lines[4], "RpcError: result of 'add': expected string, got int64 3");
  EXPECT_EQ(lines[5], "RpcError: no RPC worker is named 'nobody'");
  EXPECT_EQ(lines[6], "5");
  EXPECT_EQ(reports[1], "ok");
}

TEST(RpcAgent, TimedOutCallsFailAndTheAgentCarriesOn) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    std::string e = errorOf([] { rpcSync<int64_t>(Timeout{Millis(200)}, "w1", "sleep_ms", 1000); });
    if (e != "RpcTimeoutError: rpc 'sleep_ms' to worker 'w1' (rank 1) timed out after 200 ms") return "timeout: " + e;
    if (currentAgent()->pendingCalls() != 0) return "the timed-out call is still pending";
    if (rpcSync<int64_t>("w1", "add", 1, 1) != 2) return "no call after the timeout";
    // A short deadline behind a long one: the timer, asleep until the 20 s call's deadline (after
    // its idle tick of at most 1 s), must be woken for the 150 ms one. Unwoken, the short call
    // would succeed after 1.5 s instead.
    auto slow = rpcAsync<int64_t>(Timeout{Millis(20'000)}, "w1", "sleep_ms", 2000);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    e = errorOf([] { rpcSync<int64_t>(Timeout{Millis(150)}, "w1", "sleep_ms", 1500); });
    if (e.find("timed out after 150 ms") == std::string::npos) return "a short timeout behind a long one: " + e;
    if (slow.isCompleted()) return "the 150 ms timeout fired only after the 2 s call had finished";
    return slow.value() == 2000 ? "ok" : "the long call failed";
  });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
}

TEST(RpcAgent, ADeadPeerFailsItsPendingCallsByNameAndOthersContinue) {
  auto reports = runWorkers(
      3,
      [](int rank) -> std::string {
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by w0's call first
          return "w1 survived";
        }
        if (rank == 2) {
          // Serves w0 until w0 is done, then leaves without the barrier (w1 will never arrive).
          currentAgent()->options().store->wait({"w0-done"}, Millis(30'000));
          shutdown(false);
          return "ok";
        }
        auto slow = rpcAsync<int64_t>("w1", "sleep_ms", 20'000);
        auto dying = rpcAsync<int64_t>("w1", "die", 3);
        std::string e1 = errorOf([&] { slow.wait(std::chrono::seconds(15)); });
        std::string e2 = errorOf([&] { dying.wait(std::chrono::seconds(15)); });
        std::string e3 = errorOf([] { rpcSync<int64_t>("w1", "add", 1, 2); });
        int64_t other = rpcSync<int64_t>("w2", "add", 1, 2);
        currentAgent()->options().store->set("w0-done", std::string("1"));
        shutdown(false);
        return e1 + "\n" + e2 + "\n" + e3 + "\n" + std::to_string(other);
      },
      {}, std::chrono::seconds(60));
  std::vector<std::string> lines;
  std::stringstream ss(reports[0]);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u) << reports[0];
  EXPECT_EQ(lines[0].rfind("RpcError: rpc 'sleep_ms' to worker 'w1' (rank 1) failed: the connection to 'w1' broke", 0),
            0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("RpcError: rpc 'die' to worker 'w1' (rank 1) failed: the connection to 'w1' broke", 0), 0u)
      << lines[1];
  EXPECT_EQ(lines[2].rfind("RpcError: rpc 'add' to worker 'w1' (rank 1) failed: the connection to 'w1' broke", 0), 0u)
      << lines[2];
  EXPECT_EQ(lines[3], "3");
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcAgent, GracefulShutdownWaitsForCallsInFlight) {
  auto reports = runWorkers(2, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    auto f = rpcAsync<int64_t>("w1", "sleep_ms", 300);
    shutdown();  // returns only once the call was answered and w1 arrived
    if (!f.isCompleted()) return "shutdown returned with the call pending";
    return f.value() == 300 ? "ok" : "wrong result";
  });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
}

// A worker that arrives at shutdown after the others' shutdownTimeout: they leave with a
// TimeoutError naming it (not the store's key-level message), and it still shuts down.
TEST(RpcAgent, AShutdownBarrierPastItsTimeoutNamesTheLateWorker) {
  auto reports = runWorkers(
      3,
      [](int rank) -> std::string {
        if (rank == 2) usleep(2'500'000);  // busy past the others' shutdown timeout
        if (rank == 2) return "ok";
        try {
          shutdown();
        } catch (const TimeoutError& e) {
          return e.what();
        }
        return "no error";
      },
      [](int rank, RpcOptions& o) {
        if (rank != 2) o.shutdownTimeout = Millis(500);
      });
  for (int r : {0, 1})
    EXPECT_EQ(reports[r], fmt::format("rpc shutdown on worker 'w{}': 'w2' (rank 2) did not reach shutdown within 500 "
                                      "ms (RpcOptions::shutdownTimeout); this worker leaves without waiting longer, "
                                      "and calls to it from those still running will fail",
                                      r))
        << "rank " << r;
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcAgent, AWrongSharedSecretIsRefused) {
  auto reports = runWorkers(
      3,
      [](int rank) -> std::string {
        if (rank == 1) return "ok";
        std::string e = errorOf([] { rpcSync<int64_t>("w1", "add", 1, 2); });
        if (rank == 2) return e.empty() ? "ok" : "the right secret was refused: " + e;
        return e;
      },
      [](int rank, RpcOptions& o) { o.secret = rank == 0 ? "intruder" : "s3cret"; });
  EXPECT_EQ(reports[0], "RpcError: rpc 'add' to worker 'w1' (rank 1) failed: worker 'w1' refused the connection: "
                        "worker 'w0' presented the wrong shared secret");
  EXPECT_EQ(reports[1], "ok");
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcAgent, MalformedFramesAreRefusedAndTheAgentServesOthers) {
  auto reports = runWorkers(3, [](int rank) -> std::string {
    if (rank == 1) return "ok";
    if (rank == 2) {
      currentAgent()->options().store->wait({"garbage-sent"}, Millis(30'000));
      return rpcSync<int64_t>("w1", "add", 2, 2) == 4 ? "ok" : "w1 stopped serving";
    }
    auto agent = std::dynamic_pointer_cast<TensorPipeAgent>(currentAgent());
    auto first = rpcAsync<int64_t>(Timeout{Millis(20'000)}, "w1", "sleep_ms", 500);  // opens the pipe
    agent->transmitRawForTesting(1, std::string("CRPC") + static_cast<char>(kWireVersion) +
                                        "\x02");  // cut after the frame kind
    std::string e = errorOf([&] { first.wait(std::chrono::seconds(15)); });
    currentAgent()->options().store->set("garbage-sent", std::string("1"));
    return e;
  });
  EXPECT_EQ(reports[0].rfind("RpcError: rpc 'sleep_ms' to worker 'w1' (rank 1) failed: worker 'w1' refused the "
                             "connection: a malformed message arrived: malformed RPC frame at byte 6: truncated: the "
                             "op needs 1 bytes, 0 left",
                             0),
            0u)
      << reports[0];
  EXPECT_EQ(reports[1], "ok");
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcAgent, TcpCarriesCallsWhenShmIsOff) {
  auto reports = runWorkers(
      2,
      [](int rank) -> std::string {
        if (rank == 1) return "ok";
        auto agent = std::dynamic_pointer_cast<TensorPipeAgent>(currentAgent());
        if (agent->transportTo(1) != "uv") return "not over uv";
        Tensor t = arange(0, 1000, 1, {.dtype = DType::Int32});
        Value back = rpcSync("w1", "echo", t);
        return back == Value(t) && rpcSync<int64_t>("w1", "add", 2, 5) == 7 ? "ok" : "wrong results over uv";
      },
      [](int, RpcOptions& o) { o.useShm = false; });
  EXPECT_EQ(reports[0], "ok");
  EXPECT_EQ(reports[1], "ok");
}

TEST(RpcAgent, TheEnvironmentChoosesTheTransportOverTheOptions) {
  // COHORT_RPC_SHM=0 turns the busy-polling shared-memory transport off for a program that asked
  // for it, =1 on for one that did not; a value that is neither fails init naming the variable.
  for (bool shm : {false, true}) {
    auto reports = runWorkers(
        2,
        [shm](int rank) -> std::string {
          auto agent = std::dynamic_pointer_cast<TensorPipeAgent>(currentAgent());
          const std::string want = shm ? "shm" : "uv", got = agent->transportTo(1 - rank);
          if (got != want) return fmt::format("reached over {}, not {}", got, want);
          return rpcSync<int64_t>(workerName(1 - rank), "add", 2, 5) == 7 ? "ok" : "wrong result";
        },
        [shm](int, RpcOptions& o) {
          o.useShm = !shm;  // the environment says the opposite
          setenv("COHORT_RPC_SHM", shm ? "1" : "0", 1);
        });
    EXPECT_EQ(reports[0], "ok") << "COHORT_RPC_SHM=" << shm;
    EXPECT_EQ(reports[1], "ok") << "COHORT_RPC_SHM=" << shm;
  }
  auto bad = runWorkers(
      1, [](int) -> std::string { return "ok"; }, [](int, RpcOptions&) { setenv("COHORT_RPC_SHM", "sometimes", 1); });
  EXPECT_EQ(bad[0].rfind("exception: ", 0), 0u) << bad[0];
  EXPECT_NE(bad[0].find("COHORT_RPC_SHM"), std::string::npos) << bad[0];
}

TEST(RpcAgent, MessagesOverTheLimitsAreRefused) {
  auto reports = runWorkers(
      2,
      [](int rank) -> std::string {
        if (rank == 1) return "ok";
        // The sender's own limit: refused before anything is sent, the pipe stays usable.
        std::string own =
            errorOf([] { rpcSync<int64_t>("w1", "nbytes", zeros({1 << 20}, {.dtype = DType::Float64})); });
        int64_t small = rpcSync<int64_t>("w1", "nbytes", zeros({4}));
        return own + "|" + std::to_string(small);
      },
      [](int /*rank*/, RpcOptions& o) { o.limits.maxTensorBytes = size_t{4} << 20; });
  EXPECT_EQ(reports[0],
            "RpcError: rpc 'nbytes' to worker 'w1' (rank 1) failed: the message's 1 tensors (8388608 bytes) "
            "exceed the limits (65536 tensors, 4194304 bytes)|16");
  EXPECT_EQ(reports[1], "ok");

  reports = runWorkers(
      2,
      [](int rank) -> std::string {
        if (rank == 1) return "ok";
        return errorOf([] { rpcSync<int64_t>("w1", "nbytes", zeros({1 << 20})); });
      },
      [](int rank, RpcOptions& o) {
        if (rank == 1) o.limits.maxTensorBytes = size_t{1} << 20;
      });
  EXPECT_EQ(reports[0], "RpcError: rpc 'nbytes' to worker 'w1' (rank 1) failed: worker 'w1' refused the connection: "
                        "a malformed message arrived: RPC message tensors exceed the limit of 1048576 bytes");
  EXPECT_EQ(reports[1], "ok");
}

// The cross-memory channel (rpc/tensorpipe/detail/parallel_cma.h): tensors of sizes around every edge
// (inline copy, one chunk, split in chunks not a multiple of a page) arrive byte for byte, in
// order, with many in flight at once, whether one thread or three read them; the receiver's
// counters show they took that path, and split exactly when they should.
const bool kCmaRegistered = [] {
  registerFunction("cma_stats", [] {
    CmaStats s = cmaStats();
    return std::vector<int64_t>{static_cast<int64_t>(s.tensors), static_cast<int64_t>(s.bytes),
                                static_cast<int64_t>(s.splitTensors)};
  });
  return true;
}();

Tensor bytePattern(int64_t n, int salt) {
  Tensor t = empty({n}, {.dtype = DType::UInt8});
  uint8_t* p = t.data<uint8_t>();
  // No period a chunk edge could hide in.
  for (int64_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>((static_cast<uint64_t>(i + salt) * 0x9E3779B97F4A7C15ull) >> 56);
  return t;
}

TEST(RpcAgent, CrossMemoryTensorsArriveWholeAtEverySplit) {
  const std::vector<int64_t> sizes = {
      1, 4095, (64 << 10) - 1, 64 << 10, 1 << 20, (2 << 20) - 1, (2 << 20) + 3, (9 << 20) + 1, (33 << 20) + 7};
  for (int threads : {1, 3}) {
    SCOPED_TRACE(fmt::format("copyThreads {}", threads));
    auto reports = runWorkers(
        2,
        [&](int rank) -> std::string {
          if (rank == 1) return "ok";
          std::string bad;
          auto before = rpcSync<std::vector<int64_t>>("w1", "cma_stats");
          // One at a time, then all in flight at once (small ones finish copying before the
          // large ones posted earlier, and must still complete in order).
          int64_t sent = 0, split = 0, count = 0;
          for (int64_t n : sizes) {
            Tensor t = bytePattern(n, static_cast<int>(n));
            Tensor back = rpcSync<Tensor>("w1", "echo", t);
            if (!(Value(back) == Value(t))) bad += fmt::format("echo of {} bytes differs; ", n);
          }
          std::vector<Tensor> ts;
          std::vector<Future<Tensor>> fs;
          for (int round = 0; round < 3; ++round) {
            for (int64_t n : sizes) {
              ts.push_back(bytePattern(n, round));
              fs.push_back(rpcAsync<Tensor>("w1", "echo", ts.back()));
            }
          }
          for (size_t i = 0; i < fs.size(); ++i) {
            if (!(Value(fs[i].value()) == Value(ts[i]))) bad += fmt::format("async echo {} differs; ", i);
          }
          for (int rep = 0; rep < 4; ++rep) {
            for (int64_t n : sizes) {
              sent += n;
              ++count;
              // A tensor is split when it holds two chunks and there are threads to read them.
              if (threads > 1 && n >= int64_t{2} * static_cast<int64_t>(kMinChunkBytes)) ++split;
            }
          }
          auto after = rpcSync<std::vector<int64_t>>("w1", "cma_stats");
          if (after[0] - before[0] != count)
            bad += fmt::format("{} tensors came by cma, not {}; ", after[0] - before[0], count);
          if (after[1] - before[1] != sent)
            bad += fmt::format("{} bytes came by cma, not {}; ", after[1] - before[1], sent);
          if (after[2] - before[2] != split) bad += fmt::format("{} were split, not {}; ", after[2] - before[2], split);
          // And the echoes came back to this worker the same way.
          if (cmaStats().tensors < static_cast<uint64_t>(count)) bad += "the echoes did not come back by cma; ";
          return bad.empty() ? "ok" : bad;
        },
        [threads](int, RpcOptions& o) { o.copyThreads = threads; });
    EXPECT_EQ(reports[0], "ok");
    EXPECT_EQ(reports[1], "ok");
  }
}

// A sender that dies while its tensors are being read out of its memory: the receiver's reads fail
// (the pid is gone) or its pipe breaks; either way it stays up, serves a third worker's large
// tensors correctly, and a call back to the dead worker fails naming it.
TEST(RpcAgent, ASenderDyingMidTensorLeavesTheReceiverServingOthers) {
  auto reports = runWorkers(
      3,
      [](int rank) -> std::string {
        auto store = currentAgent()->options().store;
        if (rank == 0) {
          std::vector<Tensor> ts;
          std::vector<Future<int64_t>> fs;
          for (int i = 0; i < 16; ++i) ts.push_back(bytePattern(int64_t{32} << 20, i));
          for (const Tensor& t : ts) fs.push_back(rpcAsync<int64_t>("w1", "nbytes", t));
          fs[0].wait(std::chrono::seconds(20));  // the next ones are being read now
          store->set("w0-sent", std::string("1"));
          std::_Exit(0);  // with reads of its memory under way
        }
        if (rank == 2) {
          store->wait({"w0-sent"}, Millis(30'000));
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::string bad;
          for (int i = 0; i < 4; ++i) {
            Tensor t = bytePattern((int64_t{16} << 20) + i, i);
            if (!(Value(rpcSync<Tensor>("w1", "echo", t)) == Value(t))) bad += fmt::format("echo {} differs; ", i);
          }
          store->set("w2-done", std::string("1"));
          shutdown(false);
          return bad.empty() ? "ok" : bad;
        }
        store->wait({"w2-done"}, Millis(30'000));
        std::string e = errorOf([] { rpcSync<int64_t>(Timeout{Millis(5'000)}, "w0", "add", 1, 2); });
        shutdown(false);
        return e.find("worker 'w0'") != std::string::npos ? "ok" : "calling the dead w0 gave: " + e;
      },
      [](int, RpcOptions& o) { o.copyThreads = 2; });
  EXPECT_EQ(reports[0], "");  // it exited before reporting
  EXPECT_EQ(reports[1], "ok");
  EXPECT_EQ(reports[2], "ok");
}

TEST(RpcOptionsCheck, CopyThreadsOutsideItsRangeIsAValueErrorNamingIt) {
  for (int bad : {-1, 65}) {
    RpcOptions o;
    o.copyThreads = bad;
    try {
      TensorPipeAgent agent("w0", 0, 1, o);
      ADD_FAILURE() << "copyThreads " << bad << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("copyThreads"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cohort::rpc
