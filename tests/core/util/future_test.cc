// Future (core/util/future.h): values and errors, then-chains, timeouts, callbacks and the
// threads they run on, whenAll.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <cohort/core/util/future.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

TEST(Future, ValueAndCompletion) {
  Future<int> f;
  EXPECT_FALSE(f.isCompleted());
  EXPECT_FALSE(f.hasError());
  EXPECT_EQ(f.exception(), nullptr);
  f.setValue(7);
  EXPECT_TRUE(f.isCompleted());
  EXPECT_FALSE(f.hasError());
  EXPECT_EQ(f.value(), 7);
  // Copies are handles to the same state.
  Future<int> copy = f;
  EXPECT_EQ(copy.value(), 7);

  auto r = Future<std::string>::ready("done");
  EXPECT_TRUE(r.isCompleted());
  EXPECT_EQ(r.value(), "done");
  auto v = Future<void>::ready();
  EXPECT_TRUE(v.isCompleted());
  EXPECT_NO_THROW(v.wait());
}

TEST(Future, ErrorIsRethrownWithItsType) {
  Future<int> f;
  f.setError(std::make_exception_ptr(PeerError("allreduce #3 in group 0: rank 2 disconnected")));
  EXPECT_TRUE(f.isCompleted());
  EXPECT_TRUE(f.hasError());
  EXPECT_NE(f.exception(), nullptr);
  EXPECT_THROW(f.value(), PeerError);
  EXPECT_THROW(f.wait(), PeerError);
  EXPECT_THROW(f.wait(10ms), PeerError);  // an error, not a timeout
  EXPECT_EQ(messageOf<DistError>([&] { f.wait(); }), "allreduce #3 in group 0: rank 2 disconnected");

  auto g = Future<void>::failed(std::make_exception_ptr(StoreError("key 'x' missing")));
  EXPECT_THROW(g.wait(), StoreError);
}

TEST(Future, SetFromCapturesValueOrException) {
  Future<int> ok;
  ok.setFrom([] { return 5; });
  EXPECT_EQ(ok.value(), 5);
  Future<int> bad;
  bad.setFrom([]() -> int { throw std::out_of_range("nope"); });
  EXPECT_THROW(bad.value(), std::out_of_range);
  Future<void> v;
  int ran = 0;
  v.setFrom([&] { ++ran; });
  EXPECT_TRUE(v.isCompleted());
  EXPECT_EQ(ran, 1);
}

TEST(Future, CompletingTwiceIsAnError) {
  Future<int> f;
  f.setValue(1);
  EXPECT_THROW(f.setValue(2), Error);
  EXPECT_THROW(f.setError(std::make_exception_ptr(Error("late"))), Error);
  EXPECT_EQ(f.value(), 1);  // the first completion stands
  Future<int> g;
  EXPECT_THROW(g.setError(nullptr), Error);  // an error needs an exception
  EXPECT_FALSE(g.isCompleted());
}

TEST(Future, TakeValueMovesOut) {
  Future<std::unique_ptr<int>> f;
  f.setValue(std::make_unique<int>(9));
  std::unique_ptr<int> p = f.takeValue();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 9);
}

TEST(Future, ThenChainsValuesAndTypes) {
  Future<int> f;
  Future<std::string> g = f.then([](Future<int> done) { return std::to_string(done.value() + 1); });
  Future<size_t> h = g.then([](Future<std::string> done) { return done.value().size(); });
  Future<void> last = h.then([](Future<size_t>) {});
  EXPECT_FALSE(g.isCompleted());
  f.setValue(99);
  EXPECT_EQ(g.value(), "100");
  EXPECT_EQ(h.value(), 3u);
  EXPECT_TRUE(last.isCompleted());
  EXPECT_FALSE(last.hasError());

  // then() on an already complete future runs at once.
  auto now = Future<int>::ready(2).then([](Future<int> d) { return d.value() * 10; });
  EXPECT_TRUE(now.isCompleted());
  EXPECT_EQ(now.value(), 20);
}

TEST(Future, ThenPropagatesErrors) {
  // An exception thrown by the continuation fails the returned future.
  Future<int> f;
  auto g = f.then([](Future<int>) -> int { throw ValueError("continuation failed"); });
  f.setValue(1);
  EXPECT_EQ(messageOf<ValueError>([&] { g.wait(); }), "continuation failed");

  // A failed source reaches the continuation, which rethrows it by reading the value.
  Future<int> src;
  auto chained = src.then([](Future<int> d) { return d.value() + 1; });
  auto chained2 = chained.then([](Future<int> d) { return d.value() + 1; });
  src.setError(std::make_exception_ptr(TimeoutError("broadcast #7 timed out")));
  EXPECT_THROW(chained2.value(), TimeoutError);

  // Or handles it and recovers.
  Future<int> src2;
  auto recovered = src2.then([](Future<int> d) { return d.hasError() ? -1 : d.value(); });
  src2.setError(std::make_exception_ptr(Error("x")));
  EXPECT_EQ(recovered.value(), -1);
}

