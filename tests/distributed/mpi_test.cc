// The MPI backend under mpirun: ctest runs this binary as `mpirun -np N` for N = 1..4 (and once
// plainly, as an MPI singleton of one rank). Every rank is a process; the world group is a
// ProcessGroup with backend "mpi" over a FileStore in a directory rank 0 makes and broadcasts.
// Every op, dtype and reduction at element counts 0, 1, 7, 1000 and 2^20+3, each result checked
// element by element against a reference computed locally from the same per-rank formula.
// Checks use EXPECT (never an early return) so every rank issues the same collectives in the same
// order even when one of them sees a wrong value.
#include <gtest/gtest.h>
// The C API only: OpenMPI's C++ bindings would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>
#include <cohort/distributed/mpi/mpi_environment.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

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

using namespace std::chrono_literals;

const std::vector<int64_t> kCounts = {0, 1, 7, 1000, (int64_t{1} << 20) + 3};
const std::vector<DType> kAllDTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                       DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};
const std::vector<ReduceOp> kReductions = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min,
                                           ReduceOp::Max};

struct World {
  std::shared_ptr<mpi::MpiEnvironment> env;
  std::filesystem::path dir;
  StorePtr store;
  ProcessGroupPtr pg;
};
World* gWorld = nullptr;

class MpiWorld : public ::testing::Environment {
 public:
  void SetUp() override {
    gWorld = new World;
    gWorld->env = mpi::MpiEnvironment::get();
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
[[maybe_unused]] ::testing::Environment* const kWorld = ::testing::AddGlobalTestEnvironment(new MpiWorld);

ProcessGroup& pg() { return *gWorld->pg; }
int rank() { return gWorld->pg->rank(); }
int worldSize() { return gWorld->pg->size(); }

// Each rank's input: small values whose sums, products and averages are exact in float32 and
// round the same way in every dtype, so a reference computed here must match bit for bit.
template <typename T>
T inputValue(int r, int64_t i, int salt = 0) {
  if constexpr (std::is_same_v<T, bool>) {
    return (r + i + salt) % 3 == 0;
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>((r + i + salt) % 4);
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(((r * 5 + i + salt) % 7) - 3);
  } else {
    return T(static_cast<float>(((r * 7 + i * 3 + salt) % 17) - 8) * 0.25f);
  }
}

// The reduction of every rank's inputValue at i, as the backend defines it: float16/bfloat16
// accumulate in float32 and round once; bool sum/max are or, product/min are and.
template <typename T>
T reference(ReduceOp op, int64_t i, int n, int salt = 0) {
  if constexpr (std::is_same_v<T, bool>) {
    bool any = false, all = true;
    for (int r = 0; r < n; ++r) {
      any = any || inputValue<T>(r, i, salt);
      all = all && inputValue<T>(r, i, salt);
    }
    return op == ReduceOp::Sum || op == ReduceOp::Max ? any : all;
  } else {
    using A = Acc<T>;
    A acc = static_cast<A>(inputValue<T>(0, i, salt));
    for (int r = 1; r < n; ++r) {
      A v = static_cast<A>(inputValue<T>(r, i, salt));
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc = static_cast<A>(acc + v); break;
        case ReduceOp::Product: acc = static_cast<A>(acc * v); break;
        case ReduceOp::Min: acc = std::min(acc, v); break;
        case ReduceOp::Max: acc = std::max(acc, v); break;
      }
    }
    if (op == ReduceOp::Avg) acc = static_cast<A>(acc / static_cast<A>(n));
    return T(acc);
  }
}

template <typename T>
bool same(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return static_cast<double>(static_cast<float>(a)) == static_cast<double>(static_cast<float>(b)) ||
           (std::is_same_v<T, double> && static_cast<double>(a) == static_cast<double>(b));
  } else {
    return a == b;
  }
}

TensorOptions opts(DType dt) {
  TensorOptions o;
  o.dtype = dt;
  return o;
}

template <typename T>
Tensor filled(int64_t n, int r, int salt = 0) {
  Tensor t = empty({n}, opts(DTypeOf<T>::value));
  T* p = n ? t.data<T>() : nullptr;
  for (int64_t i = 0; i < n; ++i) p[i] = inputValue<T>(r, i, salt);
  return t;
}

// Element-by-element check of a 1-d tensor against expected(i); one failure line per tensor.
template <typename T, typename F>
void expectValues(const Tensor& t, int64_t n, F&& expected, const std::string& what) {
  ASSERT_EQ(t.numel(), n) << what;
  const T* p = n ? t.data<T>() : nullptr;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!same<T>(p[i], expected(i))) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " on rank " << rank() << " of " << worldSize() << ": " << bad
                    << " wrong elements, the first at " << first << ": got "
                    << (first >= 0 ? static_cast<double>(p[first]) : 0.0) << ", expected "
                    << (first >= 0 ? static_cast<double>(expected(first)) : 0.0);
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

