// The MPI backend under mpirun: ctest runs this binary as `mpirun -np N` for N = 1..4, once more
// with collectives on the backend's worker thread (and once plainly per test, as an MPI singleton
// of one rank). Every rank is a process; the world group is a ProcessGroup with backend "mpi"
// over a FileStore in a directory rank 0 makes and broadcasts.
// The ops themselves are checked by the backend-neutral collectives suite (collectives_suite.h),
// instantiated here on a World whose one rank is this process. What stays below is MPI's own:
// truncated receives, MPI's tag range, ranks that are not MPI ranks, and the collective-thread
// modes with their timeouts.
#include <cohort/distributed/mpi/detail/mpi_api.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>
#include <cohort/distributed/mpi/detail/mpi_environment.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

#include "distributed/collectives_suite.h"

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer builds (scripts/test.sh --sanitize): OpenMPI does not free what MPI_Init and its
// dlopen'ed components allocate, so LeakSanitizer would fail every test of this binary on
// OpenMPI's own allocations. Those are suppressed by library; cohort's code stays checked. The
// components are unloaded by exit, so their frames are anonymous: the slow unwinder follows the
// stack on into libmpi / libopen-pal, where the suppressions match.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libpmix.so\nleak:libhwloc.so\n"
         "leak:libevent\n";
}
extern "C" const char* __lsan_default_options() { return "fast_unwind_on_malloc=0:print_suppressions=0"; }
#endif

namespace cohort::dist {
namespace {

using testing::Collectives;
using testing::collectivesParamName;
using testing::World;

using namespace std::chrono_literals;

struct MpiJob {
  std::shared_ptr<mpi_backend::MpiEnvironment> env;
  std::filesystem::path dir;
  StorePtr store;
  ProcessGroupPtr pg;
};
MpiJob* gWorld = nullptr;

class MpiJobSetup : public ::testing::Environment {
 public:
  void SetUp() override {
    gWorld = new MpiJob;
    gWorld->env = mpi_backend::MpiEnvironment::get();
    // Rank 0 makes a fresh directory for the FileStore and tells the others where it is.
    char path[4096] = {};
    if (gWorld->env->worldRank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "cohort_mpi_test_XXXXXX").string();
      ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
      std::snprintf(path, sizeof(path), "%s", tmpl.c_str());
    }
    MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
    gWorld->dir = path;
    gWorld->store = std::make_shared<FileStore>((gWorld->dir / "store").string());
    ProcessGroupOptions o;
    o.backend = "mpi";
    o.timeout = 120'000ms;
    gWorld->pg = ProcessGroup::create(gWorld->store, gWorld->env->worldRank(), gWorld->env->worldSize(), o);
  }
  void TearDown() override {
    gWorld->pg.reset();
    gWorld->store.reset();
    MPI_Barrier(MPI_COMM_WORLD);  // every FileStore is closed before the directory goes
    if (gWorld->env->worldRank() == 0) {
      std::error_code ec;
      std::filesystem::remove_all(gWorld->dir, ec);
    }
    auto env = std::move(gWorld->env);
    delete gWorld;
    gWorld = nullptr;
  }
};
[[maybe_unused]] ::testing::Environment* const kWorld = ::testing::AddGlobalTestEnvironment(new MpiJobSetup);

ProcessGroup& pg() { return *gWorld->pg; }
int rank() { return gWorld->pg->rank(); }
int worldSize() { return gWorld->pg->size(); }

TensorOptions opts(DType dt) {
  TensorOptions o;
  o.dtype = dt;
  return o;
}

// Waits; a failure is reported but the test goes on, so ranks stay in step.
bool waitOk(const WorkPtr& w, const std::string& what) {
  try {
    w->wait();
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " on rank " << rank() << ": " << e.what();
    return false;
  }
}

// ---- the collectives suite, one rank per process -------------------------------------------

// This process's rank of the mpirun job: run(fn) runs fn for it alone. A rank whose check fails
// stops issuing collectives; the others' next one then fails at the group's timeout (120 s; in
// caller mode MPI_Abort ends the job), so a wrong value fails the run rather than hanging it.
class MpiProcessWorld : public World {
 public:
  int size() const override { return worldSize(); }
  ProcessGroup& pg(int r) override {
    if (r != rank()) throw std::logic_error(fmt::format("rank {} asked for rank {}'s group", rank(), r));
    return ::cohort::dist::pg();
  }
  void run(const std::function<void(int)>& fn) override {
    try {
      fn(rank());
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("rank {}: {}", rank(), e.what()));
    }
  }
};

const bool kMpiWorldRegistered = [] {
  ::cohort::testing::worldFactories()["mpi"] = [](const std::string&, int size) -> std::unique_ptr<World> {
    if (size != worldSize())
      throw std::logic_error(fmt::format("the suite expected {} ranks, mpirun started {}", size, worldSize()));
    return std::make_unique<MpiProcessWorld>();
  };
  return true;
}();

