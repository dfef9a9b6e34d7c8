#include <cohort/core/blas/blas.h>
#include <cohort/core/blas/detail/loader.h>

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <cohort/core/util/check.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/logging.h>

namespace cohort::blas {
namespace {

using detail::applyOmpThreads;
using detail::checkArgs;
using detail::Dnnl;
using detail::dnnlLoad;
using detail::DnnlLoad;
using detail::DnnlSgemmFn;
using detail::scaleC;
using detail::statusName;

COHORT_ENV_KNOB(
    kCoreType, "OPENBLAS_CORETYPE", "",
    "OpenBLAS kernel family; when unset cohort picks one from the CPU's features (see docs/benchmarks.md).");
COHORT_ENV_KNOB(kBlasLib, "COHORT_BLAS_LIBRARY", "libopenblas.so.0", "The OpenBLAS shared library cohort loads.");
COHORT_ENV_KNOB(kBackendKnob, "COHORT_BLAS", "auto",
                "Which library runs float32 GEMM: auto (oneDNN's dnnl_sgemm when it loads, else OpenBLAS), openblas, "
                "or onednn (an error when oneDNN cannot be loaded). float64 always runs on OpenBLAS. Read once, at the "
                "first float32 GEMM.");
COHORT_ENV_KNOB(kDnnlLib, "COHORT_ONEDNN_LIBRARY", "libdnnl.so.2",
                "The oneDNN shared library cohort loads for float32 GEMM (Debian package libdnnl2).");

// ---- OpenBLAS ----------------------------------------------------------------------------------

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float, const float*,
                         blasint, const float*, blasint, float, float*, blasint);
using DgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, double,
                         const double*, blasint, const double*, blasint, double, double*, blasint);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using CoreNameFn = char* (*)();

struct OpenBlas {
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

struct OpenBlasLoad {
  const OpenBlas* lib = nullptr;  // null when loading failed
  std::string error;
};

// Loads OpenBLAS once; never throws (a failure is remembered and reported by openblas()).
const OpenBlasLoad& openblasLoad() {
  static const OpenBlasLoad* l = [] {
    auto* out = new OpenBlasLoad();
    if (!kCoreType.raw()) {
      std::string core = detectCoreType();
      if (!core.empty()) setenv("OPENBLAS_CORETYPE", core.c_str(), 0);
    }
    auto* lib = new OpenBlas();
    lib->path = kBlasLib.str();
    void* h = dlopen(lib->path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      out->error = fmt::format("cannot load the BLAS library {}: {} (install Debian's libopenblas0, or set "
                               "COHORT_BLAS_LIBRARY)",
                               lib->path, dlerror());
      delete lib;
      return out;
    }
    lib->sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    lib->dgemm = reinterpret_cast<DgemmFn>(dlsym(h, "cblas_dgemm"));
    lib->setThreads = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"));
    lib->getThreads = reinterpret_cast<GetThreadsFn>(dlsym(h, "openblas_get_num_threads"));
    lib->coreName = reinterpret_cast<CoreNameFn>(dlsym(h, "openblas_get_corename"));
    if (!lib->sgemm || !lib->dgemm) {
      out->error = fmt::format("the BLAS library {} has no cblas_sgemm/cblas_dgemm", lib->path);
      delete lib;
      return out;
    }
    if (lib->coreName) {
      std::string name = lib->coreName();
      COHORT_LOG(Debug, "BLAS: {} running {} kernels", lib->path, name);
      if (name == "Prescott" && !detectCoreType().empty())
        COHORT_LOG(Warning,
                   "OpenBLAS runs its slow 'Prescott' kernels on a CPU with AVX2/AVX-512 (it was loaded before "
                   "cohort could set OPENBLAS_CORETYPE); expect GEMM about 5x slower");
    }
    out->lib = lib;
    return out;
  }();
  return *l;
}

const OpenBlas& openblas() {
  const OpenBlasLoad& l = openblasLoad();
  if (l.lib == nullptr) throw Error(l.error);
  return *l.lib;
}

// ---- oneDNN ------------------------------------------------------------------------------------

// oneDNN's version query (dnnl_version_t), declared here so this file needs no oneDNN headers.
struct DnnlVersion {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpuRuntime, gpuRuntime;
};
using DnnlVersionFn = const DnnlVersion* (*)();
constexpr unsigned kDnnlRuntimeSeq = 1u, kDnnlRuntimeOmp = 2u;  // DNNL_RUNTIME_SEQ / _OMP (dnnl_config.h)

}  // namespace