TEST(Future, ThenFlattensAReturnedFuture) {
  Future<int> outer;
  Future<std::string> inner;
  auto chained = outer.then([&](Future<int> d) {
    EXPECT_EQ(d.value(), 1);
    return inner;  // a Future<std::string>, flattened: chained is Future<std::string>
  });
  static_assert(std::is_same_v<decltype(chained), Future<std::string>>);
  outer.setValue(1);
  EXPECT_FALSE(chained.isCompleted());  // waits for the inner future too
  std::thread t([&] {
    std::this_thread::sleep_for(5ms);
    inner.setValue("inner done");
  });
  EXPECT_EQ(chained.value(), "inner done");
  t.join();

  // An inner failure fails the flattened future.
  Future<void> o2;
  Future<void> flat =
      o2.then([](Future<void>) { return Future<void>::failed(std::make_exception_ptr(RpcError("remote"))); });
  o2.setValue();
  EXPECT_THROW(flat.wait(), RpcError);
}

TEST(Future, WaitWithTimeoutThrowsTimeoutError) {
  Future<int> f;
  EXPECT_FALSE(f.waitFor(1ms));
  std::string msg = messageOf<TimeoutError>([&] { f.wait(20ms); });
  EXPECT_TRUE(contains(msg, "timed out after 20 ms")) << msg;
  // TimeoutError is catchable as its bases.
  EXPECT_THROW(f.wait(1ms), DistError);
  EXPECT_THROW(f.wait(1ms), Error);
  EXPECT_FALSE(f.isCompleted());
  // Completed later, the same future waits fine.
  std::thread t([&] { f.setValue(3); });
  EXPECT_NO_THROW(f.wait(60s));
  EXPECT_EQ(f.value(), 3);
  t.join();
}

TEST(Future, CallbacksRunOnTheCompletingThread) {
  Future<int> f;
  std::atomic<int> calls{0};
  std::thread::id cbThread;
  f.addCallback([&](Future<int> done) {
    cbThread = std::this_thread::get_id();
    EXPECT_EQ(done.value(), 42);
    ++calls;
  });
  EXPECT_EQ(calls.load(), 0);
  std::thread::id producer;
  std::thread t([&] {
    producer = std::this_thread::get_id();
    f.setValue(42);
  });
  t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(cbThread, producer);
  EXPECT_NE(cbThread, std::this_thread::get_id());

  // Added after completion: runs at once, on the caller's thread.
  std::thread::id lateThread;
  f.addCallback([&](Future<int>) { lateThread = std::this_thread::get_id(); });
  EXPECT_EQ(lateThread, std::this_thread::get_id());
}

TEST(Future, SetIfNoCallbacksCompletesOnlyForWaiters) {
  {
    // Only a waiter: completed at once, the waiter wakes with the value.
    Future<std::string> f;
    std::string seen;
    std::thread waiter([&] { seen = f.value(); });
    std::string v = "payload";
    EXPECT_TRUE(f.setValueIfNoCallbacks(v));
    waiter.join();
    EXPECT_EQ(seen, "payload");
    EXPECT_TRUE(f.isCompleted());
    std::string again = "x";
    EXPECT_THROW(f.setValueIfNoCallbacks(again), Error);  // completing twice is still an error
  }
  {
    // A callback attached: nothing happens, the value stays with the caller, the future pending.
    Future<std::string> f;
    int calls = 0;
    f.addCallback([&](Future<std::string>) { ++calls; });
    std::string v = "payload";
    EXPECT_FALSE(f.setValueIfNoCallbacks(v));
    EXPECT_EQ(v, "payload");
    EXPECT_FALSE(f.isCompleted());
    EXPECT_EQ(calls, 0);
    f.setValue(std::move(v));  // the ordinary path runs the callback
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(f.value(), "payload");
  }
  {
    Future<int> f;
    auto e = std::make_exception_ptr(ValueError("boom"));
    EXPECT_TRUE(f.setErrorIfNoCallbacks(e));
    EXPECT_THROW(f.value(), ValueError);
    Future<int> g;
    g.addCallback([](Future<int>) {});
    EXPECT_FALSE(g.setErrorIfNoCallbacks(e));
    EXPECT_FALSE(g.isCompleted());
    g.setError(e);
  }
}

TEST(Future, ManyWaitersAndProducers) {
  // Every waiter sees the value, whichever thread completes first.
  constexpr int kFutures = 16;
  std::vector<Future<int>> futures(kFutures);
  std::vector<std::thread> threads;
  std::atomic<int> sum{0};
  for (int i = 0; i < kFutures; ++i) {
    threads.emplace_back([&, i] { sum += futures[i].value(); });
  }
  for (int i = 0; i < kFutures; ++i) {
    threads.emplace_back([&, i] { futures[i].setValue(i); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sum.load(), kFutures * (kFutures - 1) / 2);
}

TEST(Future, WhenAll) {
  std::vector<Future<int>> fs(3);
  Future<void> all = whenAll(fs);
  fs[2].setValue(2);
  fs[0].setValue(0);
  EXPECT_FALSE(all.isCompleted());
  std::thread t([&] { fs[1].setValue(1); });
  EXPECT_NO_THROW(all.wait(60s));
  t.join();
  EXPECT_FALSE(all.hasError());

  // Empty: complete at once.
  EXPECT_TRUE(whenAll(std::vector<Future<int>>{}).isCompleted());

  // One failure fails the whole, but only once everything has completed.
  std::vector<Future<void>> gs(3);
  Future<void> some = whenAll(gs);
  gs[1].setError(std::make_exception_ptr(PeerError("rank 1 died")));
  EXPECT_FALSE(some.isCompleted());
  gs[0].setValue();
  gs[2].setError(std::make_exception_ptr(TimeoutError("later error")));
  EXPECT_EQ(messageOf<PeerError>([&] { some.wait(); }),
            "rank 1 died");  // the first error
}
