// The CPU's fused scaled-dot-product attention kernel, in the manner of FlashAttention (Dao et al.):
// softmax(q k^T * scale + mask) v never exists as a [Tq, Tk] matrix.
//
// Forward: every (batch entry, block of kFwdBlockQ query rows) is one work item (parallelFor over
// them). It walks the keys in blocks of kFwdBlockK: S = scale * Q_blk K_blk^T (one GEMM into a
// per-thread tile), the mask is added, and an online softmax keeps per row the running maximum m
// and the running sum l of exp(s - m); when a block raises m, the partial output and l are scaled
// by exp(m_old - m_new) before P = exp(S - m) times V_blk is added (the second GEMM). At the end
// the output is acc / l and the row's log-sum-exp m + log(l) is kept for backward. Under a causal
// mask the key loop stops at the diagonal; only the tile on it is masked element by element.
//
// Backward recomputes P = exp(S - lse) tile by tile from q, k and the saved log-sum-exp: for each
// batch entry (one per work item) it walks key blocks and, inside, chunks of query rows, adding
// dV += P^T dO, dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O), dQ += dS K * scale and
// dK += dS^T Q * scale (five GEMMs per tile; under a causal mask the rows start at the first one
// that sees the key block). Memory is linear in the sequence lengths: q, k, v, the output, one
// log-sum-exp per query row, one batch entry's gradients, and tiles of fixed size per thread.
//
// Dropout (detail::SdpaDropout) regenerates its keep mask from a hashed key in both passes.
//
// The GEMMs are cohort::blas on tiles (inputs are read in place when their last dim is
// contiguous: the transposed head views of a fused qkv projection need no copy). float32 and
// float64 compute natively. bfloat16 inputs, where blas::hgemm runs natively (oneDNN), are multiplied
// in bfloat16 with float32 accumulation: q, k, v and the output gradient are read in place, and the
// weights P and score gradients dS are rounded to bfloat16 before the products that take them (as
// FlashAttention kernels do), while scores, the softmax, the log-sum-exp and the gradients dq, dk,
// dv are float32. float16 (and bfloat16 where hgemm widens) is converted to float32 and computed
// there. The result is rounded back to the input's type. The output is saved for backward in the
// input's type (D = rowsum(dO * O) reads it), and each batch entry's gradients are summed in
// per-thread C buffers and stored once, in the input's type.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/detail/attention.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/util/parallel.h>

