// core/blas: float32 GEMM on oneDNN or OpenBLAS (and with a bias, on oneDNN's matmul primitive or
// filled and added by sgemm), float64 on OpenBLAS, one thread count for both.
//
// Every product is checked against a naive reference computed in long double, within the
// worst-case float bound (k + 2) * eps * (|alpha| * sum_p |a_ip b_pj| + |beta c_ij|): a wrong
// transpose, leading dimension or beta shows up as an O(1) error, far outside it. Paths that need
// oneDNN skip when libdnnl.so.2 is not installed; the OpenBLAS fallback is tested in child
// processes of this binary with COHORT_BLAS=openblas (and with oneDNN made unloadable), since the
// backend is chosen once per process.
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/blas/detail/loader.h>

#include "core/test_util.h"

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer builds: LeakSanitizer's exit-time tracer crashes ("Tracer caught signal 11")
// in a process that has libgomp worker threads, which SgemmThreads.TwoThreadsMatchReference
// starts (OpenBLAS / oneDNN with two OpenMP threads). Leak checking is therefore off for this
// binary only; address and undefined-behaviour checks stay on, and the GEMM wrappers are also
// leak-checked through every nn and training test.
extern "C" const char* __lsan_default_options() { return "leak_check_at_exit=0"; }
#endif

namespace cohort {
namespace {

using blas::Backend;
using blas::Trans;
using testing::contains;
using testing::expectError;
using testing::runChild;

struct Case {
  Trans ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  double alpha, beta;
};

std::string str(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "ta=%s tb=%s m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld alpha=%g beta=%g",
                c.ta == Trans::Yes ? "T" : "N", c.tb == Trans::Yes ? "T" : "N", (long long)c.m, (long long)c.n,
                (long long)c.k, (long long)c.lda, (long long)c.ldb, (long long)c.ldc, c.alpha, c.beta);
  return buf;
}

// Random shapes including 1 and 0, both transposes, padded leading dimensions and several betas.
std::vector<Case> randomCases(unsigned seed, int count) {
  std::mt19937 rng(seed);
  const int64_t dims[] = {1, 2, 3, 7, 16, 17, 33, 64, 65, 130};
  const double alphas[] = {1.0, -0.75, 2.0};
  const double betas[] = {0.0, 1.0, 0.5, -1.5};
  auto pick = [&](auto& arr) { return arr[rng() % (sizeof(arr) / sizeof(arr[0]))]; };
  std::vector<Case> out;
  // Fixed corner cases first: m, n or k equal to 1, k = 0, beta != 0 with k = 0.
  out.push_back({Trans::No, Trans::No, 1, 1, 1, 1, 1, 1, 1.0, 0.0});
  out.push_back({Trans::Yes, Trans::Yes, 1, 5, 3, 1, 3, 5, 1.0, 0.5});
  out.push_back({Trans::No, Trans::Yes, 5, 1, 3, 3, 3, 1, -0.75, 1.0});
  out.push_back({Trans::Yes, Trans::No, 4, 6, 1, 4, 6, 6, 2.0, -1.5});
  out.push_back({Trans::No, Trans::No, 3, 4, 0, 1, 4, 7, 1.0, 2.0});
  out.push_back({Trans::Yes, Trans::No, 3, 4, 0, 3, 4, 4, 1.0, 0.0});
  for (int i = 0; i < count; ++i) {
    Case c;
    c.ta = rng() % 2 ? Trans::Yes : Trans::No;
    c.tb = rng() % 2 ? Trans::Yes : Trans::No;
    c.m = pick(dims), c.n = pick(dims), c.k = pick(dims);
    int64_t pad = rng() % 3 == 0 ? 0 : 1 + rng() % 9;  // lda > stored columns in two cases of three
    c.lda = std::max<int64_t>(1, c.ta == Trans::No ? c.k : c.m) + pad;
    pad = rng() % 3 == 0 ? 0 : 1 + rng() % 9;
    c.ldb = std::max<int64_t>(1, c.tb == Trans::No ? c.n : c.k) + pad;
    c.ldc = c.n + (rng() % 2 ? 0 : 1 + rng() % 5);
    c.alpha = pick(alphas), c.beta = pick(betas);
    out.push_back(c);
  }
  return out;
}

template <typename T>
struct Operands {
  std::vector<T> a, b, c;
  std::vector<long double> want, bound;
};

// Fills A, B, C for case `c` (C is NaN when beta == 0: it must not be read) and the reference.
template <typename T>
Operands<T> makeOperands(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Operands<T> o;
  int64_t aRows = c.ta == Trans::No ? c.m : c.k, bRows = c.tb == Trans::No ? c.k : c.n;
  o.a.resize(std::max<int64_t>(1, aRows * c.lda));
  o.b.resize(std::max<int64_t>(1, bRows * c.ldb));
  o.c.resize(std::max<int64_t>(1, c.m * c.ldc));
  for (auto& x : o.a) x = static_cast<T>(u(rng));
  for (auto& x : o.b) x = static_cast<T>(u(rng));
  for (auto& x : o.c) x = c.beta == 0 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(u(rng));
  auto A = [&](int64_t i, int64_t p) { return c.ta == Trans::No ? o.a[i * c.lda + p] : o.a[p * c.lda + i]; };
  auto B = [&](int64_t p, int64_t j) { return c.tb == Trans::No ? o.b[p * c.ldb + j] : o.b[j * c.ldb + p]; };
  const long double eps = std::numeric_limits<T>::epsilon();
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      long double s = 0, sa = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        s += (long double)A(i, p) * B(p, j);
        sa += std::fabs((long double)A(i, p) * B(p, j));
      }
      long double cij = c.beta == 0 ? 0 : (long double)o.c[i * c.ldc + j];
      o.want.push_back(c.alpha * s + c.beta * cij);
      o.bound.push_back((c.k + 2) * eps * (std::fabs((long double)c.alpha) * sa + std::fabs(c.beta * cij)) + 1e-30L);
    }
  return o;
}

