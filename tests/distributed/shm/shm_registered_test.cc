// The shm backend's registered buffers (ProcessGroup::allocateCommBuffer): tensors in memory every
// rank maps, whose allreduce runs in place across the ranks' buffers. Ranks are threads. Every
// result is checked element by element against a locally computed reference, for every dtype and
// reduction; the cases where ranks disagree (only some registered, different offsets, different
// sizes, one rank that never comes) must still give the right answer or a named error, and leave
// the group usable; and nothing may stay in /dev/shm or mapped once the tensors are gone.
#include <chrono>

#include <cohort/config.h>
#include <cohort/distributed/shm/shm_backend.h>

#include "distributed/env_guard.h"
#include "distributed/fork_util.h"
#include "distributed/pg_test_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

#if COHORT_USE_SHM

shm_backend::ShmBackend& shmOf(ProcessGroup& pg) {
  return dynamic_cast<shm_backend::ShmBackend&>(pg.backend(DeviceType::CPU));
}

// "shm" where rank 1 may place no buffer above 1000 bytes in /dev/shm (as a full /dev/shm would
// refuse it), the others any.
const bool kCappedRegistered = [] {
  registerBackend("shm_capped_rank1",
                  [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
                    shm_backend::ShmConfig c = shm_backend::ShmConfig::fromEnv();
                    if (rank == 1) c.maxBufferBytes = 1000;
                    return std::make_shared<shm_backend::ShmBackend>(store, rank, size, opts, c);
                  });
  return true;
}();

// Fills `t` (contiguous, any dtype) with f(i).
void fill(Tensor& t, const std::function<double(int64_t)>& f) { t.copy_(filled(t.dtype(), t.numel(), f)); }

// "cohort_<token>_world_": the stem of every shm name of a world group.
std::string stemOf(ProcessGroup& pg) {
  const std::string& n = shmOf(pg).segmentNames()[0];
  return n.substr(1, n.rfind('_'));
}

// 40,003 elements: above the one-round size (32 KiB) for every dtype but the 1-byte ones, which
// get 2^16+5 elements instead.
int64_t largeCount(DType d) { return elementSize(d) == 1 ? (1 << 16) + 5 : 40'003; }

TEST(ShmRegistered, AllreduceInPlaceMatchesTheReferenceForEveryDtypeAndOp) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    ThreadWorld w("shm", world);
    w.run([&](int r) {
      ProcessGroup& pg = w.pg(r);
      for (DType d : kAllDTypes) {
        const int64_t n = largeCount(d);
        Tensor buf = pg.allocateCommBuffer({n}, d);
        ASSERT_EQ(buf.sizes(), Shape{n});
        ASSERT_EQ(buf.dtype(), d);
        // Zeroed.
        COHORT_EXPECT_MATCH(buf, n, [](int64_t) { return 0.0; });
        for (ReduceOp op : kAllReduceOps) {
          if (op == ReduceOp::Avg && !isFloating(d)) continue;
          fill(buf, [&](int64_t i) { return value(d, op, r, i); });
          const uint64_t before = shmOf(pg).registeredAllreduces();
          pg.allreduce(buf, {.op = op})->wait();
          EXPECT_EQ(shmOf(pg).registeredAllreduces(), before + 1) << dtypeName(d) << " " << static_cast<int>(op);
          COHORT_EXPECT_MATCH(buf, n, [&](int64_t i) { return reduceRef(d, op, world, i); });
        }
      }
    });
  }
}

TEST(ShmRegistered, ViewsAtTheSameOffsetRunInPlaceAndLeaveTheRestAlone) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  ThreadWorld w("shm", 3);
  w.run([&](int r) {
    ProcessGroup& pg = w.pg(r);
    const int64_t n = 100'000;
    Tensor buf = pg.allocateCommBuffer({n}, DType::Float32);
    fill(buf, [](int64_t) { return -7.0; });
    // An odd offset and length: slices do not fall on cache lines of the view.
    Tensor part = buf.narrow(0, 5, n - 11);
    fill(part, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
    const uint64_t before = shmOf(pg).registeredAllreduces();
    pg.allreduce(part)->wait();
    EXPECT_EQ(shmOf(pg).registeredAllreduces(), before + 1);
    COHORT_EXPECT_MATCH(part, n - 11, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 3, i); });
    COHORT_EXPECT_MATCH(buf.narrow(0, 0, 5), 5, [](int64_t) { return -7.0; });
    COHORT_EXPECT_MATCH(buf.narrow(0, n - 6, 6), 6, [](int64_t) { return -7.0; });
  });
}