// The job's size, known before MPI_Init from the launcher's environment (OpenMPI, then MPICH and
// other PMI launchers); 1 for a plain run, an MPI singleton.
int launcherWorldSize() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 1;
}

INSTANTIATE_TEST_SUITE_P(Mpi, Collectives,
                         ::testing::Combine(::testing::Values(std::string("mpi")),
                                            ::testing::Values(launcherWorldSize())),
                         collectivesParamName);

// ---- MPI's own ---------------------------------------------------------------------------------

// MPI_Reduce writes the root's buffer only: every other rank's tensor is left as it was (a promise
// the gloo backend, which reduces in place on every rank, does not make).
TEST(MpiBackend, ReduceLeavesTheOtherRanksTensorsAsTheyWere) {
  const int n = worldSize(), r = rank();
  for (DType d : testing::kAllDTypes) {
    for (int root = 0; root < n; ++root) {
      for (int64_t count : {int64_t{0}, int64_t{7}, testing::kLargeCount}) {
        auto mine =
            testing::periodic([&](int64_t i) { return testing::roundTo(d, testing::value(d, ReduceOp::Min, r, i)); });
        Tensor t = testing::filled(d, count, mine);
        if (!waitOk(pg().reduce(t, {.op = ReduceOp::Min, .root = root}), "reduce") || r == root) continue;
        EXPECT_EQ(testing::mismatch(t, count, mine), "") << dtypeName(d) << " root " << root << " n=" << count;
      }
    }
  }
}