namespace detail {

const char* statusName(int s) {
  switch (s) {
    case 0: return "success";
    case 1: return "out_of_memory";
    case 2: return "invalid_arguments";
    case 3: return "unimplemented";
    case 5: return "runtime_error";
    default: return "unknown status";
  }
}

}  // namespace detail

namespace {}  // namespace

namespace detail {

// Loads oneDNN once; never throws. It is usable only when cohort can size its threads: a
// sequential build, or an OpenMP build whose omp_set_num_threads cohort can reach.
const DnnlLoad& dnnlLoad() {
  static const DnnlLoad* l = [] {
    auto* out = new DnnlLoad();
    std::string path = kDnnlLib.str();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      out->error = fmt::format("cannot load {}: {} (Debian package libdnnl2)", path, dlerror());
      return out;
    }
    auto sgemm = reinterpret_cast<DnnlSgemmFn>(dlsym(h, "dnnl_sgemm"));
    auto version = reinterpret_cast<DnnlVersionFn>(dlsym(h, "dnnl_version"));
    if (!sgemm || !version) {
      out->error = fmt::format("{} has no dnnl_sgemm/dnnl_version", path);
      return out;
    }
    const DnnlVersion* v = version();
    auto* lib = new Dnnl();
    lib->handle = h;
    lib->sgemm = sgemm;
    std::string runtime;
    if (v->cpuRuntime == kDnnlRuntimeOmp) {
      // The OpenMP runtime oneDNN was linked against; dlsym on the handle searches its dependencies.
      lib->ompSetNumThreads = reinterpret_cast<OmpSetFn>(dlsym(h, "omp_set_num_threads"));
      lib->ompGetMaxThreads = reinterpret_cast<OmpGetFn>(dlsym(h, "omp_get_max_threads"));
      if (!lib->ompSetNumThreads || !lib->ompGetMaxThreads) {
        out->error = fmt::format("{} threads through OpenMP but omp_set_num_threads is not reachable", path);
        delete lib;
        return out;
      }
      runtime = "OpenMP";
    } else if (v->cpuRuntime == kDnnlRuntimeSeq) {
      runtime = "sequential";
    } else {
      out->error = fmt::format("{} uses CPU runtime {:#x} (not OpenMP or sequential), whose threads cohort cannot size",
                               path, v->cpuRuntime);
      delete lib;
      return out;
    }
    lib->desc = fmt::format("oneDNN {}.{}.{} ({}, {})", v->major, v->minor, v->patch, path, runtime);
    out->lib = lib;
    return out;
  }();
  return *l;
}

}  // namespace detail

namespace {

// ---- threads -----------------------------------------------------------------------------------

std::atomic<int> gThreads{0};  // 0 until resolved or set
std::mutex gThreadsMu;         // keeps gThreads and OpenBLAS's count in step

int threadCount() {
  int n = gThreads.load(std::memory_order_acquire);
  if (n > 0) return n;
  static const int kDefault = [] {
    const OpenBlasLoad& o = openblasLoad();
    if (o.lib && o.lib->getThreads) return std::max(1, o.lib->getThreads());
    const DnnlLoad& d = dnnlLoad();
    if (d.lib && d.lib->ompGetMaxThreads) return std::max(1, d.lib->ompGetMaxThreads());
    return 1;
  }();
  int expected = 0;
  gThreads.compare_exchange_strong(expected, kDefault, std::memory_order_acq_rel);
  return gThreads.load(std::memory_order_acquire);
}

}  // namespace