// C after the call: the m x n block matches the reference, and the padding columns are untouched.
template <typename T>
void expectResult(const Case& c, const Operands<T>& before, const std::vector<T>& got, const std::string& what) {
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      long double g = got[i * c.ldc + j], w = before.want[i * c.n + j], bnd = before.bound[i * c.n + j];
      ASSERT_TRUE(std::isfinite((double)g) && std::fabs(g - w) <= bnd)
          << what << " " << str(c) << " at (" << i << "," << j << "): got " << (double)g << " want " << (double)w
          << " bound " << (double)bnd;
    }
    for (int64_t j = c.n; j < c.ldc; ++j) {
      T g = got[i * c.ldc + j], was = before.c[i * c.ldc + j];
      ASSERT_TRUE(std::isnan(was) ? std::isnan(g) : g == was) << what << " wrote padding " << str(c);
    }
  }
}

std::vector<float> runSgemm(Backend backend, const Case& c, const Operands<float>& o) {
  std::vector<float> out = o.c;
  blas::sgemmOn(backend, c.ta, c.tb, c.m, c.n, c.k, (float)c.alpha, o.a.data(), c.lda, o.b.data(), c.ldb, (float)c.beta,
                out.data(), c.ldc);
  return out;
}

bool oneDnnAvailable(std::string* why) { return blas::backendAvailable(Backend::OneDnn, why); }

TEST(Sgemm, OpenBlasMatchesReference) {
  unsigned seed = 1;
  for (const Case& c : randomCases(11, 60)) {
    auto o = makeOperands<float>(c, seed++);
    expectResult(c, o, runSgemm(Backend::OpenBlas, c, o), "openblas");
  }
}

TEST(Sgemm, OneDnnMatchesReferenceAndOpenBlas) {
  std::string why;
  if (!oneDnnAvailable(&why)) GTEST_SKIP() << "oneDNN not available: " << why;
  unsigned seed = 1;
  for (const Case& c : randomCases(12, 80)) {
    auto o = makeOperands<float>(c, seed++);
    std::vector<float> dnnl = runSgemm(Backend::OneDnn, c, o), ob = runSgemm(Backend::OpenBlas, c, o);
    expectResult(c, o, dnnl, "onednn");
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j)
        ASSERT_LE(std::fabs((long double)dnnl[i * c.ldc + j] - ob[i * c.ldc + j]), 2 * o.bound[i * c.n + j])
            << "onednn vs openblas " << str(c) << " at (" << i << "," << j << ")";
  }
}

TEST(Sgemm, DefaultBackendIsOneDnnWhenItLoads) {
  const char* forced = std::getenv("COHORT_BLAS");
  if (forced && *forced) GTEST_SKIP() << "COHORT_BLAS is set to " << forced;
  EXPECT_EQ(blas::sgemmBackend(), oneDnnAvailable(nullptr) ? Backend::OneDnn : Backend::OpenBlas);
  EXPECT_TRUE(contains(blas::describe(), "float64: OpenBLAS")) << blas::describe();
  // The public entry point goes through the chosen backend and gives the same results.
  unsigned seed = 100;
  for (const Case& c : randomCases(13, 20)) {
    auto o = makeOperands<float>(c, seed++);
    std::vector<float> out = o.c;
    blas::sgemm(c.ta, c.tb, c.m, c.n, c.k, (float)c.alpha, o.a.data(), c.lda, o.b.data(), c.ldb, (float)c.beta,
                out.data(), c.ldc);
    expectResult(c, o, out, "blas::sgemm");
  }
}

TEST(Dgemm, MatchesReference) {
  unsigned seed = 1;
  for (const Case& c : randomCases(14, 60)) {
    auto o = makeOperands<double>(c, seed++);
    std::vector<double> out = o.c;
    blas::dgemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, o.a.data(), c.lda, o.b.data(), c.ldb, c.beta, out.data(), c.ldc);
    expectResult(c, o, out, "dgemm");
  }
}