TEST(MpiBackend, RecvSizeMismatchIsADistError) {
  const int n = worldSize(), r = rank();
  if (n == 1) GTEST_SKIP() << "send/recv need two ranks";
  SendRecvOptions o;
  o.tag = 3;
  if (r == 0) {
    Tensor big = zeros({10}, opts(DType::Float32)), small = zeros({3}, opts(DType::Float32));
    waitOk(pg().send(big, 1, o), "send 10");
    waitOk(pg().send(small, 1, o), "send 3");
  } else if (r == 1) {
    Tensor t = zeros({5}, opts(DType::Float32));
    auto w = pg().recv(t, 0, o);  // 10 elements into 5: MPI_ERR_TRUNCATE
    EXPECT_THROW(w->wait(), DistError);
    EXPECT_FALSE(w->isSuccess());
    auto w2 = pg().recv(t, 0, o);  // 3 elements into 5
    try {
      w2->wait();
      ADD_FAILURE() << "a short message was accepted";
    } catch (const DistError& e) {
      EXPECT_NE(std::string(e.what()).find("received 3 elements"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("recv"), std::string::npos) << e.what();
    }
  }
  waitOk(pg().barrier(), "barrier");
}

TEST(MpiBackend, TagOutsideMpiRangeIsRejected) {
  if (worldSize() == 1) GTEST_SKIP() << "send/recv need two ranks";
  Tensor t = zeros({1}, opts(DType::Float32));
  SendRecvOptions o;
  o.tag = gWorld->env->tagUpperBound();
  if (o.tag == INT_MAX) GTEST_SKIP() << "MPI's tag range covers every non-negative int";
  o.tag += 1;
  EXPECT_THROW(pg().send(t, (rank() + 1) % worldSize(), o), ValueError);
}

TEST(MpiBackend, RanksThatAreNotMpiRanksAreRefused) {
  const int n = worldSize(), r = rank();
  if (n == 1) GTEST_SKIP() << "needs two ranks to misnumber";
  try {
    // Rank numbers shifted by one: the factory refuses before any collective MPI call.
    ProcessGroupOptions o;
    o.backend = "mpi";
    o.name = "misnumbered";
    ProcessGroup::create(gWorld->store, (r + 1) % n, n, o);
    ADD_FAILURE() << "a group whose ranks are not the MPI ranks was accepted";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_COMM_WORLD"), std::string::npos) << e.what();
  }
}

// ---- timeouts ----------------------------------------------------------------------------------

// Sets COHORT_COLLECTIVE_THREAD for the backends created while it lives (read at creation).
class CollectiveThreadGuard {
 public:
  explicit CollectiveThreadGuard(const char* where) {
    if (const char* v = std::getenv("COHORT_COLLECTIVE_THREAD")) old_ = v;
    setenv("COHORT_COLLECTIVE_THREAD", where, 1);
  }
  ~CollectiveThreadGuard() {
    if (old_.empty()) {
      unsetenv("COHORT_COLLECTIVE_THREAD");
    } else {
      setenv("COHORT_COLLECTIVE_THREAD", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

TEST(MpiBackend, CollectiveThreadKnobIsChecked) {
  CollectiveThreadGuard guard("elsewhere");
  try {
    pg().split(0, rank());
    ADD_FAILURE() << "a bad COHORT_COLLECTIVE_THREAD was accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("COHORT_COLLECTIVE_THREAD"), std::string::npos) << msg;
    EXPECT_NE(msg.find("elsewhere"), std::string::npos) << msg;
  }
}

// Caller mode completes every op before returning, also with two groups driven by two threads at
// once (legal under MPI_THREAD_MULTIPLE: each group has its own communicator, and its own slot for
// the watchdog): every op of each group completes with the right sum, none is lost.
TEST(MpiBackend, CallerModeCompletesEveryOpBeforeReturningEvenOnTwoThreads) {
  CollectiveThreadGuard guard("caller");
  auto g1 = pg().split(0, rank());
  auto g2 = pg().split(0, rank());
  ASSERT_NE(g1, nullptr);
  ASSERT_NE(g2, nullptr);
  const int n = worldSize(), r = rank();
  auto drive = [&](dist::ProcessGroup& g, int salt, int& wrong, int& failed) {
    for (int i = 0; i < 300; ++i) {
      Tensor t = full({3}, Scalar(static_cast<double>(r + salt + i)), opts(DType::Float32));
      auto w = g.allreduce(t);
      if (!w->isCompleted()) ++failed;  // caller mode completes before returning
      try {
        w->wait(10s);
      } catch (const std::exception&) {
        ++failed;
        continue;
      }
      const float want = static_cast<float>(n * (salt + i) + n * (n - 1) / 2);
      for (int64_t k = 0; k < 3; ++k) wrong += t.data<float>()[k] != want;
    }
  };
  int wrong1 = 0, failed1 = 0, wrong2 = 0, failed2 = 0;
  std::thread other([&] { drive(*g2, 1000, wrong2, failed2); });
  drive(*g1, 0, wrong1, failed1);
  other.join();
  EXPECT_EQ(wrong1 + failed1, 0) << "group 1: " << wrong1 << " wrong elements, " << failed1 << " failed ops";
  EXPECT_EQ(wrong2 + failed2, 0) << "group 2: " << wrong2 << " wrong elements, " << failed2 << " failed ops";
  waitOk(pg().barrier(), "barrier");
}

// In caller mode a collective past its deadline ends the job: ctest runs this alone under
// `mpirun -np 2` with COHORT_TEST_MPI_CALLER_TIMEOUT=1 and expects the logged error, naming the op,
// the group and the rank that never came (distributed.mpi.caller_timeout_aborts_the_job).
TEST(MpiCallerTimeout, EndsTheJobNamingTheMissingRank) {
  if (!std::getenv("COHORT_TEST_MPI_CALLER_TIMEOUT")) GTEST_SKIP() << "run by its own ctest entry";
  ASSERT_EQ(worldSize(), 2);
  CollectiveThreadGuard guard("caller");
  auto group = pg().split(0, rank());
  ASSERT_NE(group, nullptr);
  if (rank() == 0) {
    AllreduceOptions o;
    o.timeout = 500ms;
    Tensor t = zeros({4}, opts(DType::Float32));
    group->allreduce(t, o);  // rank 1 never comes: the watchdog must end the job
    ADD_FAILURE() << "the allreduce returned although rank 1 never called it";
  } else {
    std::this_thread::sleep_for(60s);  // mpirun kills this rank when rank 0 aborts
  }
}

TEST(MpiBackend, CollectiveTimeoutFailsTheWorkAndAbortsTheGroup) {
  const int n = worldSize(), r = rank();
  if (n == 1) GTEST_SKIP() << "a lone rank never waits for anyone";
  CollectiveThreadGuard guard("worker");  // only worker mode can turn a stuck MPI call into an exception
  auto group = pg().split(0, r);
  ASSERT_NE(group, nullptr);
  if (r == 0) {
    // The others arrive 3 s late: rank 0's barrier times out after 300 ms.
    BarrierOptions o;
    o.timeout = 300ms;
    auto start = std::chrono::steady_clock::now();
    auto w = group->barrier(o);
    Tensor queued = zeros({2}, opts(DType::Float32));
    auto behind = group->allreduce(queued);  // queued behind the barrier
    try {
      w->wait();
      ADD_FAILURE() << "the barrier did not time out";
    } catch (const TimeoutError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("barrier #1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
      EXPECT_NE(msg.find(group->name()), std::string::npos) << msg;
    }
    // Generous bound: the point is that it does not wait for the late ranks (3 s) or hang.
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2900ms);
    try {
      behind->wait();
      ADD_FAILURE() << "an op queued behind a timed-out collective ran";
    } catch (const DistError& e) {
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
  } else {
    std::this_thread::sleep_for(3s);
    waitOk(group->barrier(), "late barrier");  // releases rank 0's blocked MPI_Barrier
  }
  // Once everyone arrived the blocked barrier comes back, and the group can be destroyed.
  waitOk(pg().barrier(), "world barrier");
  group.reset();
}

}  // namespace
}  // namespace cohort::dist
