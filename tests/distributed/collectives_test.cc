// The backend-neutral collectives suite (collectives_suite.h) over every backend this build
// registered that runs with ranks as threads of one process: gloo for now (shm and hierarchical
// instantiate it in their own binaries, MPI in mpi_test.cc, one mpirun process per rank).
#include "distributed/collectives_suite.h"
#include "distributed/env_guard.h"

namespace cohort::dist::testing {
namespace {

std::vector<std::string> threadBackends() {
  std::vector<std::string> out;
  for (const std::string& name : availableBackends())
    if (name == "gloo") out.push_back(name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(ThreadRanks, Collectives,
                         ::testing::Combine(::testing::ValuesIn(threadBackends()), ::testing::Values(1, 2, 3, 4, 5)),
                         collectivesParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Collectives);

// gloo runs allreduces on different memory side by side (COHORT_GLOO_THREADS workers, each op
// tagged with its sequence number): many in flight at once still give every result, two on the
// same tensor still run one after the other, and a broadcast issued between them sees neither
// overtake it.
TEST(GlooThreads, AllreducesInFlightTogetherKeepTheirResultsAndTheirOrder) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  for (const char* threads : {"1", "2", "4"}) {
    SCOPED_TRACE(fmt::format("COHORT_GLOO_THREADS={}", threads));
    EnvGuard env;
    env.set("COHORT_GLOO_THREADS", threads);
    constexpr int kWorld = 3;
    ThreadWorld world("gloo", kWorld);
    world.run([&](int r) {
      ProcessGroup& pg = world.pg(r);
      std::vector<Tensor> xs;
      std::vector<WorkPtr> works;
      for (int i = 0; i < 6; ++i) {
        const int64_t n = (i % 2 ? 200'000 : 1'000) + i;
        xs.push_back(
            filled(DType::Float32, n, [&](int64_t k) { return value(DType::Float32, ReduceOp::Sum, r, k + i); }));
      }
      Tensor y = full({50'000}, static_cast<double>(r + 1));
      Tensor z = full({10}, static_cast<double>(r));
      for (int i = 0; i < 3; ++i) works.push_back(pg.allreduce(xs[i]));
      works.push_back(pg.allreduce(y));
      works.push_back(pg.broadcast(z, {.root = 1}));
      works.push_back(pg.allreduce(y));  // after the first one on y: 3 * (1 + 2 + 3)
      for (int i = 3; i < 6; ++i) works.push_back(pg.allreduce(xs[i], {.op = ReduceOp::Max}));
      for (auto& w : works) w->wait();
      for (int i = 0; i < 6; ++i) {
        const ReduceOp op = i < 3 ? ReduceOp::Sum : ReduceOp::Max;
        COHORT_EXPECT_MATCH(xs[i], xs[i].numel(),
                            [&](int64_t k) { return reduceRef(DType::Float32, op, kWorld, k + i); });
      }
      COHORT_EXPECT_MATCH(y, 50'000, [](int64_t) { return 18.0; });
      COHORT_EXPECT_MATCH(z, 10, [](int64_t) { return 1.0; });
    });
  }
}

TEST(GlooThreads, AThreadCountOutsideItsRangeIsRefused) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  for (const char* bad : {"0", "17", "two"}) {
    EnvGuard env;
    env.set("COHORT_GLOO_THREADS", bad);
    try {
      ThreadWorld world("gloo", 2, Millis(5'000));
      ADD_FAILURE() << "COHORT_GLOO_THREADS=" << bad << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("COHORT_GLOO_THREADS"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cohort::dist::testing