// k == 0 and alpha == 0: C = beta * C without touching A or B, identical on both backends.
TEST(Sgemm, EmptyProductScalesC) {
  std::vector<Backend> backends = {Backend::OpenBlas};
  if (oneDnnAvailable(nullptr)) backends.push_back(Backend::OneDnn);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(6, nan), b(6, nan);
  for (Backend be : backends) {
    SCOPED_TRACE(blas::backendName(be));
    std::vector<float> c = {1, 2, 3, 4, 5, 6};
    blas::sgemmOn(be, Trans::No, Trans::No, 2, 3, 0, 1.f, a.data(), 1, b.data(), 3, 2.f, c.data(), 3);
    EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8, 10, 12}));
    blas::sgemmOn(be, Trans::No, Trans::No, 2, 3, 2, 0.f, a.data(), 2, b.data(), 3, -1.f, c.data(), 3);
    EXPECT_EQ(c, (std::vector<float>{-2, -4, -6, -8, -10, -12}));
    std::vector<float> cn(6, nan);
    blas::sgemmOn(be, Trans::Yes, Trans::Yes, 2, 3, 0, 1.f, a.data(), 2, b.data(), 1, 0.f, cn.data(), 3);
    EXPECT_EQ(cn, std::vector<float>(6, 0.f));
    // m == 0 or n == 0: nothing is read or written.
    blas::sgemmOn(be, Trans::No, Trans::No, 0, 3, 2, 1.f, a.data(), 2, b.data(), 3, 0.f, cn.data(), 3);
    EXPECT_EQ(cn, std::vector<float>(6, 0.f));
  }
  std::vector<double> ad(6, NAN), bd(6, NAN), cd = {1, 2, 3, 4, 5, 6};
  blas::dgemm(Trans::No, Trans::No, 2, 3, 0, 1.0, ad.data(), 1, bd.data(), 3, 0.5, cd.data(), 3);
  EXPECT_EQ(cd, (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}));
}

TEST(Sgemm, BadArgumentsAreValueErrors) {
  std::vector<float> a(64), b(64), c(64);
  std::vector<double> ad(64), bd(64), cd(64);
  expectError<ValueError>(
      [&] { blas::sgemm(Trans::No, Trans::No, 2, 3, 4, 1.f, a.data(), 3, b.data(), 3, 0.f, c.data(), 3); },
      {"sgemm", "lda=3", "4 columns", "m=2 n=3 k=4"});
  expectError<ValueError>(
      [&] { blas::sgemm(Trans::Yes, Trans::No, 5, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 3); },
      {"sgemm", "lda=4", "5 columns", "transposed"});
  expectError<ValueError>(
      [&] { blas::sgemm(Trans::No, Trans::Yes, 2, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 3); },
      {"sgemm", "ldb=3", "4 columns"});
  expectError<ValueError>(
      [&] { blas::sgemm(Trans::No, Trans::No, 2, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 2); },
      {"sgemm", "ldc=2", "n=3"});
  expectError<ValueError>(
      [&] { blas::sgemm(Trans::No, Trans::No, -1, 3, 4, 1.f, a.data(), 4, b.data(), 3, 0.f, c.data(), 3); },
      {"sgemm", "negative size", "m=-1"});
  expectError<ValueError>(
      [&] {
        blas::sgemmOn(Backend::OpenBlas, Trans::No, Trans::No, 2, 3, 4, 1.f, a.data(), 1, b.data(), 3, 0.f, c.data(),
                      3);
      },
      {"sgemm", "lda=1"});
  expectError<ValueError>(
      [&] { blas::dgemm(Trans::No, Trans::No, 2, 3, 4, 1.0, ad.data(), 4, bd.data(), 2, 0.0, cd.data(), 3); },
      {"dgemm", "ldb=2", "3 columns"});
  // ld = 0 is an error even for an empty matrix, as in BLAS.
  expectError<ValueError>(
      [&] { blas::dgemm(Trans::No, Trans::No, 2, 0, 0, 1.0, ad.data(), 0, bd.data(), 1, 0.0, cd.data(), 1); },
      {"dgemm", "lda=0"});
  expectError<ValueError>([] { blas::setNumThreads(0); }, {"setNumThreads", "n = 0"});
}

// cohort::mm on float32 (through the chosen backend) against float64 (through OpenBLAS) on
// transposed and sliced views, which reach BLAS as Trans::Yes and as lda > columns.
TEST(Sgemm, MmOnViewsMatchesFloat64) {
  Generator gen(7);
  Tensor big = randn({40, 50}, {}, &gen);
  Tensor a = big.slice(1, 3, 33);                        // [40, 30], row stride 50: lda > columns
  Tensor b = randn({20, 30}, {}, &gen).transpose(0, 1);  // [30, 20], column-major: Trans::Yes
  auto expectClose = [](const Tensor& got32, const Tensor& want64) {
    std::vector<float> g = got32.toVector<float>();
    std::vector<double> w = want64.toVector<double>();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-4 * (1 + std::fabs(w[i]))) << i;
  };
  expectClose(mm(a, b), mm(a.to(DType::Float64), b.to(DType::Float64)));
  // addmm with beta != 0, a transposed first operand and a sliced second one.
  Tensor bias = randn({30, 20}, {}, &gen);
  Tensor at = randn({40, 30}, {}, &gen).transpose(0, 1);  // [30, 40]
  Tensor m2 = big.slice(1, 10, 30);                       // [40, 20], row stride 50
  expectClose(addmm(bias, at, m2, 0.5, 2.0),
              addmm(bias.to(DType::Float64), at.to(DType::Float64), m2.to(DType::Float64), 0.5, 2.0));
  // m, n or k equal to 1.
  Tensor row = big.slice(0, 0, 1), col = big.slice(1, 0, 1);
  expectClose(mm(row, big.transpose(0, 1)), mm(row.to(DType::Float64), big.transpose(0, 1).to(DType::Float64)));
  expectClose(mm(col, row), mm(col.to(DType::Float64), row.to(DType::Float64)));
}

// ---- threads -----------------------------------------------------------------------------------

// The OpenMP runtime oneDNN threads through, reached the way a user's code would (it is already
// loaded once oneDNN is).
struct Omp {
  int (*getMaxThreads)() = nullptr;
  void (*setNumThreads)(int) = nullptr;
};
Omp ompOfOneDnn() {
  Omp o;
  if (void* h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    o.getMaxThreads = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_max_threads"));
    o.setNumThreads = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
  }
  return o;
}

