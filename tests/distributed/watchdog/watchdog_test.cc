// The communicator watchdog (distributed/watchdog/) through ProcessGroup on the "fake" backend:
// the CPU fake communicator, ranks as threads, with faults injected at op k on chosen ranks. The
// same watchdog and backend code serve NCCL, so this is NCCL's failure handling, tested without
// a GPU: a hang names the op, its sequence number and the ranks that never arrived, on every
// rank, within the timeout; an asynchronous error aborts every rank; the flight recorders are
// dumped before anything is aborted; a straggler inside the timeout is no error; the process is
// killed only when asked. The fake's collectives themselves are checked against the reference
// first (they are also how the backend maps every op, at sizes NCCL cannot be tested at here).
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/distributed/watchdog/fake_backend.h>

#include "harness/ranks.h"
#include "harness/world.h"

namespace cohort::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<int> ranksOf(int n) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(i);
  return r;
}

// `size` ranks as threads on the "fake" backend, in a group of a fresh name, with `faults`.
struct FakeGroup {
  FakeGroup(int size, Millis timeout, FakeCommOptions opts = {}) {
    static std::atomic<int> counter{0};
    name = fmt::format("fake{}_{}", ::getpid(), counter++);
    store = std::make_shared<HashStore>(Millis(30'000));
    setFakeCommOptions(name, std::move(opts));
    pgs.resize(static_cast<size_t>(size));
    ::cohort::testing::runOnThreads(ranksOf(size), [&](int r) {
      ProcessGroupOptions o;
      o.backend = "fake";
      o.name = name;
      o.timeout = timeout;
      pgs[r] = ProcessGroup::create(store, r, size, o);
    });
    clearFakeCommOptions(name);
  }
  ~FakeGroup() {
    try {
      ::cohort::testing::runOnThreads(ranksOf(size()), [&](int r) { pgs[r].reset(); });
    } catch (...) {
    }
  }
  int size() const { return static_cast<int>(pgs.size()); }
  void run(const std::function<void(int)>& fn) { ::cohort::testing::runOnThreads(ranksOf(size()), fn); }

  std::string name;
  std::shared_ptr<HashStore> store;
  std::vector<std::shared_ptr<ProcessGroup>> pgs;
};

// How a wait ended on one rank.
struct Outcome {
  std::string kind = "none";  // "TimeoutError", "DistError" (not a timeout), "other", "none"
  std::string message;
  double seconds = 0;
};
Outcome outcomeOf(const std::function<void()>& fn) {
  Outcome o;
  const auto start = Clock::now();
  try {
    fn();
  } catch (const TimeoutError& e) {
    o.kind = "TimeoutError", o.message = e.what();
  } catch (const DistError& e) {
    o.kind = "DistError", o.message = e.what();
  } catch (const std::exception& e) {
    o.kind = "other", o.message = e.what();
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return o;
}

// The message names `rank` in a list: "[2]", "[0, 2]".
bool namesRank(const std::string& msg, int rank) {
  return std::regex_search(msg, std::regex(fmt::format(R"(\[(\d+, )*{}[,\]])", rank)));
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Tensor filledWith(int64_t n, double v) { return full({n}, v); }

// ---- the process is killed only when asked -------------------------------------------------
// First in the file: it forks, and a child of a process with few threads is the safest.

TEST(Watchdog, KillsTheProcessOnlyWhenAsked) {
  EXPECT_FALSE(watchdogKillFromEnv()) << "COHORT_WATCHDOG_KILL must default to off";
  ::cohort::testing::RankOptions o;
  o.limit = 60s;
  auto results = ::cohort::testing::runRanks(
      1,
      [](int, std::ostream& report) {
        ::setenv("COHORT_WATCHDOG_KILL", "1", 1);
        FakeCommOptions faults;
        faults.faults.push_back({FakeFault::Kind::Hang, 2, {1}, Millis(0)});
        FakeGroup g(2, Millis(300), faults);
        g.run([&](int r) {
          Tensor t = ones({4});
          g.pgs[r]->allreduce(t)->wait();
          g.pgs[r]->allreduce(t)->wait();
        });
        report << "the hang did not end the process";
        return 0;
      },
      o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), -SIGABRT) << results[0].describe() << ": " << results[0].report;
}

// ---- the fake communicator moves the right bytes -----------------------------------------------

TEST(FakeBackend, EveryOpMatchesTheReference) {
  constexpr int kSize = 3;
  FakeGroup g(kSize, Millis(30'000));
  g.run([&](int r) {
    ProcessGroup& pg = *g.pgs[r];
    auto expectAll = [&](const Tensor& t, double want, const std::string& what) {
      const double lo = t.numel() ? t.min().item<double>() : want, hi = t.numel() ? t.max().item<double>() : want;
      if (lo != want || hi != want) {
        throw std::runtime_error(fmt::format("{}: got {} .. {}, want {}", what, lo, hi, want));
      }
    };
    Tensor a = filledWith(1000, r + 1);
    pg.allreduce(a)->wait();
    expectAll(a, 6, "allreduce sum");
    Tensor m = filledWith(7, r + 1);
    pg.allreduce(m, {.op = ReduceOp::Max})->wait();
    expectAll(m, 3, "allreduce max");
    Tensor avg = filledWith(5, 3 * r);
    pg.allreduce(avg, {.op = ReduceOp::Avg})->wait();
    expectAll(avg, 3, "allreduce avg");
    std::vector<Tensor> bucket{filledWith(3, r), filledWith(0, r), filledWith(9, 2 * r)};
    pg.allreduceCoalesced(bucket)->wait();
    expectAll(bucket[0], 3, "coalesced 0");
    expectAll(bucket[2], 6, "coalesced 2");
    Tensor b = filledWith(10, r == 1 ? 42 : -1);
    pg.broadcast(b, {.root = 1})->wait();
    expectAll(b, 42, "broadcast");
    Tensor red = filledWith(10, r + 1);
    pg.reduce(red, {.op = ReduceOp::Product, .root = 2})->wait();
    if (r == 2) expectAll(red, 6, "reduce product at the root");
    std::vector<Tensor> outs;
    for (int i = 0; i < kSize; ++i) outs.push_back(zeros({4}));
    pg.allgather(outs, filledWith(4, 10 + r))->wait();
    for (int i = 0; i < kSize; ++i) expectAll(outs[i], 10 + i, fmt::format("allgather {}", i));
    Tensor gathered = zeros({4 * kSize});
    pg.allgatherIntoTensor(gathered, filledWith(4, 10 + r))->wait();
    for (int i = 0; i < kSize; ++i) expectAll(gathered.slice(0, 4 * i, 4 * i + 4), 10 + i, "allgatherIntoTensor");
    std::vector<Tensor> ins;
    for (int i = 0; i < kSize; ++i) ins.push_back(filledWith(5, 100 * i + r));
    Tensor rs = zeros({5});
    pg.reduceScatter(rs, ins)->wait();
    expectAll(rs, 300 * r + 3, "reduceScatter");
    Tensor rsIn = cat({filledWith(2, r), filledWith(2, 10 * r), filledWith(2, 100 * r)}, 0);
    Tensor rsOut = zeros({2});
    pg.reduceScatterTensor(rsOut, rsIn)->wait();
    expectAll(rsOut, std::pow(10, r) * 3, "reduceScatterTensor");
    // alltoall: rank r sends value 10 * r + dst to each dst.
    Tensor aIn = cat({filledWith(2, 10 * r), filledWith(2, 10 * r + 1), filledWith(2, 10 * r + 2)}, 0);
    Tensor aOut = zeros({6});
    pg.alltoall(aOut, aIn)->wait();
    for (int src = 0; src < kSize; ++src) expectAll(aOut.slice(0, 2 * src, 2 * src + 2), 10 * src + r, "alltoall");
    // uneven: rank r sends (dst + 1) rows to dst; receives (r + 1) rows from every rank.
    std::vector<Tensor> parts;
    std::vector<int64_t> inSplits, outSplits;
    for (int dst = 0; dst < kSize; ++dst) {
      parts.push_back(filledWith(dst + 1, 10 * r + dst));
      inSplits.push_back(dst + 1);
      outSplits.push_back(r + 1);
    }
    Tensor vOut = zeros({(r + 1) * kSize});
    pg.alltoall(vOut, cat(parts, 0), {.outputSplitSizes = outSplits, .inputSplitSizes = inSplits})->wait();
    for (int src = 0; src < kSize; ++src) {
      expectAll(vOut.slice(0, (r + 1) * src, (r + 1) * (src + 1)), 10 * src + r, "alltoallV");
    }
    std::vector<Tensor> lIn, lOut;
    for (int dst = 0; dst < kSize; ++dst) {
      lIn.push_back(filledWith(3, 10 * r + dst));
      lOut.push_back(zeros({3}));
    }
    pg.alltoallList(lOut, lIn)->wait();
    for (int src = 0; src < kSize; ++src) expectAll(lOut[src], 10 * src + r, "alltoallList");
    std::vector<Tensor> gOut;
    if (r == 0)
      for (int i = 0; i < kSize; ++i) gOut.push_back(zeros({2}));
    pg.gather(gOut, filledWith(2, r + 5))->wait();
    if (r == 0)
      for (int i = 0; i < kSize; ++i) expectAll(gOut[i], i + 5, "gather");
    std::vector<Tensor> sIn;
    if (r == 1)
      for (int i = 0; i < kSize; ++i) sIn.push_back(filledWith(2, 7 * i));
    Tensor sOut = zeros({2});
    pg.scatter(sOut, sIn, {.root = 1})->wait();
    expectAll(sOut, 7 * r, "scatter");
    pg.barrier()->wait();
    // A ring of sends and receives, issued send first on every rank.
    Tensor msg = filledWith(6, r);
    Tensor got = zeros({6});
    auto s = pg.send(msg, (r + 1) % kSize);
    auto v = pg.recv(got, (r + kSize - 1) % kSize);
    s->wait();
    v->wait();
    expectAll(got, (r + kSize - 1) % kSize, "recv");
    // Integer, half and bool reductions go through the CPU backends' kernels.
    Tensor ints = full({4}, r + 1, {.dtype = DType::Int64});
    pg.allreduce(ints, {.op = ReduceOp::Product})->wait();
    expectAll(ints, 6, "int64 product");
    Tensor halves = full({4}, 0.5 * (r + 1), {.dtype = DType::BFloat16});
    pg.allreduce(halves)->wait();
    expectAll(halves, 3, "bfloat16 sum");
    Tensor flags = full({4}, r == 2 ? 1 : 0, {.dtype = DType::Bool});
    pg.allreduce(flags, {.op = ReduceOp::Max})->wait();
    expectAll(flags.to(DType::Float32), 1, "bool or");
  });
  // Every op completed and was recorded with its sequence number.
  for (int r = 0; r < kSize; ++r) {
    for (const auto& e : g.pgs[r]->flightRecorder().entries()) {
      EXPECT_EQ(e.state, FlightRecorder::State::Completed) << "rank " << r << " " << e.op << " #" << e.seq;
    }
  }
}

// ---- a hang ---------------------------------------------------------------------------------

TEST(Watchdog, HangAtOpKIsNamedOnEveryRankWithTheMissingRank) {
  constexpr int kSize = 4, kHung = 2;
  constexpr uint64_t kOp = 3;
  constexpr auto kTimeout = Millis(1500);
  // What each rank's abort found on disk: the flight recorders must be dumped before the abort.
  std::mutex mu;
  std::vector<std::string> seenAtAbort(kSize);
  std::string groupName;
  FakeCommOptions faults;
  faults.faults.push_back({FakeFault::Kind::Hang, kOp, {kHung}, Millis(0)});
  faults.onAbort = [&](int rank) {
    const std::string path = flightRecorderDumpPath();
    std::lock_guard<std::mutex> lock(mu);
    seenAtAbort[rank] = std::filesystem::exists(path) ? readFile(path) : "(no dump file at " + path + ")";
  };
  std::filesystem::remove(flightRecorderDumpPath());
  FakeGroup g(kSize, kTimeout, faults);
  groupName = g.name;
  std::vector<Outcome> outcomes(kSize), later(kSize);
  g.run([&](int r) {
    Tensor t = ones({1000});
    for (uint64_t k = 1; k < kOp; ++k) g.pgs[r]->allreduce(t)->wait();
    outcomes[r] = outcomeOf([&] { g.pgs[r]->allreduce(t)->wait(); });
    later[r] = outcomeOf([&] { g.pgs[r]->allreduce(t)->wait(); });
  });
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const Outcome& o = outcomes[r];
    EXPECT_EQ(o.kind, "TimeoutError") << o.message;
    EXPECT_NE(o.message.find(fmt::format("allreduce #{} in group '{}'", kOp, g.name)), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("never arrived at it"), std::string::npos) << o.message;
    EXPECT_TRUE(namesRank(o.message, kHung)) << o.message;
    EXPECT_FALSE(namesRank(o.message, r == 0 ? 1 : 0)) << "a rank that arrived is named: " << o.message;
    // Within the timeout (from the op's issue), plus the diagnosis and the scheduling slack.
    EXPECT_LT(o.seconds, kTimeout.count() / 1000.0 + 2.5) << o.message;
    // Every later op fails at once, naming itself and the cause.
    EXPECT_EQ(later[r].kind, "TimeoutError") << later[r].message;
    EXPECT_LT(later[r].seconds, 0.5);
    EXPECT_NE(later[r].message.find(fmt::format("allreduce #{} in group '{}'", kOp + 1, g.name)), std::string::npos)
        << later[r].message;
    // The dump was on disk, with this op, before the communicator was aborted.
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(seenAtAbort[r].find(fmt::format("\"group\": \"{}\"", g.name)), std::string::npos)
        << seenAtAbort[r].substr(0, 2000);
    EXPECT_NE(seenAtAbort[r].find(fmt::format("\"seq\": {}, \"op\": \"allreduce\"", kOp)), std::string::npos)
        << seenAtAbort[r].substr(0, 2000);
  }
}

// A rank that never issues op k (stuck on the host) is named too, with how far it got; when it
// issues the op later, the op fails at once: the others' abort reached it through the store.
TEST(Watchdog, RankThatNeverIssuesTheOpIsNamedAndFailsWhenItDoes) {
  constexpr int kSize = 3, kLate = 1;
  constexpr auto kTimeout = Millis(800);
  FakeGroup g(kSize, kTimeout);
  std::vector<Outcome> outcomes(kSize);
  g.run([&](int r) {
    Tensor t = ones({10});
    g.pgs[r]->allreduce(t)->wait();
    if (r == kLate) std::this_thread::sleep_for(kTimeout + 2500ms);
    outcomes[r] = outcomeOf([&] { g.pgs[r]->allreduce(t)->wait(); });
  });
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    EXPECT_EQ(outcomes[r].kind, "TimeoutError") << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find(fmt::format("allreduce #2 in group '{}'", g.name)), std::string::npos)
        << outcomes[r].message;
    EXPECT_TRUE(namesRank(outcomes[r].message, kLate)) << outcomes[r].message;
    if (r != kLate) {
      EXPECT_NE(outcomes[r].message.find("issued up to #1"), std::string::npos) << outcomes[r].message;
    }
  }
  EXPECT_LT(outcomes[kLate].seconds, 0.5) << "the late rank's op should fail at once";
}

// ---- an asynchronous error ------------------------------------------------------------------

TEST(Watchdog, AsyncErrorAbortsEveryRank) {
  constexpr int kSize = 3, kBroken = 1;
  constexpr uint64_t kOp = 2;
  constexpr auto kTimeout = Millis(60'000);  // far away: the error must not wait for it
  std::atomic<int> aborts{0};
  FakeCommOptions faults;
  faults.faults.push_back({FakeFault::Kind::Fail, kOp, {kBroken}, Millis(0)});
  faults.onAbort = [&](int) { ++aborts; };
  FakeGroup g(kSize, kTimeout, faults);
  std::vector<Outcome> outcomes(kSize), later(kSize);
  g.run([&](int r) {
    Tensor t = ones({100});
    g.pgs[r]->allreduce(t)->wait();
    outcomes[r] = outcomeOf([&] { g.pgs[r]->allreduce(t)->wait(); });
    later[r] = outcomeOf([&] { g.pgs[r]->broadcast(t)->wait(); });
  });
  EXPECT_EQ(aborts.load(), kSize) << "every rank aborts its communicator";
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const Outcome& o = outcomes[r];
    EXPECT_EQ(o.kind, "DistError") << o.message;
    EXPECT_LT(o.seconds, 5.0) << o.message;
    EXPECT_NE(o.message.find(fmt::format("allreduce #{} in group '{}'", kOp, g.name)), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("injected failure at op 2"), std::string::npos) << o.message;
    if (r != kBroken) {
      EXPECT_NE(o.message.find(fmt::format("rank {} of group '{}' aborted its communicator", kBroken, g.name)),
                std::string::npos)
          << o.message;
    }
    EXPECT_EQ(later[r].kind, "DistError") << later[r].message;
    EXPECT_LT(later[r].seconds, 0.5);
  }
}

// ---- a straggler inside the timeout ----------------------------------------------------------

TEST(Watchdog, StragglerWithinTheTimeoutSucceeds) {
  constexpr int kSize = 3;
  FakeCommOptions faults;
  faults.faults.push_back({FakeFault::Kind::Straggle, 2, {0}, Millis(400)});
  faults.faults.push_back({FakeFault::Kind::Straggle, 3, {2}, Millis(300)});
  FakeGroup g(kSize, Millis(2000), faults);
  std::vector<Outcome> outcomes(kSize);
  g.run([&](int r) {
    outcomes[r] = outcomeOf([&] {
      for (int k = 0; k < 4; ++k) {
        Tensor t = filledWith(100, r);
        g.pgs[r]->allreduce(t)->wait();
        if (t.min().item<double>() != 3 || t.max().item<double>() != 3) throw std::runtime_error("wrong sum");
      }
    });
  });
  for (int r = 0; r < kSize; ++r) EXPECT_EQ(outcomes[r].kind, "none") << "rank " << r << ": " << outcomes[r].message;
}

// wait(timeout) shorter than the op gives up on the host and aborts the group: every rank's op
// fails, later ops fail at once, and no thread stays blocked.
TEST(Watchdog, WaitWithATimeoutAbortsTheGroup) {
  constexpr int kSize = 2;
  FakeCommOptions faults;
  faults.faults.push_back({FakeFault::Kind::Hang, 1, {1}, Millis(0)});
  FakeGroup g(kSize, Millis(60'000), faults);
  std::vector<Outcome> outcomes(kSize);
  g.run([&](int r) {
    Tensor t = ones({4});
    auto w = g.pgs[r]->allreduce(t);
    outcomes[r] = outcomeOf([&] {
      if (r == 0) {
        w->wait(Millis(200));
      } else {
        w->wait();
      }
    });
  });
  EXPECT_EQ(outcomes[0].kind, "TimeoutError") << outcomes[0].message;
  EXPECT_NE(outcomes[1].kind, "none");
  EXPECT_LT(outcomes[1].seconds, 5.0) << outcomes[1].message;
}

}  // namespace
}  // namespace cohort::dist
