// Intra-op parallelism (core/util/parallel.h) and the compute-bound kernels that use it: every
// index runs exactly once, however the range splits and whoever calls; nested and concurrent calls
// run inline rather than wait; a chunk's exception reaches the caller; a forked child gets a
// working pool of its own; and pow, gelu, exp and friends give bit-identical results on one
// thread and on several (each element is computed on its own).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/parallel.h>

#include "core/test_util.h"

#include "harness/ranks.h"

namespace cohort {
namespace {

// Sets the thread count for one test and puts the old one back.
class Threads {
 public:
  explicit Threads(int n) : old_(blas::numThreads()) { blas::setNumThreads(n); }
  ~Threads() { blas::setNumThreads(old_); }

 private:
  int old_;
};

TEST(ParallelFor, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    Threads t(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65537}, int64_t{1} << 20}) {
      for (int64_t grain : {int64_t{1}, int64_t{100}, int64_t{4096}, int64_t{1} << 30}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> calls{0};
        parallelFor(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          ++calls;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
        });
        int64_t wrong = 0;
        for (auto& h : hits) wrong += h.load() != 1;
        EXPECT_EQ(wrong, 0) << "threads " << threads << " n " << n << " grain " << grain;
        if (n > 0 && (threads == 1 || n < 2 * grain)) {
          EXPECT_EQ(calls.load(), 1) << "a range below two grains, or one thread, runs as one call";
        }
        if (n == 0) {
          EXPECT_EQ(calls.load(), 0);
        }
      }
    }
  }
}

TEST(ParallelFor, SplitsAcrossThreadsWhenAllowed) {
  Threads t(2);
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::thread::id> seen;
  // Every chunk waits (until one deadline 10 s away, so a loaded machine cannot make this flaky
  // and a broken pool fails in 10 s, not per chunk) until a second thread has taken a chunk too:
  // it can only pass if the range really is shared.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  parallelFor(64, 1, [&](int64_t, int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
    cv.notify_all();
    cv.wait_until(lock, deadline, [&] { return seen.size() >= 2; });
  });
  EXPECT_EQ(seen.size(), 2u);
}

TEST(ParallelFor, NestedAndConcurrentCallsRunInlineAndComplete) {
  Threads t(2);
  constexpr int kCallers = 4;
  constexpr int64_t kN = 200'000;
  std::vector<std::vector<int>> out(kCallers, std::vector<int>(kN, 0));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 20; ++round) {
        parallelFor(kN, 1000, [&](int64_t b, int64_t e) {
          // A nested call runs inline on this thread, whole.
          parallelFor(e - b, 10, [&](int64_t nb, int64_t ne) {
            for (int64_t i = b + nb; i < b + ne; ++i) out[c][i] += 1;
          });
        });
      }
    });
  }
  for (auto& th : callers) th.join();
  for (int c = 0; c < kCallers; ++c) {
    int64_t wrong = 0;
    for (int v : out[c]) wrong += v != 20;
    EXPECT_EQ(wrong, 0) << "caller " << c;
  }
}

TEST(ParallelFor, AChunksExceptionReachesTheCaller) {
  Threads t(2);
  std::atomic<int64_t> ran{0};
  EXPECT_THROW(parallelFor(1 << 16, 1024,
                           [&](int64_t b, int64_t e) {
                             ran += e - b;
                             if (b == 0) throw std::runtime_error("chunk failed");
                           }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 1 << 16) << "the other chunks still ran";
  // The pool is usable afterwards.
  std::atomic<int64_t> sum{0};
  parallelFor(1 << 16, 1024, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 1 << 16);
}

TEST(ParallelFor, AForkedChildGetsAWorkingPool) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started in a child of a multi-threaded fork";
#endif
  Threads t(2);
  Tensor x = rand({1 << 18});
  Tensor before = exp(x);  // the parent's pool exists now
  cohort::testing::RankOptions o;
  o.limit = std::chrono::seconds(20);  // a hang kills the child, and the check below fails
  auto child = cohort::testing::runRanks(
      1,
      [&](int, std::ostream&) {
        Tensor again = exp(x);
        return std::memcmp(again.data<float>(), before.data<float>(), sizeof(float) << 18) == 0 ? 0 : 1;
      },
      o)[0];
  ASSERT_FALSE(child.killedByWatchdog) << "the child hung";
  ASSERT_TRUE(WIFEXITED(child.status)) << "the child ended with " << child.describe();
  EXPECT_EQ(WEXITSTATUS(child.status), 0) << "the child computed a different exp";
}

TEST(ParallelKernels, ResultsAreBitIdenticalOnOneThreadAndOnSeveral) {
  // Sizes below, at and well above the split threshold, and an odd one.
  for (int64_t n : {int64_t{1000}, int64_t{1} << 16, (int64_t{1} << 20) + 3}) {
    Tensor x = randn({n}) * 3.0;
    Tensor pos = abs(x) + 0.01;
    Tensor y = rand({n}) * 4.0 - 2.0;
    Tensor scalarExp = full({1}, 1.3f);
    Tensor strided = randn({n, 2}).select(1, 0);  // not contiguous: the serial path
    auto all = [&] {
      std::vector<Tensor> r;
      r.push_back(pow(pos, 1.7));
      r.push_back(pow(pos, y));
      r.push_back(pow(pos, scalarExp));
      r.push_back(gelu(x, false));
      r.push_back(gelu(x, true));
      r.push_back(exp(x));
      r.push_back(log(pos));
      r.push_back(tanh(x));
      r.push_back(sigmoid(x));
      r.push_back(silu(x));
      r.push_back(exp(strided));
      // Backward formulas that split too.
      Tensor xa = x.detach().clone();
      Tensor pa = pos.detach().clone();
      Tensor ya = y.detach().clone();
      xa.setRequiresGrad();
      pa.setRequiresGrad();
      ya.setRequiresGrad();
      (gelu(xa, false).sum() + silu(xa).sum() + pow(pa, ya).sum()).backward();
      r.push_back(xa.grad());
      r.push_back(pa.grad());
      r.push_back(ya.grad());
      return r;
    };
    std::vector<Tensor> one, many;
    {
      Threads t(1);
      one = all();
    }
    {
      Threads t(3);
      many = all();
    }
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(cohort::testing::sameBits(one[i], many[i])) << "result " << i << " at n " << n;
  }
}

}  // namespace
}  // namespace cohort