int openBlasThreads() {
  void* h = dlopen(blas::libraryName().c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return -1;
  auto get = reinterpret_cast<int (*)()>(dlsym(h, "openblas_get_num_threads"));
  return get ? get() : -1;
}

// One small product on oneDNN, checked, so that each thread's call is a real call.
void oneDnnProduct() {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 1, 1}, c(4, -1.f);
  blas::sgemmOn(Backend::OneDnn, Trans::No, Trans::No, 2, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{3, 2, 7, 4}));
}

TEST(SgemmThreads, SettingGovernsEveryThread) {
  std::string why;
  if (!oneDnnAvailable(&why)) GTEST_SKIP() << "oneDNN not available: " << why;
  oneDnnProduct();
  Omp omp = ompOfOneDnn();
  if (!omp.getMaxThreads || !omp.setNumThreads) GTEST_SKIP() << "oneDNN does not thread through libgomp here";
  int saved = blas::numThreads();

  for (int n : {2, 1, 3}) {
    SCOPED_TRACE("setNumThreads(" + std::to_string(n) + ")");
    blas::setNumThreads(n);
    EXPECT_EQ(blas::numThreads(), n);
    EXPECT_EQ(openBlasThreads(), n);  // OpenBLAS kept in step
    oneDnnProduct();
    EXPECT_EQ(omp.getMaxThreads(), n) << "calling thread";
    int seen = -1, seenAfterOwn = -1;
    std::thread t([&] {
      oneDnnProduct();
      seen = omp.getMaxThreads();
      omp.setNumThreads(7);  // the thread's own OpenMP setting is overridden by cohort's at the next call
      oneDnnProduct();
      seenAfterOwn = omp.getMaxThreads();
    });
    t.join();
    EXPECT_EQ(seen, n) << "a second std::thread";
    EXPECT_EQ(seenAfterOwn, n) << "a second std::thread after its own omp_set_num_threads(7)";
  }
  // A long-lived thread follows a change made by another thread after its first call.
  blas::setNumThreads(2);
  std::mutex mu;
  std::condition_variable cv;
  int phase = 0, first = -1, second = -1;
  std::thread worker([&] {
    oneDnnProduct();
    first = omp.getMaxThreads();
    std::unique_lock<std::mutex> lock(mu);
    phase = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 2; });
    lock.unlock();
    oneDnnProduct();
    second = omp.getMaxThreads();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return phase == 1; });
    blas::setNumThreads(1);
    phase = 2;
    cv.notify_all();
  }
  worker.join();
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 1);
  blas::setNumThreads(saved);
}

// Products computed with several threads on both backends match the reference too.
TEST(SgemmThreads, TwoThreadsMatchReference) {
  int saved = blas::numThreads();
  blas::setNumThreads(2);
  std::vector<Backend> backends = {Backend::OpenBlas};
  if (oneDnnAvailable(nullptr)) backends.push_back(Backend::OneDnn);
  Case c{Trans::Yes, Trans::No, 150, 130, 170, 160, 131, 133, 1.0, 0.5};
  auto o = makeOperands<float>(c, 5);
  for (Backend be : backends) expectResult(c, o, runSgemm(be, c, o), blas::backendName(be));
  blas::setNumThreads(saved);
}

// ---- float32 GEMM with a bias (blas::sgemmBias) --------------------------------------------------

// sgemmBias on case `c` (its alpha and beta are not used: C = op(A) op(B) + bias on every row) against
// the long-double reference; C's m x n block starts as NaN, which must never be read.
void checkSgemmBias(const Case& given, unsigned seed, const std::string& what) {
  Case c = given;
  c.alpha = 1.0, c.beta = 0.0;
  auto o = makeOperands<float>(c, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> bias(static_cast<size_t>(std::max<int64_t>(1, c.n)));
  for (auto& x : bias) x = static_cast<float>(u(rng));
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      o.want[i * c.n + j] += bias[j];
      o.bound[i * c.n + j] += (c.k + 2) * std::numeric_limits<float>::epsilon() * std::fabs(bias[j]);
    }
  std::vector<float> out = o.c;
  blas::sgemmBias(c.ta, c.tb, c.m, c.n, c.k, o.a.data(), c.lda, o.b.data(), c.ldb, bias.data(), out.data(), c.ldc);
  expectResult(c, o, out, what);
}

TEST(SgemmBias, MatchesReferenceOnRandomShapes) {
  unsigned seed = 300;
  for (const Case& c : randomCases(31, 60)) checkSgemmBias(c, seed++, "sgemmBias");
  // Shapes of real layers, where k is split into blocks.
  checkSgemmBias({Trans::No, Trans::Yes, 96, 40, 1536, 1536, 1536, 40, 1, 0}, 11, "sgemmBias, k = 1536");
  checkSgemmBias({Trans::No, Trans::Yes, 2048, 64, 64, 64, 64, 64, 1, 0}, 12, "sgemmBias, m = 2048");
}