std::string label(const char* op, DType dt, int64_t n, const std::string& extra = "") {
  return fmt::format("{} {} n={}{}", op, dtypeName(dt), n, extra.empty() ? "" : " " + extra);
}

// ---- reductions --------------------------------------------------------------------------------

TEST(MpiBackend, AllreduceEveryDtypeReductionAndSize) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (ReduceOp op : kReductions) {
        if (op == ReduceOp::Avg && !isFloating(dt)) continue;
        for (int64_t count : kCounts) {
          Tensor t = filled<T>(count, r);
          AllreduceOptions o;
          o.op = op;
          std::string what = label("allreduce", dt, count, reduceOpName(op));
          if (waitOk(pg().allreduce(t, o), what)) {
            expectValues<T>(
                t, count, [&](int64_t i) { return reference<T>(op, i, n); }, what);
          }
        }
      }
    });
  }
}

TEST(MpiBackend, AllreduceAvgOfIntegersIsRejected) {
  Tensor t = zeros({4}, opts(DType::Int32));
  AllreduceOptions o;
  o.op = ReduceOp::Avg;
  EXPECT_THROW(pg().allreduce(t, o), ValueError);
}

TEST(MpiBackend, AllreduceCoalesced) {
  const int n = worldSize(), r = rank();
  const std::vector<int64_t> sizes = {7, 0, 1000, 1};
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
        if (op == ReduceOp::Avg && !isFloating(dt)) continue;
        std::vector<Tensor> ts;
        for (size_t k = 0; k < sizes.size(); ++k) ts.push_back(filled<T>(sizes[k], r, static_cast<int>(k)));
        AllreduceOptions o;
        o.op = op;
        std::string what = label("allreduce_coalesced", dt, 1008, reduceOpName(op));
        if (!waitOk(pg().allreduceCoalesced(ts, o), what)) continue;
        for (size_t k = 0; k < sizes.size(); ++k) {
          int salt = static_cast<int>(k);
          expectValues<T>(
              ts[k], sizes[k], [&](int64_t i) { return reference<T>(op, i, n, salt); },
              what + fmt::format(" tensor {}", k));
        }
      }
    });
  }
}

TEST(MpiBackend, ReduceToEachRoot) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int root = 0; root < n; ++root) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Avg}) {
          if (op == ReduceOp::Avg && !isFloating(dt)) continue;
          for (int64_t count : {int64_t{0}, int64_t{7}, (int64_t{1} << 20) + 3}) {
            Tensor t = filled<T>(count, r);
            ReduceOptions o;
            o.op = op;
            o.root = root;
            std::string what = label("reduce", dt, count, fmt::format("{} root {}", reduceOpName(op), root));
            if (!waitOk(pg().reduce(t, o), what)) continue;
            if (r == root) {
              expectValues<T>(
                  t, count, [&](int64_t i) { return reference<T>(op, i, n); }, what);
            } else {  // the other ranks' tensors are left as they were
              expectValues<T>(
                  t, count, [&](int64_t i) { return inputValue<T>(r, i); }, what + " (non-root)");
            }
          }
        }
      }
    });
  }
}

TEST(MpiBackend, ReduceScatterListAndTensor) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (ReduceOp op : kReductions) {
        if (op == ReduceOp::Avg && !isFloating(dt)) continue;
        for (int64_t count : kCounts) {
          // Rank j's block of the flat input is elements [j*count, (j+1)*count).
          Tensor input = filled<T>(count * n, r);
          Tensor out = empty({count}, opts(dt));
          ReduceScatterOptions o;
          o.op = op;
          std::string what = label("reduce_scatter_tensor", dt, count, reduceOpName(op));
          if (waitOk(pg().reduceScatterTensor(out, input, o), what)) {
            expectValues<T>(
                out, count, [&](int64_t i) { return reference<T>(op, r * count + i, n); }, what);
          }
          if (count > 1000) continue;  // the list form packs the same way; small sizes suffice
          std::vector<Tensor> inputs;
          for (int j = 0; j < n; ++j) inputs.push_back(input.narrow(0, j * count, count).contiguous());
          Tensor out2 = empty({count}, opts(dt));
          what = label("reduce_scatter", dt, count, reduceOpName(op));
          if (waitOk(pg().reduceScatter(out2, inputs, o), what)) {
            expectValues<T>(
                out2, count, [&](int64_t i) { return reference<T>(op, r * count + i, n); }, what);
          }
        }
      }
    });
  }
}

