// The RPC agent's worker pool (rpc/detail/thread_pool.h): every task runs, a task blocked on a later task
// never deadlocks the pool (whether a thread was polling for work or all slept), the pool grows
// when all its threads are blocked, and bad agent options are ValueErrors naming the option.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <cohort/core/util/future.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/rpc/detail/thread_pool.h>
#include <cohort/rpc/rpc.h>

namespace cohort::rpc {
namespace {

using namespace std::chrono_literals;

TEST(RpcThreadPool, EveryTaskRunsWithAndWithoutPolling) {
  for (auto poll : {0us, 100us, 5000us}) {
    SCOPED_TRACE(poll.count());
    std::atomic<int> ran{0};
    {
      ThreadPool pool(2, 4, poll);
      for (int i = 0; i < 5000; ++i) {
        ASSERT_TRUE(pool.run([&] { ++ran; }));
        if (i % 97 == 0) std::this_thread::sleep_for(50us);  // let threads poll, then sleep
      }
      pool.stop();  // drains the queue
      EXPECT_FALSE(pool.run([&] { ++ran; }));
    }
    EXPECT_EQ(ran.load(), 5000);
  }
}

// A task that waits for a task queued after it: with one thread polling and the other asleep, the
// second task must still reach a thread (run() wakes a sleeper for every task beyond the pollers).
TEST(RpcThreadPool, ATaskWaitingForALaterTaskNeverDeadlocks) {
  ThreadPool pool(2, 2, 2000us);  // no growth: the two threads must suffice
  for (int round = 0; round < 100; ++round) {
    // Both threads stop polling and sleep; then a short task leaves its thread polling for 2 ms
    // while the other sleeps on.
    std::this_thread::sleep_for(5ms);
    Future<void> warm;
    pool.run([warm]() mutable { warm.setValue(); });
    warm.wait(5s);
    Future<void> second, firstDone;
    std::atomic<bool> sawSecond{false};
    pool.run([second, firstDone, &sawSecond]() mutable {
      sawSecond = second.waitFor(5s);
      firstDone.setValue();
    });
    pool.run([second]() mutable { second.setValue(); });
    ASSERT_TRUE(firstDone.waitFor(10s)) << "round " << round;
    ASSERT_TRUE(sawSecond.load()) << "round " << round << ": the later task never ran while the first waited";
  }
}

TEST(RpcThreadPool, GrowsWhenEveryThreadIsBlocked) {
  ThreadPool pool(1, 3, 100us);
  Future<void> release;
  std::atomic<int> blocked{0};
  for (int i = 0; i < 3; ++i) {
    pool.run([release, &blocked] {
      ++blocked;
      release.waitFor(10s);
    });
  }
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (blocked.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(blocked.load(), 3) << "the pool did not grow past its one blocked thread";
  EXPECT_EQ(pool.size(), 3u);
  release.setValue();
}

TEST(RpcOptionsCheck, BadPoolOptionsAreValueErrorsNamingTheOption) {
  auto expectRefused = [](RpcOptions o, const std::string& what) {
    o.store = std::make_shared<dist::HashStore>();
    o.initTimeout = Millis(2'000);
    try {
      init("w0", 0, 1, o);
      shutdown();
      ADD_FAILURE() << "accepted " << what;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_FALSE(isInitialized());
  };
  RpcOptions o;
  o.numWorkerThreads = 0;
  expectRefused(o, "numWorkerThreads");
  o = {};
  o.workerPoll = -1us;
  expectRefused(o, "workerPoll must be 0 to 100000 µs, got -1 µs");
  o = {};
  o.workerPoll = 1s;
  expectRefused(o, "workerPoll");
}

}  // namespace
}  // namespace cohort::rpc