// The same call gives the same bits every time, at one thread (oneDNN's matmul where float32 runs
// on oneDNN) and at two (the bias filled in and sgemm), in any order.
TEST(SgemmBias, SameBitsOnEveryRunAndThreadCount) {
  int saved = blas::numThreads();
  const int64_t m = 37, n = 50, k = 3000;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(m * k), b(n * k), bias(n);
  for (auto* v : {&a, &b, &bias})
    for (auto& x : *v) x = u(rng);
  auto run = [&](int threads) {
    blas::setNumThreads(threads);
    std::vector<float> c(m * n, -1.f);
    blas::sgemmBias(Trans::No, Trans::Yes, m, n, k, a.data(), k, b.data(), k, bias.data(), c.data(), n);
    return c;
  };
  std::vector<float> two = run(2), one = run(1);
  EXPECT_EQ(run(2), two);
  EXPECT_EQ(run(1), one);
  blas::setNumThreads(saved);
}

// Threads running the same shape at once (ranks that are threads, RPC workers) each get their own
// product: oneDNN's primitives run with the calling thread's scratch memory, not a shared one.
TEST(SgemmBias, ConcurrentCallsGiveEachThreadItsOwnProduct) {
  int saved = blas::numThreads();
  blas::setNumThreads(1);
  constexpr int kThreads = 4;
  const int64_t m = 300, n = 70, k = 900;
  std::vector<std::vector<float>> a(kThreads), b(kThreads), bias(kThreads), want(kThreads);
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto product = [&](int t) {
    std::vector<float> c(m * n, -1.f);
    blas::sgemmBias(Trans::No, Trans::Yes, m, n, k, a[t].data(), k, b[t].data(), k, bias[t].data(), c.data(), n);
    return c;
  };
  for (int t = 0; t < kThreads; ++t) {
    a[t].resize(m * k), b[t].resize(n * k), bias[t].resize(n);
    for (auto* v : {&a[t], &b[t], &bias[t]})
      for (auto& x : *v) x = u(rng);
    want[t] = product(t);  // one at a time
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      blas::setNumThreads(1);
      for (int i = 0; i < 40; ++i)
        if (product(t) != want[t]) ++mismatches[t];
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t << " of " << kThreads;
  blas::setNumThreads(saved);
}

TEST(SgemmBias, BadArgumentsAreValueErrors) {
  std::vector<float> x(16, 1.f), y(16);
  expectError<ValueError>(
      [&] { blas::sgemmBias(Trans::No, Trans::No, 2, 2, 2, x.data(), 2, x.data(), 2, nullptr, y.data(), 2); },
      {"sgemmBias", "null bias"});
  expectError<ValueError>(
      [&] { blas::sgemmBias(Trans::No, Trans::No, 2, 3, 2, x.data(), 2, x.data(), 3, x.data(), y.data(), 2); },
      {"sgemmBias", "ldc"});
  // k == 0: every row is the bias.
  std::vector<float> bias = {1.5f, -2.f};
  blas::sgemmBias(Trans::No, Trans::No, 2, 2, 0, nullptr, 1, nullptr, 2, bias.data(), y.data(), 2);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 4), (std::vector<float>{1.5f, -2.f, 1.5f, -2.f}));
}

// A linear layer (the op that uses sgemmBias) on contiguous and strided inputs, weights and biases
// matches the float64 product.
TEST(SgemmBias, LinearOnViewsMatchesFloat64) {
  Generator gen(4);
  Tensor x = randn({70, 33}, {}, &gen), w = randn({21, 33}, {}, &gen), b = randn({42}, {}, &gen);
  Tensor xt = randn({33, 70}, {}, &gen).t(), wt = randn({33, 21}, {}, &gen).t();
  Tensor bs = b.slice(0, 0, 42, 2);  // a strided bias
  for (const auto& [in, weight] : {std::pair{x, w}, std::pair{xt, wt}, std::pair{x, wt}}) {
    Tensor got = linear(in, weight, bs);
    Tensor want = mm(in.to(DType::Float64), weight.to(DType::Float64).t()) + bs.to(DType::Float64);
    EXPECT_LT((got.to(DType::Float64) - want).abs().max().item<double>(), 1e-5);
  }
  Tensor batched = randn({3, 5, 33}, {}, &gen);
  Tensor got = linear(batched, w, bs);
  Tensor want = matmul(batched.to(DType::Float64), w.to(DType::Float64).t()) + bs.to(DType::Float64);
  EXPECT_EQ(got.sizes(), (Shape{3, 5, 21}));
  EXPECT_LT((got.to(DType::Float64) - want).abs().max().item<double>(), 1e-5);
}

// ---- COHORT_BLAS, in child processes of this binary ---------------------------------------------

void expectChildPasses(const std::string& env, const std::string& test) {
  auto [status, out] = runChild(env + " COHORT_BLAS_TEST_CHILD=1", "SgemmEnvChild.DISABLED_" + test);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "[  PASSED  ] 1 test")) << out;
  EXPECT_FALSE(contains(out, "SKIPPED")) << out;
}

const char* kNoDnnl = "COHORT_ONEDNN_LIBRARY=libcohort-test-no-such-dnnl.so.2";

TEST(SgemmEnv, ForcedOpenBlas) { expectChildPasses("COHORT_BLAS=openblas", "OpenBlasChosen"); }
TEST(SgemmEnv, ForcedOpenBlasIgnoresMissingOneDnn) {
  expectChildPasses(std::string("COHORT_BLAS=openblas ") + kNoDnnl, "OpenBlasChosen");
}
TEST(SgemmEnv, AutoFallsBackWhenOneDnnIsAbsent) {
  expectChildPasses(std::string("COHORT_BLAS=auto ") + kNoDnnl, "OpenBlasChosen");
}
TEST(SgemmEnv, ForcedOneDnnAbsentIsNotSupported) {
  expectChildPasses(std::string("COHORT_BLAS=onednn ") + kNoDnnl, "OneDnnMissing");
}
TEST(SgemmEnv, ForcedOneDnn) {
  std::string why;
  if (!oneDnnAvailable(&why)) GTEST_SKIP() << "oneDNN not available: " << why;
  expectChildPasses("COHORT_BLAS=OneDNN", "OneDnnChosen");
}
TEST(SgemmEnv, UnknownValueIsValueError) { expectChildPasses("COHORT_BLAS=mkl", "UnknownValue"); }