// ---- data movement -----------------------------------------------------------------------------

TEST(MpiBackend, BroadcastFromEachRoot) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int root = 0; root < n; ++root) {
        for (int64_t count : kCounts) {
          Tensor t = filled<T>(count, r, 1);
          BroadcastOptions o;
          o.root = root;
          std::string what = label("broadcast", dt, count, fmt::format("root {}", root));
          if (waitOk(pg().broadcast(t, o), what)) {
            expectValues<T>(
                t, count, [&](int64_t i) { return inputValue<T>(root, i, 1); }, what);
          }
        }
      }
    });
  }
}

TEST(MpiBackend, AllgatherListTensorAndInPlace) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int64_t count : kCounts) {
        Tensor input = filled<T>(count, r);
        std::vector<Tensor> outs;
        for (int j = 0; j < n; ++j) outs.push_back(empty({count}, opts(dt)));
        std::string what = label("allgather", dt, count);
        if (waitOk(pg().allgather(outs, input), what)) {
          for (int j = 0; j < n; ++j) {
            expectValues<T>(
                outs[j], count, [&](int64_t i) { return inputValue<T>(j, i); }, what + fmt::format(" from rank {}", j));
          }
        }
        Tensor flat = empty({count * n}, opts(dt));
        what = label("allgather_into_tensor", dt, count);
        if (waitOk(pg().allgatherIntoTensor(flat, input), what)) {
          expectValues<T>(
              flat, count * n,
              [&](int64_t i) {
                return inputValue<T>(i / std::max<int64_t>(count, 1), i % std::max<int64_t>(count, 1));
              },
              what);
        }
        // FSDP's layout: the input is this rank's slice of the output.
        Tensor whole = zeros({count * n}, opts(dt));
        Tensor mine = whole.narrow(0, r * count, count);
        mine.copy_(input);
        what = label("allgather_into_tensor in place", dt, count);
        if (waitOk(pg().allgatherIntoTensor(whole, mine), what)) {
          expectValues<T>(
              whole, count * n,
              [&](int64_t i) {
                return inputValue<T>(i / std::max<int64_t>(count, 1), i % std::max<int64_t>(count, 1));
              },
              what);
        }
      }
    });
  }
}

TEST(MpiBackend, AllgatherCoalesced) {
  const int n = worldSize(), r = rank();
  const std::vector<int64_t> sizes = {3, 0, 1000};
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      std::vector<Tensor> inputs;
      for (size_t k = 0; k < sizes.size(); ++k) inputs.push_back(filled<T>(sizes[k], r, static_cast<int>(k)));
      std::vector<std::vector<Tensor>> outs(n);
      for (int j = 0; j < n; ++j) {
        for (int64_t s : sizes) outs[j].push_back(empty({s}, opts(dt)));
      }
      std::string what = label("allgather_coalesced", dt, 1003);
      if (!waitOk(pg().allgatherCoalesced(outs, inputs), what)) return;
      for (int j = 0; j < n; ++j) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          int salt = static_cast<int>(k);
          expectValues<T>(
              outs[j][k], sizes[k], [&](int64_t i) { return inputValue<T>(j, i, salt); },
              what + fmt::format(" rank {} tensor {}", j, k));
        }
      }
    });
  }
}

TEST(MpiBackend, AlltoallEqualSplits) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int64_t count : kCounts) {
        // Block j of rank r's input goes to rank j: output block j on rank r is rank j's block r.
        Tensor input = filled<T>(count * n, r);
        Tensor out = empty({count * n}, opts(dt));
        std::string what = label("alltoall", dt, count);
        if (!waitOk(pg().alltoall(out, input), what)) continue;
        expectValues<T>(
            out, count * n,
            [&](int64_t i) {
              int64_t j = i / std::max<int64_t>(count, 1), k = i % std::max<int64_t>(count, 1);
              return inputValue<T>(static_cast<int>(j), r * count + k);
            },
            what);
      }
    });
  }
}