namespace detail {

// OpenMP's thread count is per calling thread: set this thread's to cohort's before each call.
void applyOmpThreads(const Dnnl& d) {
  if (!d.ompSetNumThreads) return;
  int want = threadCount();
  if (d.ompGetMaxThreads() != want) d.ompSetNumThreads(want);
}

}  // namespace detail

namespace {

// ---- backend choice ----------------------------------------------------------------------------

struct Choice {
  Backend backend;
  std::string desc;  // for describe(): the library and why it was chosen
};

Choice chooseBackend() {
  std::string mode = kBackendKnob.str();
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  if (mode != "auto" && mode != "openblas" && mode != "onednn")
    throw ValueError(
        fmt::format("environment variable COHORT_BLAS='{}' is not one of auto, openblas, onednn", kBackendKnob.str()));
  if (mode == "openblas") {
    COHORT_LOG(Debug, "BLAS: float32 and float64 GEMM on OpenBLAS (COHORT_BLAS=openblas)");
    return {Backend::OpenBlas, "OpenBLAS (COHORT_BLAS=openblas)"};
  }
  const DnnlLoad& d = dnnlLoad();
  if (d.lib == nullptr) {
    if (mode == "onednn")
      throw NotSupportedError(fmt::format("COHORT_BLAS=onednn but oneDNN cannot be used: {} (install Debian's "
                                          "libdnnl2, or set COHORT_BLAS=auto to fall back to OpenBLAS)",
                                          d.error));
    COHORT_LOG(Debug, "BLAS: float32 and float64 GEMM on OpenBLAS (COHORT_BLAS=auto; oneDNN unavailable: {})", d.error);
    return {Backend::OpenBlas, fmt::format("OpenBLAS (oneDNN unavailable: {})", d.error)};
  }
  COHORT_LOG(Debug, "BLAS: float32 GEMM on {} (COHORT_BLAS={}); float64 on OpenBLAS", d.lib->desc, mode);
  return {Backend::OneDnn, d.lib->desc};
}

const Choice& choice() {
  static const Choice kChoice = chooseBackend();  // a throw leaves it unset: the next call throws again
  return kChoice;
}

// ---- arguments ---------------------------------------------------------------------------------

}  // namespace

namespace detail {

void checkArgs(const char* op, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
               int64_t ldc) {
  COHORT_CHECK_T(ValueError, m >= 0 && n >= 0 && k >= 0, "{}: negative size m={} n={} k={}", op, m, n, k);
  int64_t aCols = ta == Trans::No ? k : m, bCols = tb == Trans::No ? n : k;
  COHORT_CHECK_T(ValueError, lda >= std::max<int64_t>(1, aCols),
                 "{}: lda={} is less than the {} columns A is stored with (m={} n={} k={}, A {})", op, lda, aCols, m, n,
                 k, ta == Trans::No ? "not transposed" : "transposed");
  COHORT_CHECK_T(ValueError, ldb >= std::max<int64_t>(1, bCols),
                 "{}: ldb={} is less than the {} columns B is stored with (m={} n={} k={}, B {})", op, ldb, bCols, m, n,
                 k, tb == Trans::No ? "not transposed" : "transposed");
  COHORT_CHECK_T(ValueError, ldc >= std::max<int64_t>(1, n), "{}: ldc={} is less than n={} (m={} k={})", op, ldc, n, m,
                 k);
}

}  // namespace detail