// ---- half-width GEMM (blas::hgemm) --------------------------------------------------------------

using blas::HalfType;

uint16_t toHalfBits(HalfType t, float v) {
  return t == HalfType::BFloat16 ? BFloat16::fromFloat(v) : Half::fromFloat(v);
}
float fromHalfBits(HalfType t, uint16_t b) {
  return t == HalfType::BFloat16 ? static_cast<float>(BFloat16::fromBits(b)) : static_cast<float>(Half::fromBits(b));
}
const char* halfStr(HalfType t) { return t == HalfType::BFloat16 ? "bfloat16" : "float16"; }

// One hgemm call (native when `native`, else the widening fallback) checked against a long double
// reference computed from the very half values passed in. Products of halves are exact in float32,
// so the float32 accumulation is bounded like sgemm's; a half C adds one rounding of the result.
void checkHgemm(HalfType t, bool cFloat32, bool native, const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int64_t aRows = c.ta == Trans::No ? c.m : c.k, bRows = c.tb == Trans::No ? c.k : c.n;
  std::vector<uint16_t> a(std::max<int64_t>(1, aRows * c.lda)), b(std::max<int64_t>(1, bRows * c.ldb));
  for (auto& x : a) x = toHalfBits(t, u(rng));
  for (auto& x : b) x = toHalfBits(t, u(rng));
  size_t cn = static_cast<size_t>(std::max<int64_t>(1, c.m * c.ldc));
  std::vector<float> c32(cn);
  std::vector<uint16_t> c16(cn);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < cn; ++i) {
    float v = c.beta == 0 ? nan : u(rng);
    c16[i] = toHalfBits(t, v);
    c32[i] = cFloat32 ? v : fromHalfBits(t, c16[i]);
  }
  const std::vector<float> c32Before = c32;
  const std::vector<uint16_t> c16Before = c16;
  void* cp = cFloat32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
  if (native)
    blas::hgemm(t, cFloat32, c.ta, c.tb, c.m, c.n, c.k, (float)c.alpha, a.data(), c.lda, b.data(), c.ldb, (float)c.beta,
                cp, c.ldc);
  else
    blas::hgemmFallback(t, cFloat32, c.ta, c.tb, c.m, c.n, c.k, (float)c.alpha, a.data(), c.lda, b.data(), c.ldb,
                        (float)c.beta, cp, c.ldc);
  auto A = [&](int64_t i, int64_t p) {
    return fromHalfBits(t, c.ta == Trans::No ? a[i * c.lda + p] : a[p * c.lda + i]);
  };
  auto B = [&](int64_t p, int64_t j) {
    return fromHalfBits(t, c.tb == Trans::No ? b[p * c.ldb + j] : b[j * c.ldb + p]);
  };
  const long double eps32 = std::numeric_limits<float>::epsilon();
  const long double epsHalf = t == HalfType::BFloat16 ? 1.0L / 256 : 1.0L / 2048;  // half an ulp at 1
  std::string what = std::string(halfStr(t)) + (cFloat32 ? " -> float32" : " -> half") +
                     (native ? " (hgemm)" : " (fallback)") + " " + str(c);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      long double s = 0, sa = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        s += (long double)A(i, p) * B(p, j);
        sa += std::fabs((long double)A(i, p) * B(p, j));
      }
      long double cij = c.beta == 0 ? 0 : (long double)c32Before[i * c.ldc + j];
      long double want = c.alpha * s + c.beta * cij;
      long double bound = (c.k + 2) * eps32 * (std::fabs((long double)c.alpha) * sa + std::fabs(c.beta * cij)) + 1e-30L;
      long double got = cFloat32 ? c32[i * c.ldc + j] : fromHalfBits(t, c16[i * c.ldc + j]);
      if (!cFloat32) bound += epsHalf * std::fabs(want) + 1e-7L;  // one rounding to the half type
      ASSERT_TRUE(std::isfinite((double)got) && std::fabs(got - want) <= bound)
          << what << " at (" << i << "," << j << "): got " << (double)got << " want " << (double)want;
    }
    for (int64_t j = c.n; j < c.ldc; ++j) {  // padding columns untouched
      if (cFloat32) {
        float g = c32[i * c.ldc + j], was = c32Before[i * c.ldc + j];
        ASSERT_TRUE(std::isnan(was) ? std::isnan(g) : g == was) << what << " wrote padding";
      } else {
        ASSERT_EQ(c16[i * c.ldc + j], c16Before[i * c.ldc + j]) << what << " wrote padding";
      }
    }
  }
}

TEST(Hgemm, MatchesReferenceOnEveryPath) {
  unsigned seed = 500;
  for (HalfType t : {HalfType::BFloat16, HalfType::Float16})
    for (bool cFloat32 : {false, true})
      for (bool native : {true, false})
        for (const Case& c : randomCases(21, 25)) checkHgemm(t, cFloat32, native, c, seed++);
}

