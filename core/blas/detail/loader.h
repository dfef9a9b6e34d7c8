// What core/blas/blas.cc (OpenBLAS and oneDNN loading, float32/float64 GEMM) shares with
// core/blas/hgemm.cc (half-width GEMM): the oneDNN library as loaded, its thread sizing and
// status names, and GEMM's argument rules. Internal: not installed for users.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cohort/core/blas/blas.h>

namespace cohort::blas::detail {

// dnnl_sgemm from oneDNN's C API (dnnl.h; declared here so the build needs no oneDNN headers):
// row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, transa/transb 'N' or 'T', 64-bit
// dimensions, returns dnnl_status_t (0 = success).
using DnnlSgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                            float, float*, int64_t);
using OmpSetFn = void (*)(int);
using OmpGetFn = int (*)();

struct Dnnl {
  void* handle = nullptr;  // the dlopen handle (never closed)
  DnnlSgemmFn sgemm = nullptr;
  OmpSetFn ompSetNumThreads = nullptr;  // null for a sequential build
  OmpGetFn ompGetMaxThreads = nullptr;
  std::string desc;  // "oneDNN 2.6.3 (libdnnl.so.2, OpenMP)"
};

struct DnnlLoad {
  const Dnnl* lib = nullptr;
  std::string error;
};

// oneDNN's status codes by name ("unimplemented", ...).
const char* statusName(int s);
// Loads oneDNN once; never throws (a failure is in DnnlLoad::error).
const DnnlLoad& dnnlLoad();
// Sets the calling thread's OpenMP thread count to cohort's BLAS thread count.
void applyOmpThreads(const Dnnl& d);
// GEMM's argument rules (blas.h): ValueError naming `op` and the bad argument.
void checkArgs(const char* op, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
               int64_t ldc);

// C = beta * C without reading C when beta == 0 (the k == 0 / alpha == 0 case of GEMM).
template <typename T>
void scaleC(T beta, T* c, int64_t m, int64_t n, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    else
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

// describe()'s words for a half type: "oneDNN matmul (...)" or "widened to float32 (why)".
std::string halfDescription(HalfType t);

// COHORT_HGEMM=auto's rule, given the implementation name of the matmul oneDNN would run for `t`
// and whether the CPU is AMD's: oneDNN for an AMX kernel, and for bfloat16 on an AMD CPU's
// AVX512-BF16 kernel; widening otherwise (reference kernels included). `how` (when set and the
// answer is true) says which case, `why` (when false) why not. Internal to core/blas and its tests.
bool autoUsesOneDnn(HalfType t, const std::string& impl, bool amd, std::string* how, std::string* why);

}  // namespace cohort::blas::detail
