// The Store behaviour of store.h, written once and run against every implementation (HashStore,
// FileStore, TCPStore, PrefixStore): typed tests over the "kinds" of store_test_util.h.
#include <fmt/format.h>

#include <atomic>
#include <set>
#include <thread>

#include <cohort/core/util/error.h>

#include "distributed/store/store_test_util.h"

namespace cohort::dist::testing {
namespace {

constexpr Millis kShort{300};   // how long a wait that must time out waits
constexpr Millis kLong{20000};  // a deadline that only a bug reaches

template <typename Kind>
class StoreTest : public ::testing::Test {
 protected:
  Kind kind_;
};

using Kinds = ::testing::Types<HashKind, FileKind, TCPKind, PrefixKind>;
class KindNames {
 public:
  template <typename T>
  static std::string GetName(int) {  // NOLINT(readability-identifier-naming): GoogleTest's name for it
    if (std::is_same_v<T, HashKind>) return "Hash";
    if (std::is_same_v<T, FileKind>) return "File";
    if (std::is_same_v<T, TCPKind>) return "TCP";
    return "Prefix";
  }
};
TYPED_TEST_SUITE(StoreTest, Kinds, KindNames);

TYPED_TEST(StoreTest, SetThenGetReturnsTheLatestBytes) {
  auto s = this->kind_.open(kLong);
  s->set("a", "1");
  EXPECT_EQ(s->getString("a"), "1");
  s->set("a", "second value");
  EXPECT_EQ(s->getString("a"), "second value");
  Bytes binary = {0, 1, 2, 255, 0, 7};
  s->set("bin", binary);
  EXPECT_EQ(s->get("bin"), binary);
  s->set("empty", Bytes{});
  EXPECT_TRUE(s->check({"empty"}));
  EXPECT_EQ(s->get("empty"), Bytes{});
}

TYPED_TEST(StoreTest, GetOfAMissingKeyTimesOutNamingTheKey) {
  auto s = this->kind_.open(kShort);
  try {
    s->get("never-set");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("\"never-set\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(s->describe()), std::string::npos) << msg;
  }
}

TYPED_TEST(StoreTest, GetWaitsForAKeySetLater) {
  auto s = this->kind_.open(kLong);
  auto other = this->kind_.open(kLong);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    other->set("late", "here");
  });
  EXPECT_EQ(s->getString("late"), "here");
  setter.join();
}

TYPED_TEST(StoreTest, AddCountsFromZeroAndStoresDecimalText) {
  auto s = this->kind_.open(kLong);
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -2), 3);
  EXPECT_EQ(s->add("n", 0), 3);
  EXPECT_EQ(s->getString("n"), "3");
  s->set("m", "41");
  EXPECT_EQ(s->add("m", 1), 42);
  EXPECT_EQ(s->add("neg", -7), -7);
  EXPECT_EQ(s->getString("neg"), "-7");
}