// Only some ranks' tensors registered, or at different offsets: every rank runs the slot
// algorithm (from a fresh round), the answer is right, and the group stays in step for the next op.
TEST(ShmRegistered, RanksThatDisagreeFallBackTogether) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  for (int world : {2, 3}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    ThreadWorld w("shm", world);
    w.run([&](int r) {
      ProcessGroup& pg = w.pg(r);
      const int64_t n = 50'001;
      Tensor buf = pg.allocateCommBuffer({n + 2}, DType::Float64);
      auto check = [&](Tensor t, const char* what) {
        fill(t, [&](int64_t i) { return value(DType::Float64, ReduceOp::Max, r, i); });
        const uint64_t before = shmOf(pg).registeredAllreduces();
        pg.allreduce(t, {.op = ReduceOp::Max})->wait();
        EXPECT_EQ(shmOf(pg).registeredAllreduces(), before) << what;
        COHORT_EXPECT_MATCH(t, n, [&](int64_t i) { return reduceRef(DType::Float64, ReduceOp::Max, world, i); });
      };
      // Rank 0 registered, the others plain; then the reverse.
      check(r == 0 ? buf.narrow(0, 0, n) : zeros({n}, {.dtype = DType::Float64}), "rank 0 only");
      check(r != 0 ? buf.narrow(0, 0, n) : zeros({n}, {.dtype = DType::Float64}), "all but rank 0");
      // Every rank registered, at offsets that differ by rank.
      check(buf.narrow(0, r % 2, n), "different offsets");
      // And then all alike: in place again.
      Tensor all = buf.narrow(0, 1, n);
      fill(all, [&](int64_t i) { return value(DType::Float64, ReduceOp::Sum, r, i); });
      pg.allreduce(all)->wait();
      COHORT_EXPECT_MATCH(all, n, [&](int64_t i) { return reduceRef(DType::Float64, ReduceOp::Sum, world, i); });
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(shmOf(w.pg(r)).registeredAllreduces(), 1u) << "rank " << r;
  }
}

TEST(ShmRegistered, SizesThatDifferAreADistErrorOnEveryRankAndTheGroupGoesOn) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  ThreadWorld w("shm", 3);
  std::vector<std::string> messages(3);
  w.run([&](int r) {
    ProcessGroup& pg = w.pg(r);
    try {
      pg.allocateCommBuffer({r == 2 ? 1001 : 1000}, DType::Float32);
    } catch (const DistError& e) {
      messages[r] = e.what();
    }
    Tensor buf = pg.allocateCommBuffer({20'000}, DType::Float32);
    fill(buf, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
    pg.allreduce(buf)->wait();
    COHORT_EXPECT_MATCH(buf, 20'000, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 3, i); });
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(fmt::format("rank {}: {}", r, messages[r]));
    EXPECT_NE(messages[r].find("allocateCommBuffer"), std::string::npos);
    EXPECT_NE(messages[r].find("4004 bytes"), std::string::npos);  // rank 2's 1001 float32
    EXPECT_NE(messages[r].find("rank 2"), std::string::npos);
  }
  EXPECT_EQ(messages[0], messages[1]);
}

// One rank that cannot place its buffer (here a size cap; in a container, a small /dev/shm) is
// no error: every rank gets plain memory, the allreduce still runs (through the slots), nothing
// stays in /dev/shm, and the group goes on to place a buffer that fits.
TEST(ShmRegistered, ARankThatCannotPlaceItsBufferMakesEveryRankFallBack) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  ThreadWorld w("shm_capped_rank1", 3);
  const std::string stem = stemOf(w.pg(0));
  std::vector<Tensor> smalls(3);
  w.run([&](int r) {
    ProcessGroup& pg = w.pg(r);
    Tensor big = pg.allocateCommBuffer({20'000}, DType::Float32);  // 80 KB: above rank 1's cap
    COHORT_EXPECT_MATCH(big, 20'000, [](int64_t) { return 0.0; });
    fill(big, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
    pg.allreduce(big)->wait();
    COHORT_EXPECT_MATCH(big, 20'000, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 3, i); });
    EXPECT_EQ(shmOf(pg).registeredAllreduces(), 0u);
    smalls[r] = pg.allocateCommBuffer({200}, DType::Float32);  // 800 B: fits everywhere
  });
  EXPECT_TRUE(devShmEntries(stem).empty());
  EXPECT_EQ(mappedRegions(stem + "0_b0"), 0);  // the fallen-back buffer mapped nothing
  EXPECT_EQ(mappedRegions(stem + "0_b1"), 3);  // the small one: every rank maps rank 0's
}

TEST(ShmRegistered, AMaxBufferBytesBelowZeroIsRefused) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  EnvGuard env;
  env.set("COHORT_SHM_MAX_BUFFER_BYTES", "-1");
  try {
    ThreadWorld w("shm", 2, Millis(5'000));
    ADD_FAILURE() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_SHM_MAX_BUFFER_BYTES"), std::string::npos) << e.what();
  }
}

TEST(ShmRegistered, ARankThatNeverComesIsATimeoutNamingIt) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  ThreadWorld w("shm", 2, Millis(400));
  std::string message;
  auto start = std::chrono::steady_clock::now();
  w.run([&](int r) {
    if (r == 1) return;  // never allocates
    try {
      w.pg(0).allocateCommBuffer({1000}, DType::Float32);
    } catch (const TimeoutError& e) {
      message = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(message.find("allocateCommBuffer"), std::string::npos) << message;
  EXPECT_NE(message.find("rank [1]"), std::string::npos) << message;
}

TEST(ShmRegistered, NamesGoAtOnceAndMappingsWithTheLastTensorEvenAfterTheGroup) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  auto w = std::make_unique<ThreadWorld>("shm", 2);
  const std::string stem = stemOf(w->pg(0));
  std::vector<Tensor> bufs(2);
  w->run([&](int r) {
    bufs[r] = w->pg(r).allocateCommBuffer({30'000}, DType::Float32);
    fill(bufs[r], [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
    w->pg(r).allreduce(bufs[r])->wait();
  });
  EXPECT_TRUE(devShmEntries(stem).empty());
  // Segments: 2 ranks x 2 mapped; buffers: 2 ranks x 2 mapped.
  EXPECT_EQ(mappedRegions(stem + "0_b0"), 2);
  EXPECT_EQ(mappedRegions(stem + "1_b0"), 2);
  w.reset();  // the group goes; the tensors stay valid
  for (int r = 0; r < 2; ++r) {
    COHORT_EXPECT_MATCH(bufs[r], 30'000, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 2, i); });
    bufs[r].add_(1.0);
  }
  bufs[0] = Tensor();
  EXPECT_EQ(mappedRegions(stem + "0_b0"), 1);  // rank 1's tensor still maps both buffers
  bufs[1] = Tensor();
  EXPECT_EQ(mappedRegions(stem), 0);
  EXPECT_TRUE(devShmEntries(stem).empty());
}

TEST(ShmRegistered, WorkerModeAndOneRankGivePlainMemory) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  {
    EnvGuard env;
    env.set("COHORT_COLLECTIVE_THREAD", "worker");
    ThreadWorld w("shm", 2);
    w.run([&](int r) {
      Tensor buf = w.pg(r).allocateCommBuffer({20'000}, DType::Float32);
      fill(buf, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i); });
      w.pg(r).allreduce(buf)->wait();
      COHORT_EXPECT_MATCH(buf, 20'000, [&](int64_t i) { return reduceRef(DType::Float32, ReduceOp::Sum, 2, i); });
      EXPECT_EQ(shmOf(w.pg(r)).registeredAllreduces(), 0u);
    });
  }
  ThreadWorld one("shm", 1);
  Tensor buf = one.pg(0).allocateCommBuffer({3, 4}, DType::Int32);
  EXPECT_EQ(buf.sizes(), (Shape{3, 4}));
  COHORT_EXPECT_MATCH(buf.flatten(), 12, [](int64_t) { return 0.0; });
  EXPECT_THROW(one.pg(0).allocateCommBuffer({-1}, DType::Float32), ValueError);
}

#endif  // COHORT_USE_SHM

}  // namespace
}  // namespace cohort::dist::testing
