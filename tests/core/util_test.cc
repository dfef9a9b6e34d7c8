// The utility layer every other layer builds on: Future, environment knobs, COHORT_CHECK*, the
// error hierarchy and logging.
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

#include <cohort/core/util/check.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/future.h>
#include <cohort/core/util/logging.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using namespace std::chrono_literals;

// ---- Future ------------------------------------------------------------------------------------

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

// ---- environment knobs ---------------------------------------------------------------------

namespace {
// Each knob is read under one value only, so the test holds whether or not reads are cached.
COHORT_ENV_KNOB(kTestDefaults, "COHORT_TEST_KNOB_DEFAULTS", "17", "Test: integer default.");
COHORT_ENV_KNOB(kTestInteger, "COHORT_TEST_KNOB_INTEGER", "0", "Test: integer value.");
COHORT_ENV_KNOB(kTestBadInteger, "COHORT_TEST_KNOB_BAD_INTEGER", "0", "Test: not an integer.");
COHORT_ENV_KNOB(kTestNumber, "COHORT_TEST_KNOB_NUMBER", "0.5", "Test: a number.");
COHORT_ENV_KNOB(kTestBadNumber, "COHORT_TEST_KNOB_BAD_NUMBER", "0.5", "Test: not a number.");
COHORT_ENV_KNOB(kTestFlagOn, "COHORT_TEST_KNOB_FLAG_ON", "0", "Test: flag set.");
COHORT_ENV_KNOB(kTestFlagOff, "COHORT_TEST_KNOB_FLAG_OFF", "1", "Test: flag cleared.");
COHORT_ENV_KNOB(kTestBadFlag, "COHORT_TEST_KNOB_BAD_FLAG", "0", "Test: not a flag.");
COHORT_ENV_KNOB(kTestEmpty, "COHORT_TEST_KNOB_EMPTY", "fallback", "Test: empty means unset.");
}  // namespace

TEST(Env, DefaultsWhenUnset) {
  ::unsetenv("COHORT_TEST_KNOB_DEFAULTS");
  EXPECT_STREQ(kTestDefaults.name(), "COHORT_TEST_KNOB_DEFAULTS");
  EXPECT_FALSE(kTestDefaults.raw().has_value());
  EXPECT_EQ(kTestDefaults.str(), "17");
  EXPECT_EQ(kTestDefaults.integer(), 17);
  EXPECT_DOUBLE_EQ(kTestDefaults.number(), 17.0);

  ::setenv("COHORT_TEST_KNOB_EMPTY", "", 1);
  EXPECT_FALSE(kTestEmpty.raw().has_value());
  EXPECT_EQ(kTestEmpty.str(), "fallback");
  ::unsetenv("COHORT_TEST_KNOB_EMPTY");
}

TEST(Env, ParsesValues) {
  ::setenv("COHORT_TEST_KNOB_INTEGER", "-123456789012", 1);
  EXPECT_EQ(kTestInteger.raw().value(), "-123456789012");
  EXPECT_EQ(kTestInteger.integer(), -123456789012LL);
  ::setenv("COHORT_TEST_KNOB_NUMBER", "2.5e-3", 1);
  EXPECT_DOUBLE_EQ(kTestNumber.number(), 2.5e-3);
  ::setenv("COHORT_TEST_KNOB_FLAG_ON", "Yes", 1);
  EXPECT_TRUE(kTestFlagOn.flag());
  ::setenv("COHORT_TEST_KNOB_FLAG_OFF", "OFF", 1);
  EXPECT_FALSE(kTestFlagOff.flag());
  for (const char* v :
       {"COHORT_TEST_KNOB_INTEGER", "COHORT_TEST_KNOB_NUMBER", "COHORT_TEST_KNOB_FLAG_ON", "COHORT_TEST_KNOB_FLAG_OFF"})
    ::unsetenv(v);
}