TYPED_TEST(StoreTest, AddOnANonIntegerIsAValueErrorAndChangesNothing) {
  auto s = this->kind_.open(kLong);
  s->set("word", "abc");
  try {
    s->add("word", 1);
    FAIL() << "add on a non-integer returned";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("word"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->getString("word"), "abc");
  s->set("word", "12x");
  EXPECT_THROW(s->add("word", 1), ValueError);
  // The store still serves afterwards.
  EXPECT_EQ(s->add("fine", 2), 2);
}

TYPED_TEST(StoreTest, CompareSetFollowsC10dSemantics) {
  auto s = this->kind_.open(kLong);
  // Missing key, non-empty expected: nothing stored, `expected` returned.
  EXPECT_EQ(toString(s->compareSet("k", toBytes("x"), toBytes("y"))), "x");
  EXPECT_FALSE(s->check({"k"}));
  // Missing key, empty expected: created.
  EXPECT_EQ(toString(s->compareSet("k", {}, toBytes("first"))), "first");
  EXPECT_EQ(s->getString("k"), "first");
  // Present, expected matches: replaced.
  EXPECT_EQ(toString(s->compareSet("k", toBytes("first"), toBytes("second"))), "second");
  EXPECT_EQ(s->getString("k"), "second");
  // Present, expected differs: unchanged, current value returned.
  EXPECT_EQ(toString(s->compareSet("k", toBytes("first"), toBytes("third"))), "second");
  EXPECT_EQ(s->getString("k"), "second");
  // Present, empty expected does not match a non-empty value.
  EXPECT_EQ(toString(s->compareSet("k", {}, toBytes("fourth"))), "second");
}

TYPED_TEST(StoreTest, CheckNeedsEveryKey) {
  auto s = this->kind_.open(kLong);
  EXPECT_TRUE(s->check({}));
  EXPECT_FALSE(s->check({"a"}));
  s->set("a", "1");
  EXPECT_TRUE(s->check({"a"}));
  EXPECT_FALSE(s->check({"a", "b"}));
  s->set("b", "2");
  EXPECT_TRUE(s->check({"a", "b"}));
}

TYPED_TEST(StoreTest, DeleteKeySaysWhetherItExisted) {
  auto s = this->kind_.open(kLong);
  s->set("a", "1");
  s->set("b", "2");
  EXPECT_EQ(s->numKeys(), 2);
  EXPECT_TRUE(s->deleteKey("a"));
  EXPECT_FALSE(s->deleteKey("a"));
  EXPECT_FALSE(s->deleteKey("never"));
  EXPECT_FALSE(s->check({"a"}));
  EXPECT_EQ(s->numKeys(), 1);
  s->set("a", "again");
  EXPECT_EQ(s->getString("a"), "again");
}

TYPED_TEST(StoreTest, NumKeysCountsDistinctKeys) {
  auto s = this->kind_.open(kLong);
  EXPECT_EQ(s->numKeys(), 0);
  s->set("a", "1");
  s->set("a", "2");
  s->add("c", 1);
  s->compareSet("d", {}, toBytes("x"));
  s->compareSet("e", toBytes("nope"), toBytes("x"));  // stores nothing
  EXPECT_EQ(s->numKeys(), 3);
}

TYPED_TEST(StoreTest, WaitReturnsAtOnceForPresentOrNoKeys) {
  auto s = this->kind_.open(kLong);
  s->wait({}, kShort);
  s->set("a", "1");
  s->set("b", "1");
  s->wait({"a", "b"}, kShort);
  s->wait({"a"});
}

TYPED_TEST(StoreTest, WaitIsWokenByWritesFromAnotherHandle) {
  auto waiter = this->kind_.open(kLong);
  auto writer = this->kind_.open(kLong);
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    writer->set("x", "1");
    writer->add("y", 1);
    writer->compareSet("z", {}, toBytes("1"));
  });
  waiter->wait({"x", "y", "z"}, kLong);
  t.join();
  EXPECT_TRUE(waiter->check({"x", "y", "z"}));
}

TYPED_TEST(StoreTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  auto s = this->kind_.open(kLong);
  s->set("present", "1");
  try {
    s->wait({"gone1", "present", "gone2"}, kShort);
    FAIL() << "wait returned without its keys";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("\"gone1\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"gone2\""), std::string::npos) << msg;
    EXPECT_EQ(msg.find("\"present\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 of 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find(s->describe()), std::string::npos) << msg;
  }
  // A timed-out wait leaves the store usable, and a later set is still seen.
  s->set("gone1", "1");
  s->set("gone2", "1");
  s->wait({"gone1", "gone2"}, kLong);
}

TYPED_TEST(StoreTest, ManyWaitersOnOneKeyAllWake) {
  constexpr int kWaiters = 4;
  std::vector<StorePtr> handles;
  for (int i = 0; i <= kWaiters; ++i) handles.push_back(this->kind_.open(kLong));
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i)
    threads.emplace_back([&, i] {
      handles[i]->wait({"go"}, kLong);
      EXPECT_EQ(handles[i]->getString("go"), "now");
      ++woke;
    });
  std::this_thread::sleep_for(30ms);
  handles[kWaiters]->set("go", "now");
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), kWaiters);
}

TYPED_TEST(StoreTest, ConcurrentAddsFromThreadsAreAtomic) {
  constexpr int kThreads = 4, kAdds = 50;
  std::vector<StorePtr> handles;
  for (int i = 0; i < kThreads; ++i) handles.push_back(this->kind_.open(kLong));
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < kAdds; ++j) seen[i].push_back(handles[i]->add("counter", 1));
      handles[i]->set("thread" + std::to_string(i), "done");
    });
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  // Every add returned a distinct value: 1..total.
  EXPECT_EQ(all.size(), size_t{kThreads * kAdds});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EXPECT_EQ(handles[0]->getString("counter"), std::to_string(kThreads * kAdds));
  EXPECT_EQ(handles[0]->numKeys(), 1 + kThreads);
}