TEST(MpiBackend, AlltoallUnevenSplits) {
  const int n = worldSize(), r = rank();
  // Rank a sends rows(a, b) rows of 3 elements to rank b; some are empty.
  auto rows = [](int a, int b) -> int64_t { return (a + 2 * b) % 3 + (a == b ? 1 : 0); };
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      AlltoallOptions o;
      int64_t inRows = 0, outRows = 0;
      for (int b = 0; b < n; ++b) {
        o.inputSplitSizes.push_back(rows(r, b));
        o.outputSplitSizes.push_back(rows(b, r));
        inRows += rows(r, b);
        outRows += rows(b, r);
      }
      // Rank a's input element e is inputValue(a, e).
      Tensor input = filled<T>(inRows * 3, r).view({inRows, 3});
      Tensor out = empty({outRows, 3}, opts(dt));
      std::string what = label("alltoall_v", dt, inRows * 3);
      if (!waitOk(pg().alltoall(out, input, o), what)) return;
      std::vector<T> expected;
      for (int a = 0; a < n; ++a) {
        int64_t start = 0;  // where a's rows for r begin in a's input
        for (int b = 0; b < r; ++b) start += rows(a, b);
        for (int64_t e = 0; e < rows(a, r) * 3; ++e) expected.push_back(inputValue<T>(a, start * 3 + e));
      }
      expectValues<T>(
          out.view({-1}), static_cast<int64_t>(expected.size()), [&](int64_t i) { return expected[i]; }, what);
    });
  }
}

TEST(MpiBackend, AlltoallList) {
  const int n = worldSize(), r = rank();
  auto len = [](int a, int b) -> int64_t { return (a + b) % 4 * 5; };  // 0 for some pairs
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      std::vector<Tensor> inputs, outputs;
      for (int b = 0; b < n; ++b) {
        inputs.push_back(filled<T>(len(r, b), r, b));
        outputs.push_back(empty({len(b, r)}, opts(dt)));
      }
      std::string what = label("alltoall_list", dt, 0);
      if (!waitOk(pg().alltoallList(outputs, inputs), what)) return;
      for (int a = 0; a < n; ++a) {
        expectValues<T>(
            outputs[a], len(a, r), [&](int64_t i) { return inputValue<T>(a, i, r); },
            what + fmt::format(" from rank {}", a));
      }
    });
  }
}

TEST(MpiBackend, GatherAndScatterAtEachRoot) {
  const int n = worldSize(), r = rank();
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int root = 0; root < n; ++root) {
        for (int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000}}) {
          Tensor input = filled<T>(count, r);
          std::vector<Tensor> outs;
          if (r == root) {
            for (int j = 0; j < n; ++j) outs.push_back(empty({count}, opts(dt)));
          }
          GatherOptions go;
          go.root = root;
          std::string what = label("gather", dt, count, fmt::format("root {}", root));
          if (waitOk(pg().gather(outs, input, go), what) && r == root) {
            for (int j = 0; j < n; ++j) {
              expectValues<T>(
                  outs[j], count, [&](int64_t i) { return inputValue<T>(j, i); },
                  what + fmt::format(" from rank {}", j));
            }
          }
          std::vector<Tensor> ins;
          if (r == root) {
            for (int j = 0; j < n; ++j) ins.push_back(filled<T>(count, root, j));
          }
          Tensor out = empty({count}, opts(dt));
          ScatterOptions so;
          so.root = root;
          what = label("scatter", dt, count, fmt::format("root {}", root));
          if (waitOk(pg().scatter(out, ins, so), what)) {
            expectValues<T>(
                out, count, [&](int64_t i) { return inputValue<T>(root, i, r); }, what);
          }
        }
      }
    });
  }
}

TEST(MpiBackend, BarrierAndWorkResults) {
  auto w = pg().barrier();
  EXPECT_TRUE(waitOk(w, "barrier"));
  EXPECT_TRUE(w->isCompleted());
  EXPECT_TRUE(w->isSuccess());
  EXPECT_GT(w->sequenceNumber(), 0u);
  // Ops issued back to back complete in order, and the Work carries the op's outputs.
  std::vector<Tensor> ts;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 20; ++k) {
    ts.push_back(full({5}, k, opts(DType::Float32)));
    works.push_back(pg().allreduce(ts.back()));
  }
  for (int k = 0; k < 20; ++k) {
    if (!waitOk(works[k], "allreduce burst")) continue;
    ASSERT_EQ(works[k]->result().size(), 1u);
    EXPECT_TRUE(works[k]->result()[0].isSameAs(ts[k]));
    expectValues<float>(
        ts[k], 5, [&](int64_t) { return static_cast<float>(k * worldSize()); }, "allreduce burst");
  }
}

// ---- point to point ----------------------------------------------------------------------------