TEST(Env, ParseErrorsNameTheVariableAndValue) {
  ::setenv("COHORT_TEST_KNOB_BAD_INTEGER", "12abc", 1);
  std::string msg = messageOf<ValueError>([] { (void)kTestBadInteger.integer(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_INTEGER")) << msg;
  EXPECT_TRUE(contains(msg, "12abc")) << msg;

  ::setenv("COHORT_TEST_KNOB_BAD_NUMBER", "fast", 1);
  msg = messageOf<ValueError>([] { (void)kTestBadNumber.number(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_NUMBER")) << msg;
  EXPECT_TRUE(contains(msg, "fast")) << msg;

  ::setenv("COHORT_TEST_KNOB_BAD_FLAG", "maybe", 1);
  msg = messageOf<ValueError>([] { (void)kTestBadFlag.flag(); });
  EXPECT_TRUE(contains(msg, "COHORT_TEST_KNOB_BAD_FLAG")) << msg;
  EXPECT_TRUE(contains(msg, "maybe")) << msg;
  for (const char* v : {"COHORT_TEST_KNOB_BAD_INTEGER", "COHORT_TEST_KNOB_BAD_NUMBER", "COHORT_TEST_KNOB_BAD_FLAG"})
    ::unsetenv(v);
}

TEST(Env, AllKnobsListsEveryDeclarationSorted) {
  auto knobs = env::allKnobs();
  auto find = [&](const std::string& name) -> const env::KnobInfo* {
    for (const auto& k : knobs)
      if (k.name == name) return &k;
    return nullptr;
  };
  // Declared in this file...
  const env::KnobInfo* mine = find("COHORT_TEST_KNOB_DEFAULTS");
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->defaultValue, "17");
  EXPECT_EQ(mine->description, "Test: integer default.");
  EXPECT_NE(find("COHORT_TEST_KNOB_BAD_FLAG"), nullptr);
  // ...and inside the library (logging's level).
  const env::KnobInfo* log = find("COHORT_LOG_LEVEL");
  ASSERT_NE(log, nullptr);
  EXPECT_FALSE(log->description.empty());
  for (size_t i = 1; i < knobs.size(); ++i) EXPECT_LT(knobs[i - 1].name, knobs[i].name);
}

// ---- checks and errors -----------------------------------------------------------------------

TEST(Check, MessageHasTextConditionAndLocation) {
  int line = 0;
  std::string msg = messageOf<Error>([&] {
    line = __LINE__ + 1;
    COHORT_CHECK(1 + 1 == 3, "arithmetic is broken: {} and {}", 2, "three");
  });
  EXPECT_TRUE(contains(msg, "arithmetic is broken: 2 and three")) << msg;
  EXPECT_TRUE(contains(msg, "1 + 1 == 3")) << msg;
  EXPECT_TRUE(contains(msg, "tests/core/util_test.cc:" + std::to_string(line))) << msg;

  msg = messageOf<Error>([] { COHORT_CHECK(false); });
  EXPECT_TRUE(contains(msg, "check failed")) << msg;
  EXPECT_TRUE(contains(msg, "util_test.cc:")) << msg;

  EXPECT_NO_THROW(COHORT_CHECK(true, "never formatted {}", 1));
}

TEST(Check, LocationOfAnInstalledHeaderIsRepositoryRelative) {
  // cohort's own paths arrive repository-relative (the build maps them); a check inside an
  // installed header compiled by a user's project arrives as that compiler found the header.
  EXPECT_EQ(detail::checkLocation("x", "core/tensor/tensor.cc", 7), " [x; at core/tensor/tensor.cc:7]");
  EXPECT_EQ(detail::checkLocation("x", "/opt/cohort/include/cohort/core/tensor/tensor.h", 3),
            " [x; at core/tensor/tensor.h:3]");
  // Anything else (a user's own COHORT_CHECK) is kept as it is.
  EXPECT_EQ(detail::checkLocation("x", "/home/me/train.cc", 9), " [x; at /home/me/train.cc:9]");
}

TEST(Check, ComparisonsPrintBothValues) {
  int a = 2, b = 3;
  int line = 0;
  std::string msg = messageOf<Error>([&] {
    line = __LINE__ + 1;
    COHORT_CHECK_EQ(a, b, "sizes differ in {}", "allgather");
  });
  EXPECT_TRUE(contains(msg, "sizes differ in allgather")) << msg;
  EXPECT_TRUE(contains(msg, "2 vs. 3")) << msg;
  EXPECT_TRUE(contains(msg, "a == b")) << msg;
  EXPECT_TRUE(contains(msg, "util_test.cc:" + std::to_string(line))) << msg;

  msg = messageOf<Error>([&] { COHORT_CHECK_LT(b, a); });
  EXPECT_TRUE(contains(msg, "3 vs. 2")) << msg;
  EXPECT_TRUE(contains(msg, "b < a")) << msg;

  std::string s1 = "left", s2 = "right";
  msg = messageOf<Error>([&] { COHORT_CHECK_EQ(s1, s2, "names"); });
  EXPECT_TRUE(contains(msg, "left vs. right")) << msg;

  EXPECT_NO_THROW(COHORT_CHECK_EQ(a, 2));
  EXPECT_NO_THROW(COHORT_CHECK_NE(a, b));
  EXPECT_NO_THROW(COHORT_CHECK_LE(a, 2));
  EXPECT_NO_THROW(COHORT_CHECK_GT(b, a));
  EXPECT_NO_THROW(COHORT_CHECK_GE(b, 3));
  EXPECT_THROW(COHORT_CHECK_GE(a, b), Error);
  EXPECT_THROW(COHORT_CHECK_NE(a, 2), Error);
  EXPECT_THROW(COHORT_CHECK_GT(a, a), Error);
  EXPECT_THROW(COHORT_CHECK_LE(b, a), Error);

  // Operands are evaluated exactly once.
  int calls = 0;
  auto next = [&] { return ++calls; };
  EXPECT_NO_THROW(COHORT_CHECK_EQ(next(), 1));
  EXPECT_EQ(calls, 1);
}

TEST(Check, TypedChecksThrowTheGivenType) {
  std::string msg = messageOf<IndexError>([] { COHORT_CHECK_T(IndexError, 5 < 3, "index {} out of range", 5); });
  EXPECT_TRUE(contains(msg, "index 5 out of range")) << msg;
  EXPECT_TRUE(contains(msg, "util_test.cc:")) << msg;
  EXPECT_THROW(COHORT_CHECK_T(NotSupportedError, false, "no"), NotSupportedError);
}

TEST(Errors, Hierarchy) {
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(std::is_base_of_v<Error, ValueError>);
  static_assert(std::is_base_of_v<ValueError, IndexError>);
  static_assert(std::is_base_of_v<Error, NotSupportedError>);
  static_assert(std::is_base_of_v<Error, DistError>);
  static_assert(std::is_base_of_v<DistError, TimeoutError>);
  static_assert(std::is_base_of_v<DistError, PeerError>);
  static_assert(std::is_base_of_v<DistError, StoreError>);
  static_assert(std::is_base_of_v<Error, CheckpointError>);
  static_assert(std::is_base_of_v<Error, RpcError>);
  static_assert(!std::is_base_of_v<DistError, ValueError>);

  // Caught through each base, with the message intact.
  try {
    throw TimeoutError("allreduce #12 in group 'world' timed out waiting for ranks 1, 3");
  } catch (const DistError& e) {
    EXPECT_STREQ(e.what(), "allreduce #12 in group 'world' timed out waiting for ranks 1, 3");
  }
  EXPECT_THROW(throw TimeoutError("t"), Error);
  EXPECT_THROW(throw TimeoutError("t"), std::runtime_error);
  EXPECT_THROW(throw IndexError("i"), ValueError);
}

// ---- logging ---------------------------------------------------------------------------------

namespace {
class LogLevelRestore {
 public:
  LogLevelRestore() : saved_(logging::level()) {}
  ~LogLevelRestore() {
    logging::setLevel(saved_);
    logging::setPrefix("");
  }

 private:
  logging::Level saved_;
};
}  // namespace

TEST(Logging, LevelsFilterMessages) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Warning);
  EXPECT_EQ(logging::level(), logging::Level::Warning);
  EXPECT_FALSE(logging::enabled(logging::Level::Debug));
  EXPECT_FALSE(logging::enabled(logging::Level::Info));
  EXPECT_TRUE(logging::enabled(logging::Level::Warning));
  EXPECT_TRUE(logging::enabled(logging::Level::Error));

  ::testing::internal::CaptureStderr();
  COHORT_LOG(Debug, "hidden debug {}", 1);
  COHORT_LOG(Info, "hidden info {}", 2);
  COHORT_LOG(Warning, "shown warning {}", 3);
  COHORT_LOG(Error, "shown error {}", 4);
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(out, "hidden")) << out;
  EXPECT_TRUE(contains(out, "shown warning 3")) << out;
  EXPECT_TRUE(contains(out, "shown error 4")) << out;
  EXPECT_TRUE(contains(out, "util_test.cc:")) << out;  // the call site
  EXPECT_TRUE(contains(out, "[cohort W ")) << out;
  EXPECT_TRUE(contains(out, "[cohort E ")) << out;

  logging::setLevel(logging::Level::Debug);
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Debug, "now shown {}", 5);
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(out, "[cohort D ")) << out;
  EXPECT_TRUE(contains(out, "now shown 5")) << out;

  logging::setLevel(logging::Level::Off);
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Error, "silenced");
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
}

TEST(Logging, DisabledMessagesAreNotFormatted) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Error);
  int evaluated = 0;
  auto costly = [&] { return ++evaluated; };
  ::testing::internal::CaptureStderr();
  COHORT_LOG(Info, "value {}", costly());
  std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(out, "");
}

TEST(Logging, PrefixAndWholeLinesFromManyThreads) {
  LogLevelRestore restore;
  logging::setLevel(logging::Level::Info);
  logging::setPrefix("rank 3");
  constexpr int kThreads = 4, kLines = 50;
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) COHORT_LOG(Info, "thread {} line {} end", t, i);
    });
  for (auto& th : threads) th.join();
  std::string out = ::testing::internal::GetCapturedStderr();
  // Every line is whole: it starts with the tag, carries the prefix and ends with "end".
  int lines = 0;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string line = out.substr(pos, nl - pos);
    EXPECT_EQ(line.rfind("[cohort I ", 0), 0u) << line;
    EXPECT_TRUE(contains(line, " rank 3 ")) << line;
    EXPECT_EQ(line.substr(line.size() - 4), " end") << line;
    ++lines;
    pos = nl + 1;
  }
  EXPECT_EQ(lines, kThreads * kLines);
}