namespace {

CBLAS_TRANSPOSE tr(Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; }

blasint toBlasInt(const char* op, int64_t v, const char* what) {
  COHORT_CHECK_T(ValueError, v <= INT32_MAX, "{}: {} = {} does not fit OpenBLAS's 32-bit integers", op, what, v);
  return static_cast<blasint>(v);
}

void sgemmOpenBlas(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char* op = "sgemm";
  openblas().sgemm(CblasRowMajor, tr(ta), tr(tb), toBlasInt(op, m, "m"), toBlasInt(op, n, "n"), toBlasInt(op, k, "k"),
                   alpha, a, toBlasInt(op, lda, "lda"), b, toBlasInt(op, ldb, "ldb"), beta, c,
                   toBlasInt(op, ldc, "ldc"));
}

void sgemmOneDnn(const Dnnl& d, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  applyOmpThreads(d);
  int status =
      d.sgemm(ta == Trans::Yes ? 'T' : 'N', tb == Trans::Yes ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != 0)
    throw Error(fmt::format("sgemm: oneDNN's dnnl_sgemm failed with status {} ({}) for m={} n={} k={} lda={} ldb={} "
                            "ldc={}",
                            status, statusName(status), m, n, k, lda, ldb, ldc));
}

}  // namespace

const char* backendName(Backend b) { return b == Backend::OneDnn ? "onednn" : "openblas"; }

Backend sgemmBackend() { return choice().backend; }

bool backendAvailable(Backend b, std::string* why) {
  const std::string& error = b == Backend::OneDnn ? dnnlLoad().error : openblasLoad().error;
  bool ok = b == Backend::OneDnn ? dnnlLoad().lib != nullptr : openblasLoad().lib != nullptr;
  if (!ok && why) *why = error;
  return ok;
}

void sgemmOn(Backend backend, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  checkArgs("sgemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.f) return scaleC(beta, c, m, n, ldc);
  if (backend == Backend::OpenBlas) return sgemmOpenBlas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const DnnlLoad& d = dnnlLoad();
  if (d.lib == nullptr) throw NotSupportedError(fmt::format("sgemm on oneDNN: {}", d.error));
  sgemmOneDnn(*d.lib, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemmOn(sgemmBackend(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  const char* op = "dgemm";
  checkArgs(op, ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0) return scaleC(beta, c, m, n, ldc);
  openblas().dgemm(CblasRowMajor, tr(ta), tr(tb), toBlasInt(op, m, "m"), toBlasInt(op, n, "n"), toBlasInt(op, k, "k"),
                   alpha, a, toBlasInt(op, lda, "lda"), b, toBlasInt(op, ldb, "ldb"), beta, c,
                   toBlasInt(op, ldc, "ldc"));
}

std::string libraryName() { return openblas().path; }
std::string coreName() { return openblas().coreName ? std::string(openblas().coreName()) : "unknown"; }
std::string chosenCoreType() { return detectCoreType(); }

std::string describe() {
  std::string f32;
  try {
    f32 = choice().desc;
  } catch (const Error& e) {
    f32 = std::string("unavailable: ") + e.what();
  }
  const OpenBlasLoad& o = openblasLoad();
  std::string f64 = o.lib ? fmt::format("OpenBLAS {} ({} kernels)", o.lib->path, coreName()) : o.error;
  int n = threadCount();
  return fmt::format("float32: {}; float64: {}; bfloat16: {}; float16: {}; {} thread{}", f32, f64,
                     detail::halfDescription(HalfType::BFloat16), detail::halfDescription(HalfType::Float16), n,
                     n == 1 ? "" : "s");
}

void setNumThreads(int n) {
  COHORT_CHECK_T(ValueError, n >= 1, "blas::setNumThreads: n = {} must be at least 1", n);
  std::lock_guard<std::mutex> lock(gThreadsMu);
  gThreads.store(n, std::memory_order_release);
  const OpenBlasLoad& o = openblasLoad();
  if (o.lib && o.lib->setThreads) o.lib->setThreads(n);
}

int numThreads() { return threadCount(); }

}  // namespace cohort::blas
