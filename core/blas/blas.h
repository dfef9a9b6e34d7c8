/*
 * cohort's BLAS: single- and double-precision GEMM through OpenBLAS, loaded at first use.
 *
 * Why loaded rather than linked: Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels in a
 * library constructor from the CPU model, and misdetects newer Xeons (family 6 model 207) as
 * "Prescott", running 5x slower. The only switch is the OPENBLAS_CORETYPE variable, read by that
 * constructor, which runs before any code of a program that links the library. Loading it
 * ourselves lets cohort set the right core type from the CPU's features first, so users get the
 * fast kernels without setting anything; an explicit OPENBLAS_CORETYPE is respected. (On AMD Zen 4
 * the same OpenBLAS already picks its AVX-512 "Cooperlake" kernels, which is also what cohort asks for.)
 * Why OpenBLAS and not BLIS or oneDNN: measured side by side on one thread, the AVX2/AVX-512 kernel
 * families, BLIS and oneDNN's sgemm are within about 10% of each other; oneDNN has no double GEMM and
 * brings an OpenMP pool, BLIS picks "zen3" kernels. One library for both precisions, whose threads
 * cohort controls, wins; docs/benchmarks.md (GEMM) has the figures.
 * The library is opened once per process and never closed (OpenBLAS keeps worker threads).
 *
 * Thread-safe: loading happens once; GEMM may be called from any thread.
 */
#pragma once

#include <cstdint>
#include <string>

namespace cohort::blas {

enum class Trans { No, Yes };

// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C.
void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void dgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// What was loaded: library path and the core type OpenBLAS runs ("CooperLake", "Haswell", ...).
std::string libraryName();
std::string coreName();
// The core type cohort would choose for this CPU (empty when the CPU needs no override).
std::string chosenCoreType();
// BLAS threads (OpenBLAS obeys OPENBLAS_NUM_THREADS / OMP_NUM_THREADS at load).
void setNumThreads(int n);
int numThreads();

}  // namespace cohort::blas