namespace cohort::detail {
namespace {

// Tile sizes (query rows x keys). The forward's query blocks are small, so that the causal
// diagonal wastes little, and its key blocks long; the backward's key blocks are small and its
// query chunks long. Long sides mean few, large GEMM calls: a call has a fixed cost (oneDNN packs
// its operands; a bfloat16 matmul call costs about a microsecond besides the product). Against
// 64 x 128 forward and 64 x 64 backward tiles this took causal attention from 21 to 18 ms (1024
// tokens, float32, 6 heads of 64, Zen 4) and from 11.6 to 10.6 ms (8 x 256 tokens, bfloat16); 32 or
// 128 query rows, 1024 forward keys, 256 or 1024 backward rows and 32 or 128 backward keys were no
// better. A tile stays within 128 KiB of float32.
constexpr int64_t kFwdBlockQ = 64;
constexpr int64_t kFwdBlockK = 512;
constexpr int64_t kBwdBlockQ = 512;
constexpr int64_t kBwdBlockK = 64;

template <typename C>
constexpr C kNegInf = -std::numeric_limits<C>::infinity();

// C = alpha op(A) op(B) + beta C on a tile: A and B hold the storage type S (C itself, or bfloat16
// multiplied by blas::hgemm with float32 accumulation into C).
template <typename C, typename S>
void gemm(blas::Trans ta, blas::Trans tb, int64_t m, int64_t n, int64_t k, C alpha, const S* a, int64_t lda, const S* b,
          int64_t ldb, C beta, C* c, int64_t ldc) {
  if constexpr (std::is_same_v<S, BFloat16>)
    blas::hgemm(blas::HalfType::BFloat16, /*cFloat32=*/true, ta, tb, m, n, k, alpha,
                reinterpret_cast<const uint16_t*>(a), lda, reinterpret_cast<const uint16_t*>(b), ldb, beta, c, ldc);
  else if constexpr (std::is_same_v<C, float>) blas::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else blas::dgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// A tile as the storage type S: the C tile itself, or its copy rounded to S (storeRows).
template <typename C, typename S>
const S* tileAs(const C* c, const S* rounded) {
  if constexpr (std::is_same_v<S, C>) {
    (void)rounded;
    return c;
  } else {
    (void)c;
    return rounded;
  }
}

template <typename C>
inline C expC(C x) {
  if constexpr (std::is_same_v<C, float>) return vecmath::exp(x);
  else return std::exp(x);
}

// A row of n values of C stored as S (rounded once when S is narrower).
template <typename C, typename S>
void storeRow(const C* src, S* dst, int64_t n) {
  if constexpr (std::is_same_v<S, C>) std::copy(src, src + n, dst);
  else simd::roundToBFloat16(src, dst, n);
}

// The first `cols` values of `rows` rows of src (row stride lds) stored as S in dst (row stride ldd);
// one call when the rows are back to back in both.
template <typename C, typename S>
void storeRows(const C* src, int64_t lds, S* dst, int64_t ldd, int64_t rows, int64_t cols) {
  if (cols == lds && cols == ldd) return storeRow(src, dst, rows * cols);
  for (int64_t i = 0; i < rows; ++i) storeRow(src + i * lds, dst + i * ldd, cols);
}

// Eight floats in one AVX register (GCC/Clang vector extension; plain code on other targets). No
// function takes or returns one, so no ABI depends on the target's vector width.
using Vec8 = float __attribute__((vector_size(32)));
#define COHORT_LOAD8(v, p) std::memcpy(&(v), (p), sizeof(Vec8))

// sum_j a[j] * b[j] in C, over eight lanes for float (a serial sum would be one dependent add per
// element).
template <typename C, typename S>
C dotRow(const S* a, const S* b, int64_t n) {
  C total = 0;
  int64_t j = 0;
  if constexpr (std::is_same_v<C, float>) {
    Vec8 acc = Vec8{}, va, vb;
    for (; j + 8 <= n; j += 8) {
      float fa[8], fb[8];
      for (int l = 0; l < 8; ++l) fa[l] = static_cast<float>(a[j + l]), fb[l] = static_cast<float>(b[j + l]);
      COHORT_LOAD8(va, fa);
      COHORT_LOAD8(vb, fb);
      acc += va * vb;
    }
    for (int l = 0; l < 8; ++l) total += acc[l];
  }
  for (; j < n; ++j) total += static_cast<C>(a[j]) * static_cast<C>(b[j]);
  return total;
}

// ---- operands ---------------------------------------------------------------------------------------

// Element offsets of each batch entry of `t` (whose leading `batchDims` dims are the batch).
std::vector<int64_t> batchOffsets(const Tensor& t, size_t batchDims, int64_t nb) {
  std::vector<int64_t> off(static_cast<size_t>(nb));
  std::vector<int64_t> idx(batchDims, 0);
  int64_t cur = 0;
  for (int64_t b = 0; b < nb; ++b) {
    off[static_cast<size_t>(b)] = cur;
    for (size_t d = batchDims; d-- > 0;) {
      cur += t.stride(static_cast<int64_t>(d));
      if (++idx[d] < t.size(static_cast<int64_t>(d))) break;
      cur -= t.stride(static_cast<int64_t>(d)) * t.size(static_cast<int64_t>(d));
      idx[d] = 0;
    }
  }
  return off;
}

// A [batch..., rows, cols] tensor used in place: contiguous columns, row stride ld, batch entry b
// at base + off[b]. T is const for the operands, which are read, and not for the output.
template <typename T>
struct Rows {
  Tensor hold;
  T* base = nullptr;
  std::vector<int64_t> off;
  int64_t ld = 1;
  T* at(int64_t b) const { return base + off[static_cast<size_t>(b)]; }
};

// t (already of T's dtype, columns contiguous and rows apart) broadcast to [batch..., rows, cols].
template <typename T>
Rows<T> rowsOf(const Tensor& t, const SdpaDims& d, int64_t rows, int64_t cols) {
  Shape full = d.batch;
  full.push_back(rows);
  full.push_back(cols);
  Rows<T> r;
  r.hold = t.expand(full);
  r.base = r.hold.numel() > 0 ? r.hold.template data<std::remove_const_t<T>>() : nullptr;
  r.off = batchOffsets(r.hold, d.batch.size(), d.nb);
  r.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : r.hold.stride(-2);
  return r;
}

// An operand read in place when its layout allows, else from a contiguous copy (and from a copy
// converted to C when its dtype is not C).
template <typename C>
Rows<const C> makeOperand(const Tensor& t, const SdpaDims& d, int64_t rows, int64_t cols) {
  Tensor x = t.to(DTypeOf<C>::value);
  const bool usable = (cols <= 1 || x.stride(-1) == 1) && (rows <= 1 || x.stride(-2) >= std::max<int64_t>(cols, 1));
  return rowsOf<const C>(usable ? x : x.contiguous(), d, rows, cols);
}

// The mask, broadcast to [batch..., Tq, Tk] by strides (never materialised at that shape).
template <typename C>
struct MaskView {
  bool on = false;
  Tensor hold;
  const bool* bits = nullptr;  // bool masks
  const C* add = nullptr;      // floating masks, in C
  std::vector<int64_t> off;
  int64_t sq = 0, sk = 0;
};

template <typename C>
MaskView<C> makeMask(const Tensor& mask, const SdpaDims& d) {
  MaskView<C> mv;
  if (!mask.defined()) return mv;
  mv.on = true;
  Tensor m = mask.dtype() == DType::Bool ? mask.contiguous() : mask.to(DTypeOf<C>::value).contiguous();
  Shape full = d.batch;
  full.push_back(d.tq);
  full.push_back(d.tk);
  mv.hold = m.expand(full);
  if (mv.hold.numel() > 0) {
    if (m.dtype() == DType::Bool) mv.bits = mv.hold.template data<bool>();
    else mv.add = mv.hold.template data<C>();
  }
  mv.off = batchOffsets(mv.hold, d.batch.size(), d.nb);
  mv.sq = mv.hold.stride(-2);
  mv.sk = mv.hold.stride(-1);
  return mv;
}

// C: the type scores, softmax and gradients are computed in (float or double). S: the type q, k, v
// and the output gradient are multiplied in (C, or bfloat16 where blas::hgemm runs natively).
template <typename C, typename S = C>
struct Problem {
  SdpaDims d;
  C scale = 1;
  bool causal = false;
  Rows<const S> q, k, v;
  Rows<const S> go, out;  // backward only: the output's gradient and the output
  MaskView<C> mask;
  SdpaDropout drop;
};

// ---- tile helpers -------------------------------------------------------------------------------------

// Adds the mask to the score tile s [rows, cols] (row stride lds) whose top-left element is (query
// q0, key k0) of batch entry b. The causal mask is not applied here: keptCols gives each row's
// length, and the weights past it are set to zero without computing them.
template <typename C, typename S>
void maskTile(const Problem<C, S>& P, C* s, int64_t lds, int64_t b, int64_t q0, int64_t rows, int64_t k0,
              int64_t cols) {
  const MaskView<C>& mv = P.mask;
  if (mv.on) {
    const int64_t base = mv.off[static_cast<size_t>(b)] + q0 * mv.sq + k0 * mv.sk;
    for (int64_t i = 0; i < rows; ++i) {
      C* r = s + i * lds;
      if (mv.bits) {
        const bool* m = mv.bits + base + i * mv.sq;
        if (mv.sk == 1) {
          for (int64_t j = 0; j < cols; ++j) r[j] = m[j] ? r[j] : kNegInf<C>;
        } else {
          for (int64_t j = 0; j < cols; ++j) r[j] = m[j * mv.sk] ? r[j] : kNegInf<C>;
        }
      } else {
        const C* m = mv.add + base + i * mv.sq;
        if (mv.sk == 1) {
          for (int64_t j = 0; j < cols; ++j) r[j] += m[j];
        } else {
          for (int64_t j = 0; j < cols; ++j) r[j] += m[j * mv.sk];
        }
      }
    }
  }
}

// The tile whose first row is query q0 and first column key k0 keeps clamp(diag + i, 0, cols)
// columns of its row i (expRows): all without a causal mask, else those up to the diagonal
// (aligned at the top left: row q sees keys 0..q).
template <typename C, typename S>
int64_t tileDiag(const Problem<C, S>& P, int64_t q0, int64_t k0, int64_t cols) {
  return P.causal ? q0 + 1 - k0 : cols;
}

// How many of the key columns k0, k0 + 1, ... k0 + cols - 1 query row q sees.
template <typename C, typename S>
int64_t keptCols(const Problem<C, S>& P, int64_t q, int64_t k0, int64_t cols) {
  return std::clamp<int64_t>(tileDiag(P, q, k0, cols), 0, cols);
}

// Maximum of x[0, n); NaN is skipped (it reaches the output through exp anyway).
template <typename C>
C rowMax(const C* x, int64_t n) {
  int64_t j = 0;
  C mx = kNegInf<C>;
  if constexpr (std::is_same_v<C, float>) {
    Vec8 m0 = Vec8{} + kNegInf<float>, m1 = m0, a, b;
    for (; j + 16 <= n; j += 16) {
      COHORT_LOAD8(a, x + j);
      COHORT_LOAD8(b, x + j + 8);
      m0 = a > m0 ? a : m0;
      m1 = b > m1 ? b : m1;
    }
    m0 = m1 > m0 ? m1 : m0;
    for (int l = 0; l < 8; ++l) mx = m0[l] > mx ? m0[l] : mx;
  }
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

// For each row i < rows of x (row stride ld): x[i][j] = exp(x[i][j] - shift[i]) for j < kept(i) and 0
// for kept(i) <= j < cols, with kept(i) = clamp(diag + i, 0, cols) (tileDiag).
template <typename C>
void expRows(C* x, int64_t rows, int64_t cols, int64_t ld, const C* shift, int64_t diag) {
  if constexpr (std::is_same_v<C, float>)  // 16 lanes where the CPU has AVX-512, the same bits
    if (simd::expShiftedRows(x, rows, cols, ld, shift, diag)) return;
  for (int64_t i = 0; i < rows; ++i) {
    C* r = x + i * ld;
    const int64_t kept = std::clamp<int64_t>(diag + i, 0, cols);
    for (int64_t j = 0; j < kept; ++j) r[j] = expC<C>(r[j] - shift[i]);
    std::fill(r + kept, r + cols, C(0));
  }
}

// The sum of x[0, n).
template <typename C>
C rowSum(const C* x, int64_t n) {
  int64_t j = 0;
  C total = 0;
  if constexpr (std::is_same_v<C, float>) {
    Vec8 s0 = Vec8{}, s1 = s0, a, b;
    for (; j + 16 <= n; j += 16) {
      COHORT_LOAD8(a, x + j);
      COHORT_LOAD8(b, x + j + 8);
      s0 += a;
      s1 += b;
    }
    s0 += s1;
    for (int l = 0; l < 8; ++l) total += s0[l];
  }
  for (; j < n; ++j) total += x[j];
  return total;
}

#undef COHORT_LOAD8

// dst[j] = src[j] * (kept ? scale : 0) for the row with hash rk, key columns k0 + j.
template <typename C>
void dropRow(C* dst, const C* src, int64_t n, uint64_t rk, int64_t k0, uint32_t threshold, C scale) {
  for (int64_t j = 0; j < n; ++j) dst[j] = SdpaDropout::keep(rk, k0 + j, threshold) ? src[j] * scale : C(0);
}

// ---- forward --------------------------------------------------------------------------------------------

template <typename C, typename S>
struct FwdScratch {
  Tensor hold, holdS;
  C *s, *acc, *m, *l;
  C *mNew, *shift;  // per row in the current key block: the running maximum with it, and the exp shift
  S* ps = nullptr;  // the weights tile as S, when S is not C
  explicit FwdScratch(int64_t ev) {
    const int64_t n = kFwdBlockQ * kFwdBlockK + kFwdBlockQ * std::max<int64_t>(ev, 1) + 4 * kFwdBlockQ;
    hold = empty({n}, {.dtype = DTypeOf<C>::value});
    s = hold.template data<C>();
    acc = s + kFwdBlockQ * kFwdBlockK;
    m = acc + kFwdBlockQ * std::max<int64_t>(ev, 1);
    l = m + kFwdBlockQ;
    mNew = l + kFwdBlockQ;
    shift = mNew + kFwdBlockQ;
    if constexpr (!std::is_same_v<S, C>) {
      holdS = empty({kFwdBlockQ * kFwdBlockK}, {.dtype = DTypeOf<S>::value});
      ps = holdS.template data<S>();
    }
  }
};

// One block of query rows [q0, q0 + kFwdBlockQ) of batch entry b: out rows and their log-sum-exp.
template <typename C, typename S>
void forwardBlock(const Problem<C, S>& P, FwdScratch<C, S>& w, int64_t b, int64_t q0, const Rows<S>& out, C* lse) {
  const SdpaDims& d = P.d;
  const int64_t rows = std::min(kFwdBlockQ, d.tq - q0);
  const int64_t lds = kFwdBlockK;
  const S* Q = P.q.at(b) + q0 * P.q.ld;
  const int64_t kEnd = P.causal ? std::min(d.tk, q0 + rows) : d.tk;
  std::fill(w.m, w.m + rows, kNegInf<C>);
  std::fill(w.l, w.l + rows, C(0));
  const C dropScale = static_cast<C>(P.drop.scale);
  for (int64_t k0 = 0; k0 < kEnd; k0 += kFwdBlockK) {
    const int64_t cols = std::min(kFwdBlockK, kEnd - k0);
    gemm<C, S>(blas::Trans::No, blas::Trans::Yes, rows, cols, d.e, P.scale, Q, P.q.ld, P.k.at(b) + k0 * P.k.ld, P.k.ld,
               C(0), w.s, lds);
    maskTile(P, w.s, lds, b, q0, rows, k0, cols);
    const bool first = k0 == 0;
    for (int64_t i = 0; i < rows; ++i) {
      w.mNew[i] = std::max(w.m[i], rowMax(w.s + i * lds, keptCols(P, q0 + i, k0, cols)));
      w.shift[i] = w.mNew[i] == kNegInf<C> ? C(0) : w.mNew[i];  // a row masked so far stays at 0 weight
    }
    expRows(w.s, rows, cols, lds, w.shift, tileDiag(P, q0, k0, cols));
    for (int64_t i = 0; i < rows; ++i) {
      C* r = w.s + i * lds;
      const C corr = first ? C(0) : expC<C>(w.m[i] - w.shift[i]);  // the first block has nothing to rescale
      w.l[i] = w.l[i] * corr + rowSum(r, keptCols(P, q0 + i, k0, cols));
      w.m[i] = w.mNew[i];
      if (!first && corr != C(1)) {
        C* a = w.acc + i * d.ev;
        for (int64_t e = 0; e < d.ev; ++e) a[e] *= corr;
      }
      if (P.drop.on) dropRow(r, r, cols, P.drop.row(b, q0 + i), k0, P.drop.threshold, dropScale);
    }
    if constexpr (!std::is_same_v<S, C>) storeRows(w.s, lds, w.ps, lds, rows, cols);
    gemm<C, S>(blas::Trans::No, blas::Trans::No, rows, d.ev, cols, C(1), tileAs(w.s, w.ps), lds,
               P.v.at(b) + k0 * P.v.ld, P.v.ld, first ? C(0) : C(1), w.acc, std::max<int64_t>(d.ev, 1));
  }
  for (int64_t i = 0; i < rows; ++i) {
    C* a = w.acc + i * d.ev;
    C& ls = lse[b * d.tq + q0 + i];
    if (kEnd == 0) {  // no keys at all: an empty sum, as PyTorch's matmul of empty weights
      std::fill(a, a + d.ev, C(0));
      ls = kNegInf<C>;
    } else if (w.l[i] == C(0)) {  // every key masked out: NaN, as PyTorch's softmax of all -inf
      std::fill(a, a + d.ev, std::numeric_limits<C>::quiet_NaN());
      ls = kNegInf<C>;
    } else {
      const C inv = C(1) / w.l[i];
      for (int64_t e = 0; e < d.ev; ++e) a[e] *= inv;
      ls = w.m[i] + std::log(w.l[i]);
    }
    storeRow(a, out.at(b) + (q0 + i) * out.ld, d.ev);
  }
}

template <typename C, typename S>
void runForward(const Problem<C, S>& P, const Rows<S>& out, C* lse) {
  const SdpaDims& d = P.d;
  const int64_t blocks = (d.tq + kFwdBlockQ - 1) / kFwdBlockQ;
  parallelFor(d.nb * blocks, 1, [&](int64_t lo, int64_t hi) {
    FwdScratch<C, S> w(d.ev);
    for (int64_t item = lo; item < hi; ++item)
      forwardBlock(P, w, item / blocks, (item % blocks) * kFwdBlockQ, out, lse);
  });
}

// ---- backward -------------------------------------------------------------------------------------------

template <typename C, typename S>
struct BwdScratch {
  Tensor hold, holdS;
  C *s, *pd, *dp, *dsum;
  C *dq, *dk, *dv;                  // one batch entry's gradients, accumulated in C
  S *ps = nullptr, *dss = nullptr;  // the weights and score-gradient tiles as S, when S is not C
  explicit BwdScratch(const SdpaDims& d) {
    const int64_t tile = kBwdBlockQ * kBwdBlockK;
    const int64_t grads = d.tq * d.e + d.tk * (d.e + d.ev);
    hold = empty({3 * tile + std::max<int64_t>(d.tq, 1) + grads}, {.dtype = DTypeOf<C>::value});
    s = hold.template data<C>();
    pd = s + tile;
    dp = pd + tile;
    dsum = dp + tile;
    dq = dsum + std::max<int64_t>(d.tq, 1);
    dk = dq + d.tq * d.e;
    dv = dk + d.tk * d.e;
    if constexpr (!std::is_same_v<S, C>) {
      holdS = empty({2 * tile}, {.dtype = DTypeOf<S>::value});
      ps = holdS.template data<S>();
      dss = ps + tile;
    }
  }
};

// Gradients of batch entry b into the rows of dqOut [Tq, E], dkOut [Tk, E], dvOut [Tk, Ev], from the
// output gradient P.go and the output P.out (read in place) and lse [Tq]. They are summed in the
// scratch's C buffers and stored once.
template <typename C, typename S>
void backwardEntry(const Problem<C, S>& P, BwdScratch<C, S>& w, int64_t b, const C* lse, const Rows<S>& dqOut,
                   const Rows<S>& dkOut, const Rows<S>& dvOut) {
  const SdpaDims& d = P.d;
  const int64_t lds = kBwdBlockK;
  const int64_t lde = std::max<int64_t>(d.e, 1);
  C *dq = w.dq, *dk = w.dk, *dv = w.dv;
  std::fill(dq, dq + d.tq * d.e, C(0));
  std::fill(dk, dk + d.tk * d.e, C(0));
  std::fill(dv, dv + d.tk * d.ev, C(0));
  const S* go = P.go.at(b);
  const int64_t ldo = P.go.ld;
  for (int64_t i = 0; i < d.tq; ++i) w.dsum[i] = dotRow<C>(go + i * ldo, P.out.at(b) + i * P.out.ld, d.ev);
  const S* Qb = P.q.at(b);
  const C dropScale = static_cast<C>(P.drop.scale);
  for (int64_t k0 = 0; k0 < d.tk; k0 += kBwdBlockK) {
    const int64_t cols = std::min(kBwdBlockK, d.tk - k0);
    const S* K = P.k.at(b) + k0 * P.k.ld;
    const S* V = P.v.at(b) + k0 * P.v.ld;
    C* dK = dk + k0 * d.e;
    C* dV = dv + k0 * d.ev;
    // Rows above the first key of this block see none of it under a causal mask.
    const int64_t qStart = P.causal ? std::min(k0, d.tq) : 0;
    for (int64_t q0 = qStart; q0 < d.tq; q0 += kBwdBlockQ) {
      const int64_t rows = std::min(kBwdBlockQ, d.tq - q0);
      const S* Q = Qb + q0 * P.q.ld;
      const S* dO = go + q0 * ldo;
      gemm<C, S>(blas::Trans::No, blas::Trans::Yes, rows, cols, d.e, P.scale, Q, P.q.ld, K, P.k.ld, C(0), w.s, lds);
      maskTile(P, w.s, lds, b, q0, rows, k0, cols);
      expRows(w.s, rows, cols, lds, lse + q0, tileDiag(P, q0, k0, cols));  // P (NaN for a fully masked row)
      if (P.drop.on)
        for (int64_t i = 0; i < rows; ++i)
          dropRow(w.pd + i * lds, w.s + i * lds, cols, P.drop.row(b, q0 + i), k0, P.drop.threshold, dropScale);
      if constexpr (!std::is_same_v<S, C>) storeRows(P.drop.on ? w.pd : w.s, lds, w.ps, lds, rows, cols);
      const S* pd = tileAs(P.drop.on ? w.pd : w.s, w.ps);
      gemm<C, S>(blas::Trans::Yes, blas::Trans::No, cols, d.ev, rows, C(1), pd, lds, dO, ldo, C(1), dV,
                 std::max<int64_t>(d.ev, 1));
      gemm<C, S>(blas::Trans::No, blas::Trans::Yes, rows, cols, d.ev, C(1), dO, ldo, V, P.v.ld, C(0), w.dp, lds);
      for (int64_t i = 0; i < rows; ++i) {
        const C* p = w.s + i * lds;
        C* g = w.dp + i * lds;
        const C di = w.dsum[q0 + i];
        if (P.drop.on) {
          // dP of the dropped weights is zero; the kept ones carry the 1/(1-p) scale.
          const uint64_t rk = P.drop.row(b, q0 + i);
          for (int64_t j = 0; j < cols; ++j) {
            const C z = SdpaDropout::keep(rk, k0 + j, P.drop.threshold) ? dropScale : C(0);
            g[j] = p[j] * (g[j] * z - di);
          }
        } else {
          for (int64_t j = 0; j < cols; ++j) g[j] = p[j] * (g[j] - di);
        }
      }
      if constexpr (!std::is_same_v<S, C>) storeRows(w.dp, lds, w.dss, lds, rows, cols);
      const S* ds = tileAs(w.dp, w.dss);
      gemm<C, S>(blas::Trans::No, blas::Trans::No, rows, d.e, cols, P.scale, ds, lds, K, P.k.ld, C(1), dq + q0 * d.e,
                 lde);
      gemm<C, S>(blas::Trans::Yes, blas::Trans::No, cols, d.e, rows, P.scale, ds, lds, Q, P.q.ld, C(1), dK, lde);
    }
  }
  storeRows(dq, d.e, dqOut.at(b), dqOut.ld, d.tq, d.e);
  storeRows(dk, d.e, dkOut.at(b), dkOut.ld, d.tk, d.e);
  storeRows(dv, d.ev, dvOut.at(b), dvOut.ld, d.tk, d.ev);
}

template <typename C, typename S>
void runBackward(const Problem<C, S>& P, const C* lse, const Rows<S>& dq, const Rows<S>& dk, const Rows<S>& dv) {
  const SdpaDims& d = P.d;
  parallelFor(d.nb, 1, [&](int64_t lo, int64_t hi) {
    BwdScratch<C, S> w(d);
    for (int64_t b = lo; b < hi; ++b) backwardEntry(P, w, b, lse + b * d.tq, dq, dk, dv);
  });
}

template <typename C, typename S>
Problem<C, S> makeProblem(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a) {
  const SdpaDims& d = a.d;
  Problem<C, S> P;
  P.d = d;
  P.scale = static_cast<C>(a.scale);
  P.causal = a.causal;
  P.q = makeOperand<S>(q, d, d.tq, d.e);
  P.k = makeOperand<S>(k, d, d.tk, d.e);
  P.v = makeOperand<S>(v, d, d.tk, d.ev);
  P.mask = makeMask<C>(a.mask, d);
  P.drop = a.drop;
  return P;
}

// bfloat16 inputs are multiplied in bfloat16 where blas::hgemm runs it natively.
bool bf16Products(DType dt) { return dt == DType::BFloat16 && blas::hgemmNative(blas::HalfType::BFloat16); }

template <typename C, typename S>
void forwardAs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, Tensor& out, Tensor& lse) {
  runForward(makeProblem<C, S>(q, k, v, a), rowsOf<S>(out, a.d, a.d.tq, a.d.ev), lse.data<C>());
}

template <typename C, typename S>
void backwardAs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, const Tensor& out,
                const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  Problem<C, S> P = makeProblem<C, S>(q, k, v, a);
  P.go = makeOperand<S>(dout, a.d, a.d.tq, a.d.ev);
  P.out = makeOperand<S>(out, a.d, a.d.tq, a.d.ev);
  runBackward(P, lse.data<C>(), rowsOf<S>(dq, a.d, a.d.tq, a.d.e), rowsOf<S>(dk, a.d, a.d.tk, a.d.e),
              rowsOf<S>(dv, a.d, a.d.tk, a.d.ev));
}

// A new [batch..., rows, cols] result. With two batch dims, [B, H] (heads), and sideBySide, it is laid
// out [B, rows, H, cols] and returned as that permuted: putting the heads side by side again
// (x.transpose(1, 2) and a view to [B, rows, H * cols], what a multi-head layer does next with the
// output) is then free, not a copy. Otherwise it is contiguous.
Tensor newResult(const SdpaDims& d, int64_t rows, int64_t cols, DType dt, bool sideBySide) {
  if (d.batch.size() != 2 || !sideBySide) return empty(sdpaShape(d.batch, rows, cols), {.dtype = dt});
  return empty({d.batch[0], rows, d.batch[1], cols}, {.dtype = dt}).permute({0, 2, 1, 3});
}

// Whether the [B, H, T, E] input t holds its heads side by side in memory (head stride E, as the
// transposed head views of a multi-head layer's projection do): its gradient is then laid out the
// same way, so the backward of those views copies nothing; a contiguous input gets a contiguous one.
bool headsSideBySide(const Tensor& t) {
  return t.dim() == 4 && t.size(1) > 1 && t.stride(1) == t.size(3) && t.stride(3) == 1;
}

}  // namespace

void sdpaCpuForward(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, Tensor& out, Tensor& lse) {
  const SdpaDims& d = a.d;
  const DType ct = q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const bool bf16 = bf16Products(q.dtype());
  Tensor o = newResult(d, d.tq, d.ev, bf16 ? DType::BFloat16 : ct, /*sideBySide=*/true);
  Shape lseShape = d.batch;
  lseShape.push_back(d.tq);
  lse = empty(lseShape, {.dtype = ct});
  autograd::NoGradGuard ng;
  if (o.numel() > 0 || lse.numel() > 0) {
    if (bf16) forwardAs<float, BFloat16>(q, k, v, a, o, lse);
    else if (ct == DType::Float32) forwardAs<float, float>(q, k, v, a, o, lse);
    else forwardAs<double, double>(q, k, v, a, o, lse);
  }
  out = o.to(q.dtype());
}

void sdpaCpuBackward(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaCpuArgs& a, const Tensor& out,
                     const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const SdpaDims& d = a.d;
  const DType ct = q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const bool bf16 = bf16Products(q.dtype());
  const DType st = bf16 ? DType::BFloat16 : ct;
  Tensor gq = newResult(d, d.tq, d.e, st, headsSideBySide(q));
  Tensor gk = newResult(d, d.tk, d.e, st, headsSideBySide(k));
  Tensor gv = newResult(d, d.tk, d.ev, st, headsSideBySide(v));
  autograd::NoGradGuard ng;
  if (dout.numel() > 0 && d.tk > 0) {
    if (bf16) backwardAs<float, BFloat16>(q, k, v, a, out, lse, dout, gq, gk, gv);
    else if (ct == DType::Float32) backwardAs<float, float>(q, k, v, a, out, lse, dout, gq, gk, gv);
    else backwardAs<double, double>(q, k, v, a, out, lse, dout, gq, gk, gv);
  } else {
    gq.zero_();
    gk.zero_();
    gv.zero_();
  }
  dq = gq.to(q.dtype());
  dk = gk.to(q.dtype());
  dv = gv.to(q.dtype());
}

}  // namespace cohort::detail
