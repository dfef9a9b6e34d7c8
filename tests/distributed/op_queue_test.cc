// OpQueue's scheduling (op_queue.h): ops start in issue order; with several threads, shareable ops
// on different storages overlap, ops on the same storage never do, an exclusive op runs alone
// after everything before it and before everything after it; stopping fails what is queued.
// Every wait in here is bounded, so a scheduling bug fails a test instead of hanging it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/distributed/detail/op_queue.h>

#include "distributed/pg_test_util.h"

namespace cohort::dist {
namespace {

using namespace std::chrono_literals;
using testing::completionKeyForTests;

WorkPtr makeWork(uint64_t seq) { return std::make_shared<Work>(OpType::Allreduce, seq, "test", Millis(10'000)); }

// Records which tasks run at the same time.
struct Tracker {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> events;
  int running = 0, maxRunning = 0;

  std::function<void()> task(const std::string& name, std::chrono::milliseconds hold, const WorkPtr& work) {
    return [this, name, hold, work] {
      {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back("start " + name);
        maxRunning = std::max(maxRunning, ++running);
        cv.notify_all();
      }
      std::this_thread::sleep_for(hold);
      {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back("end " + name);
        --running;
        cv.notify_all();
      }
      work->finish(completionKeyForTests(), {});
    };
  }
  // Waits (bounded) until `name` has started; returns whether it did.
  bool waitStarted(const std::string& name, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit,
                       [&] { return std::find(events.begin(), events.end(), "start " + name) != events.end(); });
  }
  size_t indexOf(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(events.begin(), events.end(), e) - events.begin();
  }
};

void waitAll(const std::vector<WorkPtr>& works) {
  for (const auto& w : works) ASSERT_NO_THROW(w->wait(Millis(10'000))) << "an op never ran";
}

int a, b, c;  // three distinct "storages"

TEST(OpQueue, ShareableOpsOnDifferentMemoryRunSideBySide) {
  OpQueue q(completionKeyForTests(), 2);
  Tracker t;
  // A holds on until B has started: only possible when they overlap.
  std::vector<WorkPtr> w{makeWork(1), makeWork(2)};
  std::atomic<bool> sawB{false};
  q.post(
      w[0],
      [&, work = w[0]] {
        sawB = t.waitStarted("B", 5'000ms);
        work->finish(completionKeyForTests(), {});
      },
      OpFootprint{false, {&a}});
  q.post(w[1], t.task("B", 0ms, w[1]), OpFootprint{false, {&b}});
  waitAll(w);
  EXPECT_TRUE(sawB);
}

TEST(OpQueue, ShareableOpsOnTheSameMemoryRunOneAfterTheOther) {
  OpQueue q(completionKeyForTests(), 4);
  Tracker t;
  std::vector<WorkPtr> w{makeWork(1), makeWork(2), makeWork(3)};
  q.post(w[0], t.task("A", 40ms, w[0]), OpFootprint{false, {&a, &b}});
  q.post(w[1], t.task("B", 40ms, w[1]), OpFootprint{false, {&b}});
  q.post(w[2], t.task("C", 40ms, w[2]), OpFootprint{false, {&c, &b}});
  waitAll(w);
  EXPECT_EQ(t.maxRunning, 1);
  // B waits for A (b), C for B (b).
  EXPECT_LT(t.indexOf("end A"), t.indexOf("start B"));
  EXPECT_LT(t.indexOf("end B"), t.indexOf("start C"));
}

TEST(OpQueue, AnExclusiveOpRunsAloneBetweenWhatCameBeforeAndAfter) {
  OpQueue q(completionKeyForTests(), 3);
  Tracker t;
  std::vector<WorkPtr> w{makeWork(1), makeWork(2), makeWork(3), makeWork(4)};
  q.post(w[0], t.task("A", 40ms, w[0]), OpFootprint{false, {&a}});
  q.post(w[1], t.task("B", 40ms, w[1]), OpFootprint{false, {&b}});
  q.post(w[2], t.task("X", 20ms, w[2]));  // exclusive
  q.post(w[3], t.task("C", 0ms, w[3]), OpFootprint{false, {&c}});
  waitAll(w);
  EXPECT_LT(t.indexOf("end A"), t.indexOf("start X"));
  EXPECT_LT(t.indexOf("end B"), t.indexOf("start X"));
  EXPECT_LT(t.indexOf("end X"), t.indexOf("start C"));
  EXPECT_LE(t.maxRunning, 2);  // A and B may overlap; X and C run alone
}

TEST(OpQueue, NoMoreThanTheThreadCountRunAtOnce) {
  OpQueue q(completionKeyForTests(), 2);
  Tracker t;
  static int s[6];
  std::vector<WorkPtr> w;
  for (int i = 0; i < 6; ++i) {
    w.push_back(makeWork(i + 1));
    // fmt: GCC 12 at -O3 reports a false -Wrestrict on "T" + std::to_string(i).
    q.post(w.back(), t.task(fmt::format("T{}", i), 15ms, w.back()), OpFootprint{false, {&s[i]}});
  }
  waitAll(w);
  EXPECT_LE(t.maxRunning, 2);  // overlap itself is ShareableOpsOnDifferentMemoryRunSideBySide's
  // (Two ops taken in order by two workers may log their starts in either order, so only the
  // count is checked here; the order rules are the other tests'.)
  EXPECT_EQ(t.events.size(), 12u);
}

TEST(OpQueue, StoppingLetsRunningOpsFinishAndFailsTheQueuedOnes) {
  auto q = std::make_unique<OpQueue>(completionKeyForTests(), 2);
  Tracker t;
  std::vector<WorkPtr> w{makeWork(1), makeWork(2), makeWork(3)};
  q->post(w[0], t.task("A", 500ms, w[0]));  // long enough that stop() comes while A runs
  q->post(w[1], t.task("B", 0ms, w[1]));
  q->post(w[2], t.task("C", 0ms, w[2]), OpFootprint{false, {&c}});
  ASSERT_TRUE(t.waitStarted("A", 5'000ms));
  q->stop();
  EXPECT_TRUE(w[0]->isCompleted());
  EXPECT_NO_THROW(w[0]->wait(Millis(1'000)));
  for (int i : {1, 2}) {
    ASSERT_TRUE(w[i]->isCompleted());
    EXPECT_THROW(w[i]->wait(Millis(1'000)), DistError);
  }
  // After stop, a post fails at once.
  auto late = makeWork(4);
  q->post(late, [] {});
  EXPECT_THROW(late->wait(Millis(1'000)), DistError);
}

// A task that holds the last reference to its queue (as a Work holding its backend would):
// the queue is destroyed on its own worker when the task's captures go, which must neither
// join that worker from itself (std::terminate) nor touch freed memory; queued ops still fail.
TEST(OpQueue, DestroyedFromItsOwnTaskEndsCleanly) {
  for (int threads : {1, 2}) {
    auto q = std::make_shared<OpQueue>(completionKeyForTests(), threads);
    auto done = makeWork(1), queued = makeWork(2);
    std::atomic<bool> release{false};
    q->post(done, [keep = q, &release, done]() mutable {
      while (!release.load()) std::this_thread::sleep_for(1ms);
      done->finish(completionKeyForTests(), {});
    });
    q->post(queued, [] {});  // exclusive: waits behind the first, then fails with the group gone
    std::weak_ptr<OpQueue> weak = q;
    q.reset();  // the running task now holds the only reference
    release = true;
    EXPECT_NO_THROW(done->wait(Millis(10'000)));
    EXPECT_THROW(queued->wait(Millis(10'000)), DistError);
    for (int i = 0; i < 1000 && !weak.expired(); ++i) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(weak.expired());
  }
}

}  // namespace
}  // namespace cohort::dist
