/*
 * AVX-512 builds of the compute-bound float32 kernels, chosen at run time.
 *
 * The library is compiled for x86-64-v3 (AVX2) so that it runs on any CPU of the last decade
 * (CMakeLists.txt says why not -march=native). The kernels that are bound by arithmetic rather
 * than memory (pow, gelu, exp, log, tanh, sigmoid, silu, and the backward of gelu and silu) run
 * ~1.5x faster per core when the same vecmath code is compiled for 512-bit vectors: the long
 * dependency chains of one 8-lane vector leave a core idle, 16 lanes per instruction keep twice as
 * many elements in flight. So simd_avx512.cc holds just those loops, compiled with
 * -march=x86-64-v4, and the ops call them when the CPU has AVX-512 (F, VL, DQ, BW) and the operands
 * are contiguous float32 (or, for the activations and their backwards, contiguous bfloat16/float16,
 * widened a block at a time); otherwise, and for every other dtype and layout, the portable
 * kernels run. Both compile the same vecmath functions, so results are bit-identical, a NaN's sign
 * aside — except pow, which on AVX-512 is a table-driven kernel in double lanes (simd_avx512.cc):
 * faster, and within 0.5001 ulp of the exact result where the portable one is within 1.2, so the
 * two may differ in the last bit; IEEE's special cases are identical. tests/core/ops/simd_test.cc
 * checks all of this over random and special inputs.
 *
 * COHORT_SIMD=avx2 turns the AVX-512 kernels off (benchmarks compare the two); setEnabled is the
 * same switch for tests.
 */
#pragma once

#include <cstdint>

#include <cohort/core/tensor/tensor.h>

namespace cohort::vecmath {
struct PowExponent;
}

namespace cohort::detail::simd {

enum class Unary { Exp, Log, Tanh, Sigmoid, Silu, GeluErf, GeluTanh };
// The backward of an activation: the upstream gradient times the derivative (vecmath's *Grad).
enum class UnaryGrad { GeluErf, GeluTanh, Silu };

// Whether the AVX-512 kernels were built, the CPU runs them, and they are not switched off.
bool enabled();
// Tests: switch them off (false) or back to what the CPU and COHORT_SIMD allow (true).
void setEnabled(bool on);
// "avx512" or "avx2", for benchmark headers.
const char* describe();

// Each writes the op's result into `out` through the AVX-512 kernel, split across the intra-op
// threads, and returns true; or returns false with nothing written when that kernel does not apply
// (disabled, or the operands are not all contiguous CPU tensors of out's dtype and shape in a float
// type it takes), in which case the caller runs its portable kernel. `out` may be an input.
// unary also takes bfloat16 and float16 tensors: blocks of them are widened into an L1-resident
// float32 buffer, computed by the float32 kernel and rounded once, as the portable kernel rounds
// each element.
bool unary(Tensor& out, const Tensor& a, Unary k);
// g * f'(x) for the activation k: float32, bfloat16 or float16 through the same blocks as unary.
bool unaryGrad(Tensor& out, const Tensor& g, const Tensor& x, UnaryGrad k);
// float32 only.
bool powScalar(Tensor& out, const Tensor& a, const vecmath::PowExponent& e);
// The fused attention's weight tiles: for each row i < rows of x (row stride ld), x[i][j] =
// exp(x[i][j] - shift[i]) for j < kept(i) and 0 for kept(i) <= j < cols, where kept(i) =
// clamp(diag + i, 0, cols) (under a causal mask row i sees the keys up to the diagonal; diag >= cols
// keeps every column). vecmath::exp: the same bits as a portable loop over it. False, with nothing
// done, when the AVX-512 kernels are not enabled.
bool expShiftedRows(float* x, int64_t rows, int64_t cols, int64_t ld, const float* shift, int64_t diag);
// n contiguous bfloat16 values widened to float32, or float32 values rounded to bfloat16: by the
// AVX-512 loops where enabled, else by bfloat16ToFloatN / floatToBFloat16N, with the same bits.
void widenBFloat16(const BFloat16* src, float* dst, int64_t n);
void roundToBFloat16(const float* src, BFloat16* dst, int64_t n);
// float32 only.
bool powTensor(Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace cohort::detail::simd