TYPED_TEST(StoreTest, SeveralThreadsShareOneHandle) {
  auto s = this->kind_.open(kLong);
  std::vector<std::thread> threads;
  // One thread blocks in a wait on the shared handle while the others keep using it.
  std::thread blocked([&] { s->wait({"release"}, kLong); });
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < 20; ++j) {
        std::string key = fmt::format("t{}_{}", i, j);  // (operator+ chains trip a GCC 12 -Wrestrict false positive)
        s->set(key, std::to_string(j));
        EXPECT_EQ(s->getString(key), std::to_string(j));
        s->add("shared", 1);
      }
    });
  for (auto& t : threads) t.join();
  s->set("release", "1");
  blocked.join();
  EXPECT_EQ(s->getString("shared"), "60");
}

TYPED_TEST(StoreTest, ConcurrentProcesses) {
  if constexpr (!TypeParam::kMultiProcess) {
    GTEST_SKIP() << "this store lives in one process";
  } else if constexpr (TypeParam::kChildStartsThreads && kThreadSanitizer) {
    GTEST_SKIP() << "ThreadSanitizer does not support threads started in a child of a multi-threaded fork";
  } else {
    constexpr int kChildren = 3, kAdds = 20;
    auto parent = this->kind_.open(kLong);
    auto& kind = this->kind_;
    // Fork only once the parent's own connection is set up and its store threads are idle (see
    // runChildren: a thread busy at the fork may leave a lock held in the child).
    (void)parent->check({"counter"});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto codes = runChildren(kChildren, [&](int i) {
      auto s = kind.open(kLong);
      for (int j = 0; j < kAdds; ++j) s->add("counter", 1);
      s->set("child" + std::to_string(i), std::to_string(getpid()));
      // Every child waits for every other: a barrier across processes.
      std::vector<std::string> all;
      for (int c = 0; c < kChildren; ++c) all.push_back("child" + std::to_string(c));
      s->wait(all, kLong);
      if (s->getString("counter") != std::to_string(kChildren * kAdds))
        throw std::runtime_error("counter is " + s->getString("counter"));
    });
    for (int c : codes) EXPECT_EQ(c, 0);
    EXPECT_EQ(parent->getString("counter"), std::to_string(kChildren * kAdds));
    EXPECT_EQ(parent->numKeys(), 1 + kChildren);
  }
}

// ---- PrefixStore specifics ------------------------------------------------------------------

TEST(PrefixStore, PrefixesIsolateKeysInOneStore) {
  auto base = std::make_shared<HashStore>(Millis{kShort});
  PrefixStore a("a", base), b("b", base);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(a.getString("k"), "from a");
  EXPECT_EQ(b.getString("k"), "from b");
  EXPECT_EQ(base->getString("a/k"), "from a");
  a.set("only-a", "1");
  EXPECT_FALSE(b.check({"only-a"}));
  EXPECT_FALSE(b.deleteKey("only-a"));
  EXPECT_TRUE(a.check({"only-a"}));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  // numKeys is the wrapped store's count, over all prefixes.
  EXPECT_EQ(a.numKeys(), 5);
  EXPECT_THROW(b.wait({"only-a"}, Millis{50}), TimeoutError);
  // Prefixes nest.
  auto inner = std::make_shared<PrefixStore>("inner", std::make_shared<PrefixStore>("outer", base));
  inner->set("x", "1");
  EXPECT_EQ(base->getString("outer/inner/x"), "1");
  EXPECT_NE(inner->describe().find("HashStore"), std::string::npos);
}

TEST(PrefixStore, OwnTimeoutAppliesToGet) {
  auto base = std::make_shared<HashStore>(kLong);
  PrefixStore p("p", base);
  p.setTimeout(Millis{100});
  try {
    p.get("missing");
    FAIL() << "get returned";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("PrefixStore(\"p\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"missing\""), std::string::npos) << msg;
  }
}

TEST(PrefixStore, NullStoreIsRejected) { EXPECT_THROW(PrefixStore("p", nullptr), ValueError); }

}  // namespace
}  // namespace cohort::dist::testing