TEST(MpiBackend, SendRecvRingBothOrders) {
  const int n = worldSize(), r = rank();
  if (n == 1) GTEST_SKIP() << "send/recv need two ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType dt : kAllDTypes) {
    COHORT_DISPATCH(dt, "test", [&]<typename T>() {
      for (int64_t count : kCounts) {
        // Every rank sends first, then receives: with blocking sends on one queue this would
        // deadlock for large messages.
        Tensor out = filled<T>(count, r, 5);
        Tensor in = empty({count}, opts(dt));
        SendRecvOptions so;
        so.tag = 7;
        auto s = pg().send(out, next, so);
        auto rv = pg().recv(in, prev, so);
        std::string what = label("send/recv", dt, count);
        waitOk(s, what + " send");
        if (waitOk(rv, what + " recv")) {
          expectValues<T>(
              in, count, [&](int64_t i) { return inputValue<T>(prev, i, 5); }, what);
        }
      }
    });
  }
}

TEST(MpiBackend, RecvMatchesByTag) {
  const int n = worldSize(), r = rank();
  if (n == 1) GTEST_SKIP() << "send/recv need two ranks";
  if (r == 0) {
    Tensor a = full({4}, 1, opts(DType::Int64)), b = full({4}, 2, opts(DType::Int64));
    SendRecvOptions t1, t2;
    t1.tag = 1;
    t2.tag = 2;
    auto w1 = pg().send(a, 1, t1);
    auto w2 = pg().send(b, 1, t2);
    waitOk(w1, "send tag 1");
    waitOk(w2, "send tag 2");
  } else if (r == 1) {
    // Received in the opposite order to the sends: tags, not order, pair them.
    Tensor x = zeros({4}, opts(DType::Int64)), y = zeros({4}, opts(DType::Int64));
    SendRecvOptions t1, t2;
    t1.tag = 1;
    t2.tag = 2;
    auto w2 = pg().recv(y, 0, t2);
    auto w1 = pg().recv(x, 0, t1);
    if (waitOk(w2, "recv tag 2"))
      expectValues<int64_t>(
          y, 4, [](int64_t) { return int64_t{2}; }, "tag 2");
    if (waitOk(w1, "recv tag 1"))
      expectValues<int64_t>(
          x, 4, [](int64_t) { return int64_t{1}; }, "tag 1");
  }
  waitOk(pg().barrier(), "barrier");
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

// ---- groups ------------------------------------------------------------------------------------

TEST(MpiBackend, SubgroupsRunAlongsideTheWorld) {
  const int n = worldSize(), r = rank();
  // Even ranks form one group; split() pairs ranks by parity with a reversed order.
  std::vector<int> evens;
  for (int j = 0; j < n; j += 2) evens.push_back(j);
  auto even = pg().newGroup(evens);
  EXPECT_EQ(even != nullptr, r % 2 == 0);
  auto parity = pg().split(r % 2, -r);
  ASSERT_NE(parity, nullptr);
  std::vector<int> members;
  for (int j = n - 1; j >= 0; --j) {
    if (j % 2 == r % 2) members.push_back(j);
  }
  EXPECT_EQ(parity->size(), static_cast<int>(members.size()));
  EXPECT_EQ(parity->globalRanks(), members);

  // Issue on the subgroups and the world before waiting on any: they proceed independently.
  Tensor a = full({1000}, r + 1, opts(DType::Float32));
  Tensor b = full({1000}, r + 1, opts(DType::Float32));
  Tensor c = full({1000}, r + 1, opts(DType::Float32));
  WorkPtr we = even ? even->allreduce(a) : nullptr;
  WorkPtr wp = parity->allreduce(b);
  WorkPtr ww = pg().allreduce(c);
  float evenSum = 0, paritySum = 0, worldSum = 0;
  for (int j = 0; j < n; ++j) {
    worldSum += j + 1;
    if (j % 2 == 0) evenSum += j + 1;
    if (j % 2 == r % 2) paritySum += j + 1;
  }
  if (we && waitOk(we, "even allreduce"))
    expectValues<float>(
        a, 1000, [&](int64_t) { return evenSum; }, "even group");
  if (waitOk(wp, "parity allreduce"))
    expectValues<float>(
        b, 1000, [&](int64_t) { return paritySum; }, "parity group");
  if (waitOk(ww, "world allreduce"))
    expectValues<float>(
        c, 1000, [&](int64_t) { return worldSum; }, "world");

  // Group ranks, not world ranks, address roots and peers in a subgroup.
  Tensor d = full({3}, r, opts(DType::Int32));
  BroadcastOptions bo;
  bo.root = parity->size() - 1;
  if (waitOk(parity->broadcast(d, bo), "parity broadcast")) {
    expectValues<int32_t>(
        d, 3, [&](int64_t) { return static_cast<int32_t>(members.back()); }, "parity broadcast");
  }
  waitOk(pg().barrier(), "barrier");
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
// the group and the rank that never came (distributed.mpi_test.caller_timeout_aborts_the_job).
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