TEST(Hgemm, LargerProductsMatchReference) {
  // Big enough that oneDNN blocks and threads (where it runs), with padded leading dimensions.
  unsigned seed = 900;
  for (HalfType t : {HalfType::BFloat16, HalfType::Float16})
    for (auto [ta, tb] : {std::pair{Trans::No, Trans::No}, {Trans::No, Trans::Yes}, {Trans::Yes, Trans::No}}) {
      Case c{ta, tb, 97, 130, 257, 0, 0, 135, 1.0, 0.0};
      c.lda = (ta == Trans::No ? c.k : c.m) + 3;
      c.ldb = (tb == Trans::No ? c.n : c.k) + 1;
      checkHgemm(t, false, true, c, seed++);
      c.beta = 1.0;
      checkHgemm(t, true, true, c, seed++);
    }
}

TEST(Hgemm, DescribeSaysHowHalfTypesRun) {
  std::string d = blas::describe();
  EXPECT_TRUE(contains(d, "bfloat16: ")) << d;
  EXPECT_TRUE(contains(d, "float16: ")) << d;
  std::string why;
  bool native = blas::hgemmNative(HalfType::BFloat16, &why);
  if (native) EXPECT_TRUE(contains(d, "bfloat16: oneDNN matmul")) << d;
  else EXPECT_TRUE(contains(d, "bfloat16: widened to float32 (" + why)) << d;
}

// COHORT_HGEMM=auto's rule, from the kernel name oneDNN reports and the CPU's vendor (never from
// timing): AMX kernels; bfloat16's AVX512-BF16 kernel only on AMD (Zen 4 issues it at twice the
// float32 FMA rate, Intel without AMX at the same rate); never a reference kernel, never float16
// without AMX.
TEST(Hgemm, TheAutomaticChoiceFollowsTheKernelAndTheVendor) {
  using blas::detail::autoUsesOneDnn;
  std::string how, why;
  EXPECT_TRUE(autoUsesOneDnn(HalfType::BFloat16, "brg:avx512_core_amx", false, &how, &why));
  EXPECT_TRUE(contains(how, "AMX kernel (brg:avx512_core_amx)")) << how;
  EXPECT_TRUE(autoUsesOneDnn(HalfType::Float16, "brg:avx512_core_amx_fp16", true, &how, &why));
  EXPECT_TRUE(autoUsesOneDnn(HalfType::BFloat16, "brg:avx512_core_bf16", true, &how, &why));
  EXPECT_TRUE(contains(how, "AVX512-BF16 kernel (brg:avx512_core_bf16) on an AMD CPU")) << how;
  EXPECT_FALSE(autoUsesOneDnn(HalfType::BFloat16, "brg:avx512_core_bf16", false, &how, &why));
  EXPECT_TRUE(contains(why, "neither an AMX kernel nor AVX512-BF16 on an AMD CPU")) << why;
  EXPECT_FALSE(autoUsesOneDnn(HalfType::Float16, "brg:avx512_core_bf16", true, &how, &why));
  EXPECT_FALSE(autoUsesOneDnn(HalfType::BFloat16, "brg:avx512_core", true, &how, &why));
  EXPECT_FALSE(autoUsesOneDnn(HalfType::BFloat16, "ref:any", true, &how, &why));
  EXPECT_TRUE(contains(why, "reference implementation (ref:any)")) << why;
  EXPECT_FALSE(autoUsesOneDnn(HalfType::BFloat16, "ref:any", true, nullptr, nullptr));  // outputs optional
}

TEST(Hgemm, BadArgumentsAreValueErrors) {
  std::vector<uint16_t> x(16, 0);
  std::vector<float> y(16);
  auto call = [&](int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
    blas::hgemm(HalfType::BFloat16, true, Trans::No, Trans::No, m, n, k, 1.f, x.data(), lda, x.data(), ldb, 0.f,
                y.data(), ldc);
  };
  expectError<ValueError>([&] { call(-1, 2, 2, 2, 2, 2); }, {"hgemm", "negative size"});
  expectError<ValueError>([&] { call(2, 2, 3, 2, 2, 2); }, {"hgemm", "lda=2"});
  expectError<ValueError>([&] { call(2, 3, 2, 2, 2, 3); }, {"hgemm", "ldb=2"});
  expectError<ValueError>([&] { call(2, 3, 2, 2, 3, 2); }, {"hgemm", "ldc=2", "n=3"});
  expectError<ValueError>(
      [&] {
        blas::hgemm(HalfType::Float16, false, Trans::No, Trans::No, 2, 2, 2, 1.f, nullptr, 2, x.data(), 2, 0.f,
                    y.data(), 2);
      },
      {"hgemm", "null"});
}

TEST(Hgemm, MmOnHalfTensorsMatchesFloat64) {
  // cohort::mm on bfloat16/float16 tensors, including transposed views (as nn.Linear gives them):
  // the float64 product of the same (rounded) values, within one rounding of the result.
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor a = (rand({70, 90}) - 0.5).to(dt), b = (rand({60, 90}) - 0.5).to(dt);
    Tensor got = mm(a, b.transpose(0, 1));
    EXPECT_EQ(got.dtype(), dt);
    Tensor want = mm(a.to(DType::Float64), b.to(DType::Float64).transpose(0, 1));
    double tol = dt == DType::BFloat16 ? 1.0 / 128 : 1.0 / 1024;
    Tensor err = (got.to(DType::Float64) - want).abs() - want.abs() * tol;
    EXPECT_LE(err.max().item<double>(), 1e-6) << dtypeName(dt);
  }
}

