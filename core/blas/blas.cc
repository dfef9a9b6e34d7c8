#include <cohort/core/blas/blas.h>

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <cohort/core/util/check.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/logging.h>

namespace cohort::blas {
namespace {

COHORT_ENV_KNOB(kCoreType, "OPENBLAS_CORETYPE", "",
                "OpenBLAS kernel family; when unset cohort picks one from the CPU's features (see docs/benchmarks.md).");
COHORT_ENV_KNOB(kBlasLib, "COHORT_BLAS_LIBRARY", "libopenblas.so.0", "The OpenBLAS shared library cohort loads.");

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float, const float*,
                         blasint, const float*, blasint, float, float*, blasint);
using DgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, double,
                         const double*, blasint, const double*, blasint, double, double*, blasint);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using CoreNameFn = char* (*)();

struct Lib {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  SetThreadsFn setThreads = nullptr;
  GetThreadsFn getThreads = nullptr;
  CoreNameFn coreName = nullptr;
  std::string path;
};

std::string detectCoreType() {
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512) {
    // CooperLake adds bf16 kernels on top of SkylakeX; both run the same AVX-512 sgemm.
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    bool bf16 = (a >> 5) & 1;
    return bf16 ? "CooperLake" : "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

const Lib& lib() {
  static Lib* l = [] {
    auto* out = new Lib();
    if (!kCoreType.raw()) {
      std::string core = detectCoreType();
      if (!core.empty()) setenv("OPENBLAS_CORETYPE", core.c_str(), 0);
    }
    out->path = kBlasLib.str();
    void* h = dlopen(out->path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr)
      throw Error(fmt::format("cannot load the BLAS library {}: {} (install Debian's libopenblas0, or set "
                              "COHORT_BLAS_LIBRARY)",
                              out->path, dlerror()));
    out->sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    out->dgemm = reinterpret_cast<DgemmFn>(dlsym(h, "cblas_dgemm"));
    out->setThreads = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"));
    out->getThreads = reinterpret_cast<GetThreadsFn>(dlsym(h, "openblas_get_num_threads"));
    out->coreName = reinterpret_cast<CoreNameFn>(dlsym(h, "openblas_get_corename"));
    if (!out->sgemm || !out->dgemm)
      throw Error(fmt::format("the BLAS library {} has no cblas_sgemm/cblas_dgemm", out->path));
    if (out->coreName) {
      std::string name = out->coreName();
      COHORT_LOG(Debug, "BLAS: {} running {} kernels", out->path, name);
      if (name == "Prescott" && !detectCoreType().empty())
        COHORT_LOG(Warning,
                   "OpenBLAS runs its slow 'Prescott' kernels on a CPU with AVX2/AVX-512 (it was loaded before "
                   "cohort could set OPENBLAS_CORETYPE); expect GEMM about 5x slower");
    }
    return out;
  }();
  return *l;
}

CBLAS_TRANSPOSE tr(Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; }

blasint toBlasInt(int64_t v, const char* what) {
  COHORT_CHECK_T(ValueError, v >= 0 && v <= INT32_MAX, "gemm: {} = {} does not fit BLAS's 32-bit integers", what, v);
  return static_cast<blasint>(v);
}

}  // namespace

void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  lib().sgemm(CblasRowMajor, tr(ta), tr(tb), toBlasInt(m, "m"), toBlasInt(n, "n"), toBlasInt(k, "k"), alpha, a,
              toBlasInt(lda, "lda"), b, toBlasInt(ldb, "ldb"), beta, c, toBlasInt(ldc, "ldc"));
}

void dgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  lib().dgemm(CblasRowMajor, tr(ta), tr(tb), toBlasInt(m, "m"), toBlasInt(n, "n"), toBlasInt(k, "k"), alpha, a,
              toBlasInt(lda, "lda"), b, toBlasInt(ldb, "ldb"), beta, c, toBlasInt(ldc, "ldc"));
}

std::string libraryName() { return lib().path; }
std::string coreName() { return lib().coreName ? std::string(lib().coreName()) : "unknown"; }
std::string chosenCoreType() { return detectCoreType(); }
void setNumThreads(int n) {
  if (lib().setThreads) lib().setThreads(n);
}
int numThreads() { return lib().getThreads ? lib().getThreads() : 1; }

}  // namespace cohort::blas
