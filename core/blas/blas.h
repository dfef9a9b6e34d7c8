/*
 * cohort's BLAS: single- and double-precision GEMM, loaded at first use (core/blas/blas.cc), and
 * on oneDNN's matmul primitive (core/blas/hgemm.cc) half-width GEMM (hgemm below, or widened to
 * float32) and float32 GEMM with a bias (sgemmBias).
 *
 * Which library (measured in docs/benchmarks.md, "GEMM"):
 *  - float32 runs on oneDNN's dnnl_sgemm (Debian's libdnnl2, libdnnl.so.2) when that library can be
 *    loaded: on this project's CPUs it is 10-15% faster than every OpenBLAS kernel family, BLIS and
 *    Eigen, and the goal is 90% of the best BLAS on the machine. Otherwise float32 runs on
 *    OpenBLAS. The environment variable COHORT_BLAS=auto|openblas|onednn (read once, at the first
 *    float32 GEMM) forces one; COHORT_BLAS=onednn when oneDNN cannot be loaded is a
 *    NotSupportedError, not a silent fallback.
 *  - float64 always runs on OpenBLAS (oneDNN has no double GEMM), and so does float32 without oneDNN.
 *
 * Why OpenBLAS is loaded rather than linked: Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its
 * kernels in a library constructor from the CPU model, and misdetects newer Xeons (family 6 model
 * 207) as "Prescott", running 5x slower. The only switch is the OPENBLAS_CORETYPE variable, read by
 * that constructor, which runs before any code of a program that links the library. Loading it
 * ourselves lets cohort set the right core type from the CPU's features first, so users get the fast
 * kernels without setting anything; an explicit OPENBLAS_CORETYPE is respected. oneDNN is loaded the
 * same way so that a machine without libdnnl2 still runs cohort.
 * Both libraries are opened once per process and never closed (both keep worker threads).
 *
 * Threads: one count, setNumThreads(n), governs both libraries from every thread. OpenBLAS's count
 * is process-wide; Debian's oneDNN threads through OpenMP, whose thread count is per calling thread,
 * so before each oneDNN call cohort sets the calling thread's OpenMP count to numThreads() when it
 * differs. Until setNumThreads is called the count is OpenBLAS's own default (OPENBLAS_NUM_THREADS,
 * else OMP_NUM_THREADS, else the number of cores).
 *
 * Thread-safe: loading happens once; GEMM may be called from any thread.
 */
#pragma once

#include <cstdint>
#include <string>

namespace cohort::blas {

enum class Trans { No, Yes };

// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, where op(X) is X or X^T:
// A is stored [m,k] (Trans::No) or [k,m] (Trans::Yes) with row stride lda, B [k,n] or [n,k] with
// ldb, C [m,n] with ldc. Requires m, n, k >= 0, lda >= max(1, stored columns of A), likewise ldb,
// and ldc >= max(1, n); anything else is a ValueError naming the argument (never a BLAS message on
// stderr and an untouched C). As in reference BLAS, when k == 0 or alpha == 0 the product is not
// formed and C = beta * C, and when beta == 0 C is only written (NaN in it does not propagate).
void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void dgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// Row-major C[m,n] = op(A)[m,k] * op(B)[k,n] + bias[n] added to every row, float32: a linear layer.
// Where float32 GEMM runs on oneDNN with one BLAS thread this is oneDNN's matmul primitive with
// the bias as an input, added as each tile of C is stored, so C is written once and never read (a
// primitive is built once per shape and kept); elsewhere (more threads: oneDNN's matmul would
// start an OpenMP team that a later fork() cannot use) C is filled with the bias and sgemm adds
// the product. For a large k the two may sum the product in different orders (float32
// rounding apart); each gives the same bits on every run. Same argument rules as sgemm, and bias
// may be null only when n == 0.
void sgemmBias(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, const float* bias, float* c, int64_t ldc);

// Half-width GEMM: A and B hold bfloat16 or float16 values (raw 16-bit patterns), products
// accumulate in float32, and C is float32 (cFloat32) or the inputs' half type, rounded once.
// Same layout, argument checks and k == 0 / alpha == 0 / beta == 0 rules as sgemm.
// Two paths: oneDNN's matmul primitive (for bfloat16 on CPUs with AVX512-BF16 it uses those
// instructions; primitives are built once per shape and kept), or A and B widened to float32 and
// multiplied by sgemm, so a half GEMM is never much slower than a float32 one. Which one runs is
// decided once per process and type: COHORT_HGEMM=onednn or widen pins it; the default, auto,
// takes oneDNN only when the kernel its matmul would run is an AMX one, else widens; it never
// times anything. The paths sum in different orders, so a job that must give the same bits on
// every machine pins one.
// describe() says which runs and why; an Info line says so when the half type is widened.
enum class HalfType { BFloat16, Float16 };
void hgemm(HalfType type, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
           const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, int64_t ldc);
// Half-width GEMM with a bias: C[m,n] (the half type) = op(A) op(B) + bias[n] on every row, the
// product and the bias summed in float32 and rounded once: a linear layer in bfloat16/float16.
// Where hgemm runs on oneDNN the bias is an input of its matmul, added as each tile of C is stored
// (C is written once, never read); elsewhere C is filled with the bias, rounded to the half type,
// and hgemm adds the product (beta = 1). The two give the same bits when the bias is a half value
// widened to float32, as autocast's is. Same argument rules as sgemmBias.
void hgemmBias(HalfType type, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, const float* bias, uint16_t* c, int64_t ldc);
// Whether hgemm runs natively (on oneDNN) for `type` here; when not, `why` says why.
bool hgemmNative(HalfType type, std::string* why = nullptr);
// hgemm through the float32 fallback whatever oneDNN offers (tests and benchmarks compare the two).
void hgemmFallback(HalfType type, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, int64_t ldc);

// The libraries float32 GEMM can run on.
enum class Backend { OpenBlas, OneDnn };
// "openblas" / "onednn" (the values COHORT_BLAS takes).
const char* backendName(Backend b);
// The backend sgemm uses in this process, chosen at the first call from COHORT_BLAS.
// Throws ValueError for an unknown COHORT_BLAS value, NotSupportedError for COHORT_BLAS=onednn
// when oneDNN cannot be loaded.
Backend sgemmBackend();
// Whether `b` can run here; when it cannot, `why` (if given) says why (the loader's message).
bool backendAvailable(Backend b, std::string* why = nullptr);
// sgemm on a given backend whatever COHORT_BLAS says (tests and benchmarks compare the two);
// NotSupportedError when that backend is unavailable. Same contract as sgemm.
void sgemmOn(Backend backend, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// What was loaded: OpenBLAS's library path and the core type it runs ("CooperLake", "Haswell", ...).
std::string libraryName();
std::string coreName();
// The core type cohort would choose for this CPU (empty when the CPU needs no override).
std::string chosenCoreType();
// One line saying which library runs each precision, e.g. "float32: oneDNN 2.6.3 (libdnnl.so.2,
// OpenMP); float64: OpenBLAS /usr/lib/.../libopenblas.so.0 (Cooperlake kernels); 1 thread".
std::string describe();
// BLAS threads for both libraries and every calling thread (see above). n >= 1, else ValueError.
void setNumThreads(int n);
int numThreads();

}  // namespace cohort::blas
