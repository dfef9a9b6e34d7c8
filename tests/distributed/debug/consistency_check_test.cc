// COHORT_DEBUG=DETAIL's cross-rank check, with ranks as threads over one HashStore: matching calls
// pass; one rank with another op, shape, dtype, reduction or root makes every rank throw a
// DistError listing each rank's call; a rank that never arrives is a TimeoutError naming it.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include <cohort/core/util/error.h>
#include <cohort/distributed/debug/consistency_check.h>
#include <cohort/distributed/store/hash_store.h>

using namespace cohort;
using namespace cohort::dist;

namespace {

CollectiveFingerprint allreduce(std::vector<int64_t> shape, std::string dtype = "float32",
                                ReduceOp op = ReduceOp::Sum) {
  CollectiveFingerprint f;
  f.op = OpType::Allreduce;
  f.dtype = std::move(dtype);
  f.shapes = {std::move(shape)};
  f.reduceOp = op;
  return f;
}

// Runs the check on `size` threads, rank r with fingerprint(r); returns each rank's error text
// ("" when it passed).
std::vector<std::string> runRanks(Store& store, int size, uint64_t seq,
                                  const std::function<CollectiveFingerprint(int)>& fingerprint,
                                  Millis timeout = Millis(30'000), std::vector<char>* wasDistError = nullptr) {
  std::vector<std::string> errors(size);
  std::vector<char> dist(size, 0);  // not vector<bool>: ranks write their own entries concurrently
  std::vector<std::thread> ts;
  for (int r = 0; r < size; ++r) {
    ts.emplace_back([&, r] {
      try {
        checkCollectiveConsistency(store, "world", r, size, seq, fingerprint(r), timeout);
      } catch (const DistError& e) {
        errors[r] = e.what();
        dist[r] = 1;
      } catch (const std::exception& e) {
        errors[r] = std::string("unexpected: ") + e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (wasDistError) *wasDistError = dist;
  return errors;
}

}  // namespace

TEST(ConsistencyCheck, Describe) {
  EXPECT_EQ(allreduce({4, 8}).describe(), "allreduce(dtype=float32, shapes=[[4, 8]], op=sum)");
  CollectiveFingerprint b;
  b.op = OpType::Broadcast;
  b.dtype = "int64";
  b.shapes = {{3}, {}};
  b.root = 2;
  EXPECT_EQ(b.describe(), "broadcast(dtype=int64, shapes=[[3], []], root=2)");
  CollectiveFingerprint bar;
  bar.op = OpType::Barrier;
  EXPECT_EQ(bar.describe(), "barrier(dtype=-, shapes=[])");
}

TEST(ConsistencyCheck, MatchingCallsPassManySequenceNumbers) {
  for (int size : {1, 2, 3, 5}) {
    HashStore s;
    for (uint64_t seq = 1; seq <= 6; ++seq) {
      auto errors = runRanks(s, size, seq, [](int) { return allreduce({16, 3}); });
      for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "size " << size << " seq " << seq << " rank " << r;
    }
    // Each rank deletes its key of seq - 2, so only the last two sequence numbers stay.
    EXPECT_EQ(s.numKeys(), 2 * size) << size;
  }
}

TEST(ConsistencyCheck, DifferentShapeFailsOnEveryRank) {
  HashStore store;
  std::vector<char> dist;
  auto errors = runRanks(
      store, 4, 7,
      [](int r) {
        return allreduce(r == 2 ? std::vector<int64_t>{4, 9} : std::vector<int64_t>{4, 8});
      },
      Millis(30'000), &dist);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(dist[r]) << r << ": " << errors[r];
    const std::string& m = errors[r];
    EXPECT_NE(m.find("collective mismatch in group 'world' at sequence number 7"), std::string::npos) << m;
    EXPECT_NE(m.find("\n  rank 0: allreduce(dtype=float32, shapes=[[4, 8]], op=sum)\n"), std::string::npos) << m;
    EXPECT_NE(m.find("\n  rank 1: allreduce(dtype=float32, shapes=[[4, 8]], op=sum)\n"), std::string::npos) << m;
    EXPECT_NE(m.find("\n  rank 2: allreduce(dtype=float32, shapes=[[4, 9]], op=sum)   <-- differs\n"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("\n  rank 3: allreduce(dtype=float32, shapes=[[4, 8]], op=sum)"), std::string::npos) << m;
    EXPECT_EQ(m, errors[0]);  // every rank reports the same thing
  }
}

TEST(ConsistencyCheck, DifferentOpFailsOnEveryRank) {
  HashStore store;
  auto errors = runRanks(store, 3, 1, [](int r) {
    if (r != 0) return allreduce({10});
    CollectiveFingerprint f;
    f.op = OpType::Broadcast;
    f.dtype = "float32";
    f.shapes = {{10}};
    f.root = 0;
    return f;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 0: broadcast(dtype=float32, shapes=[[10]], root=0)   <-- differs"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("rank 1: allreduce(dtype=float32, shapes=[[10]], op=sum)\n"), std::string::npos)
        << errors[r];
  }
}

TEST(ConsistencyCheck, DtypeReductionAndRootMismatches) {
  {
    HashStore store;
    auto errors = runRanks(store, 2, 1, [](int r) { return allreduce({5}, r == 0 ? "float32" : "float16"); });
    for (const auto& e : errors) EXPECT_NE(e.find("rank 1: allreduce(dtype=float16"), std::string::npos) << e;
  }
  {
    HashStore store;
    auto errors =
        runRanks(store, 2, 1, [](int r) { return allreduce({5}, "float32", r == 0 ? ReduceOp::Sum : ReduceOp::Max); });
    for (const auto& e : errors)
      EXPECT_NE(e.find("rank 1: allreduce(dtype=float32, shapes=[[5]], op=max)"), std::string::npos) << e;
  }
  {
    HashStore store;
    auto errors = runRanks(store, 2, 1, [](int r) {
      CollectiveFingerprint f;
      f.op = OpType::Reduce;
      f.dtype = "int32";
      f.shapes = {{2}};
      f.reduceOp = ReduceOp::Sum;
      f.root = r;  // each rank thinks it is the root
      return f;
    });
    for (const auto& e : errors) {
      EXPECT_NE(e.find("rank 0: reduce(dtype=int32, shapes=[[2]], op=sum, root=0)"), std::string::npos) << e;
      EXPECT_NE(e.find("rank 1: reduce(dtype=int32, shapes=[[2]], op=sum, root=1)"), std::string::npos) << e;
    }
  }
}

TEST(ConsistencyCheck, MissingRankTimesOutNamingIt) {
  HashStore store;
  // Ranks 0 and 2 of 3 arrive; rank 1 never does.
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  for (int r : {0, 2}) {
    ts.emplace_back([&, r] {
      try {
        checkCollectiveConsistency(store, "world", r, 3, 4, allreduce({1}), Millis(300));
      } catch (const TimeoutError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find(
                  "check of allreduce #4 in group 'world' timed out after 300 ms: ranks [1] did not reach it"),
              std::string::npos)
        << errors[r];
  }
}

TEST(ConsistencyCheck, BadRank) {
  HashStore store;
  EXPECT_THROW(checkCollectiveConsistency(store, "world", 3, 3, 1, allreduce({1}), Millis(10)), ValueError);
}