TEST(HgemmEnv, ForcedWiden) { expectChildPasses("COHORT_HGEMM=widen", "HgemmWidened"); }
TEST(HgemmEnv, UnknownValueIsValueError) { expectChildPasses("COHORT_HGEMM=fast", "HgemmUnknownValue"); }

bool isChild() {
  const char* v = std::getenv("COHORT_BLAS_TEST_CHILD");
  return v && std::string(v) == "1";
}

// Through blas::sgemm and through cohort::mm, the whole float32 stack works on the chosen backend.
void expectFloat32Works() {
  unsigned seed = 200;
  for (const Case& c : randomCases(15, 30)) {
    auto o = makeOperands<float>(c, seed++);
    std::vector<float> out = o.c;
    blas::sgemm(c.ta, c.tb, c.m, c.n, c.k, (float)c.alpha, o.a.data(), c.lda, o.b.data(), c.ldb, (float)c.beta,
                out.data(), c.ldc);
    expectResult(c, o, out, blas::backendName(blas::sgemmBackend()));
    checkSgemmBias(c, seed++, std::string("sgemmBias on ") + blas::backendName(blas::sgemmBackend()));
  }
  Tensor a = fromVector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = fromVector(std::vector<float>{1, 0, 0, 1, 1, 1}, {3, 2});
  testing::expectNear(mm(a, b), {4, 5, 10, 11}, 0);
  testing::expectNear(mm(b.transpose(0, 1), a.transpose(0, 1)), {4, 10, 5, 11}, 0);
}

TEST(SgemmEnvChild, DISABLED_OpenBlasChosen) {
  if (!isChild()) GTEST_SKIP() << "run by SgemmEnv.*";
  EXPECT_EQ(blas::sgemmBackend(), Backend::OpenBlas);
  EXPECT_TRUE(contains(blas::describe(), "float32: OpenBLAS")) << blas::describe();
  expectFloat32Works();
}

TEST(SgemmEnvChild, DISABLED_OneDnnChosen) {
  if (!isChild()) GTEST_SKIP() << "run by SgemmEnv.*";
  EXPECT_EQ(blas::sgemmBackend(), Backend::OneDnn);
  EXPECT_TRUE(contains(blas::describe(), "float32: oneDNN")) << blas::describe();
  expectFloat32Works();
}

TEST(SgemmEnvChild, DISABLED_OneDnnMissing) {
  if (!isChild()) GTEST_SKIP() << "run by SgemmEnv.*";
  std::vector<float> x(4, 1.f), y(4);
  expectError<NotSupportedError>(
      [&] { blas::sgemm(Trans::No, Trans::No, 2, 2, 2, 1.f, x.data(), 2, x.data(), 2, 0.f, y.data(), 2); },
      {"COHORT_BLAS=onednn", "libcohort-test-no-such-dnnl.so.2", "libdnnl2"});
  Tensor a = ones({2, 2});
  expectError<NotSupportedError>([&] { mm(a, a); }, {"COHORT_BLAS=onednn"});
  // float64 does not need oneDNN.
  testing::expectNear(mm(a.to(DType::Float64), a.to(DType::Float64)), {2, 2, 2, 2}, 0);
  std::string why;
  EXPECT_FALSE(blas::backendAvailable(Backend::OneDnn, &why));
  EXPECT_TRUE(contains(why, "libcohort-test-no-such-dnnl.so.2")) << why;
}

TEST(SgemmEnvChild, DISABLED_UnknownValue) {
  if (!isChild()) GTEST_SKIP() << "run by SgemmEnv.*";
  std::vector<float> x(4, 1.f), y(4);
  for (int i = 0; i < 2; ++i)  // not remembered as a choice: every call says so
    expectError<ValueError>(
        [&] { blas::sgemm(Trans::No, Trans::No, 2, 2, 2, 1.f, x.data(), 2, x.data(), 2, 0.f, y.data(), 2); },
        {"COHORT_BLAS='mkl'", "auto, openblas, onednn"});
}

TEST(SgemmEnvChild, DISABLED_HgemmWidened) {
  if (!isChild()) GTEST_SKIP() << "run by HgemmEnv.*";
  std::string why;
  EXPECT_FALSE(blas::hgemmNative(HalfType::BFloat16, &why));
  EXPECT_EQ(why, "COHORT_HGEMM=widen");
  EXPECT_TRUE(contains(blas::describe(), "bfloat16: widened to float32 (COHORT_HGEMM=widen)")) << blas::describe();
  for (const Case& c : randomCases(23, 10)) checkHgemm(HalfType::BFloat16, false, true, c, 77);
}

TEST(SgemmEnvChild, DISABLED_HgemmUnknownValue) {
  if (!isChild()) GTEST_SKIP() << "run by HgemmEnv.*";
  std::vector<uint16_t> x(4, 0);
  std::vector<float> y(4);
  for (int i = 0; i < 2; ++i)
    expectError<ValueError>(
        [&] {
          blas::hgemm(HalfType::BFloat16, true, Trans::No, Trans::No, 2, 2, 2, 1.f, x.data(), 2, x.data(), 2, 0.f,
                      y.data(), 2);
        },
        {"COHORT_HGEMM='fast'", "auto, onednn, widen"});
}

}  // namespace
}  // namespace cohort
