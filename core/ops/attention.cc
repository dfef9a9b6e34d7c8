// Scaled-dot-product attention, fused on the CPU in the manner of FlashAttention (Dao et al.):
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
// batch entry (one per work item) it walks key blocks and, inside, query blocks, adding
// dV += P^T dO, dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O), dQ += dS K * scale and
// dK += dS^T Q * scale (five GEMMs per tile; causal tiles above the diagonal are skipped). Memory
// is linear in the sequence lengths: q, k, v, the output, one log-sum-exp per query row, and tiles
// of fixed size per thread.
//
// DropoutKeys: one 64-bit key is drawn from the Generator per call; whether weight (b, i, j) is kept
// is a hash of (key, b, i, j) (splitmix64 per row, a 32-bit finaliser per column), so forward and
// backward regenerate the same mask without storing it, and the same generator state gives the
// same result. scaledDotProductAttentionDropoutMask gives the mask itself.
//
// The GEMMs are cohort::blas on tiles (inputs are read in place when their last dim is
// contiguous: the transposed head views of a fused qkv projection need no copy). float32 and
// float64 compute natively. bfloat16 inputs, where blas::hgemm runs natively (oneDNN), are multiplied
// in bfloat16 with float32 accumulation: q, k, v and the output gradient are read in place, and the
// weights P and score gradients dS are rounded to bfloat16 before the products that take them (as
// FlashAttention kernels do), while scores, the softmax, the log-sum-exp and the gradients dq, dk,
// dv are float32. float16 (and bfloat16 where hgemm widens) is converted to float32 and computed
// there. The result is rounded back to the input's type.
// Other devices run their registered fused kernels (on CUDA: core/cuda/attention.cu, 16-bit inputs
// without mask or dropout) or else the unfused formula with the same mask and dropout (scaledDotProductAttentionMath).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <cohort/core/amp/autocast.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/ops/detail/attention.h>
#include <cohort/core/ops/detail/vec_math.h>
#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/generator.h>
#include <cohort/core/util/parallel.h>

namespace cohort::nn::functional {

using autograd::Ctx;
using GradList = std::vector<Tensor>;

namespace {

constexpr const char* kOp = "scaledDotProductAttention";
// Tile sizes (query rows x keys). Large enough that the tile GEMMs run near BLAS speed, small
// enough that a tile and its operands stay in L2 and the causal diagonal wastes little; on
// bench/attention (E = 64) 64..128 rows by 64..256 keys all ran within 5% of each other.
constexpr int64_t kFwdBlockQ = 64;
constexpr int64_t kFwdBlockK = 128;
constexpr int64_t kBwdBlockQ = 64;
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

// The tile src [rows, cols] (row stride ld) as the storage type S: src itself when S is C, else
// rounded row by row into buf (same stride), which is returned.
template <typename C, typename S>
const S* asStorage(const C* src, S* buf, int64_t rows, int64_t cols, int64_t ld) {
  if constexpr (std::is_same_v<S, C>) {
    (void)buf, (void)rows, (void)cols, (void)ld;
    return src;
  } else {
    for (int64_t i = 0; i < rows; ++i) floatToBFloat16N(src + i * ld, buf + i * ld, cols);
    return buf;
  }
}

template <typename C>
inline C expC(C x) {
  if constexpr (std::is_same_v<C, float>) return vecmath::exp(x);
  else return std::exp(x);
}

// ---- argument checks ----------------------------------------------------------------------------

struct Dims {
  Shape batch;  // broadcast batch dims of q, k, v
  int64_t nb = 1, tq = 0, tk = 0, e = 0, ev = 0;
};

std::optional<Shape> broadcastOpt(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void requireInput(const Tensor& t, const char* what) {
  if (!t.defined()) throw ValueError(fmt::format("{}: {} is undefined", kOp, what));
  if (!isFloating(t.dtype()))
    throw ValueError(fmt::format("{}: {} must be a floating-point tensor, got {} of shape {}", kOp, what, t.dtype(),
                                 shapeStr(t.sizes())));
  if (t.dim() < 2)
    throw ValueError(fmt::format("{}: {} must have at least 2 dims [..., {}, {}], got shape {}", kOp, what,
                                 what[0] == 'q' ? "Tq" : "Tk", what[0] == 'v' ? "Ev" : "E", shapeStr(t.sizes())));
}

Dims checkArgs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  requireInput(q, "query");
  requireInput(k, "key");
  requireInput(v, "value");
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw ValueError(fmt::format("{}: query, key and value must have one dtype, got {}, {} and {}", kOp, q.dtype(),
                                 k.dtype(), v.dtype()));
  if (q.device() != k.device() || q.device() != v.device())
    throw ValueError(fmt::format("{}: query, key and value must be on one device, got {}, {} and {}", kOp, q.device(),
                                 k.device(), v.device()));
  if (k.size(-1) != q.size(-1))
    throw ValueError(fmt::format("{}: key's last dim ({}) must equal query's ({}); query {}, key {}", kOp, k.size(-1),
                                 q.size(-1), shapeStr(q.sizes()), shapeStr(k.sizes())));
  if (v.size(-2) != k.size(-2))
    throw ValueError(fmt::format("{}: value's sequence length ({}) must equal key's ({}); key {}, value {}", kOp,
                                 v.size(-2), k.size(-2), shapeStr(k.sizes()), shapeStr(v.sizes())));
  auto batchOf = [](const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); };
  std::optional<Shape> batch = broadcastOpt(batchOf(q), batchOf(k));
  if (batch) batch = broadcastOpt(*batch, batchOf(v));
  if (!batch)
    throw ValueError(fmt::format("{}: the batch dims of query {}, key {} and value {} cannot be broadcast together",
                                 kOp, shapeStr(q.sizes()), shapeStr(k.sizes()), shapeStr(v.sizes())));
  if (!(opts.dropout >= 0.0 && opts.dropout < 1.0))
    throw ValueError(fmt::format("{}: dropout must be in [0, 1), got {}", kOp, opts.dropout));
  if (opts.scale && !std::isfinite(*opts.scale))
    throw ValueError(fmt::format("{}: scale must be finite, got {}", kOp, *opts.scale));
  Dims d;
  d.batch = *batch;
  d.nb = shapeNumel(d.batch);
  d.tq = q.size(-2);
  d.tk = k.size(-2);
  d.e = q.size(-1);
  d.ev = v.size(-1);
  if (const Tensor& m = opts.mask; m.defined()) {
    if (opts.causal)
      throw ValueError(fmt::format("{}: mask and causal cannot both be given (causal is a mask of its own); mask {}",
                                   kOp, shapeStr(m.sizes())));
    if (m.dtype() != DType::Bool && !isFloating(m.dtype()))
      throw ValueError(
          fmt::format("{}: mask must be bool (true = attend) or floating-point (added), got {} of shape {}", kOp,
                      m.dtype(), shapeStr(m.sizes())));
    if (m.device() != q.device())
      throw ValueError(fmt::format("{}: mask is on {} but query is on {}", kOp, m.device(), q.device()));
    Shape target = d.batch;
    target.push_back(d.tq);
    target.push_back(d.tk);
    std::optional<Shape> b = broadcastOpt(m.sizes(), target);
    if (!b || *b != target)
      throw ValueError(fmt::format("{}: mask of shape {} cannot be broadcast to the attention shape {}", kOp,
                                   shapeStr(m.sizes()), shapeStr(target)));
  }
  return d;
}

// ---- dropout keep mask ----------------------------------------------------------------------------

uint64_t drawDropoutKey(Generator* gen) {
  Generator& g = gen ? *gen : defaultGenerator();
  const uint64_t c = g.reserve(1);
  const auto w = Generator::philox(g.seed(), c);
  return static_cast<uint64_t>(w[0]) << 32 | w[1];
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct DropoutKeys {
  bool on = false;
  uint64_t key = 0;
  uint32_t threshold = 0;  // keep when the hash's top 24 bits are below this
  double scale = 1.0;      // 1 / (1 - p)
  int64_t tq = 0;

  DropoutKeys() = default;
  DropoutKeys(double p, uint64_t k, int64_t rows) : on(p > 0.0), key(k), tq(rows) {
    threshold = static_cast<uint32_t>(std::ceil((1.0 - p) * 16777216.0));
    scale = 1.0 / (1.0 - p);
  }
  // The per-row part of the hash for batch entry b, query row i.
  uint64_t row(int64_t b, int64_t i) const {
    return splitmix64(key + static_cast<uint64_t>(b * tq + i) * 0xD1B54A32D192ED03ull);
  }
  // Whether key column j of the row with hash rk is kept. Vectorizes over j.
  static bool keep(uint64_t rk, int64_t j, uint32_t threshold) {
    uint32_t x = static_cast<uint32_t>(rk) + static_cast<uint32_t>(j) * 0x9E3779B9u;
    x ^= static_cast<uint32_t>(rk >> 32);
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return (x >> 8) < threshold;
  }
};

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

// A [batch..., rows, cols] operand read in place: contiguous columns, row stride ld.
template <typename C>
struct Operand {
  Tensor hold;
  const C* base = nullptr;
  std::vector<int64_t> off;
  int64_t ld = 1;
  const C* at(int64_t b) const { return base + off[static_cast<size_t>(b)]; }
};

template <typename C>
Operand<C> makeOperand(const Tensor& t, const Dims& d, int64_t rows, int64_t cols) {
  Tensor x = t.to(DTypeOf<C>::value);
  const bool usable = (cols <= 1 || x.stride(-1) == 1) && (rows <= 1 || x.stride(-2) >= std::max<int64_t>(cols, 1));
  if (!usable) x = x.contiguous();
  Shape full = d.batch;
  full.push_back(rows);
  full.push_back(cols);
  Operand<C> op;
  op.hold = x.expand(full);
  op.base = op.hold.numel() > 0 ? op.hold.template data<C>() : nullptr;
  op.off = batchOffsets(op.hold, d.batch.size(), d.nb);
  op.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : op.hold.stride(-2);
  return op;
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
MaskView<C> makeMask(const Tensor& mask, const Dims& d) {
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
  Dims d;
  C scale = 1;
  bool causal = false;
  Operand<S> q, k, v;
  MaskView<C> mask;
  DropoutKeys drop;
};

// ---- tile helpers -------------------------------------------------------------------------------------

// Adds the mask and the causal triangle to the score tile s [rows, cols] (row stride lds) whose
// top-left element is (query q0, key k0) of batch entry b.
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
  if (P.causal && k0 + cols - 1 > q0) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t first = std::max<int64_t>(q0 + i + 1 - k0, 0);  // first key column after row q0+i
      C* r = s + i * lds;
      for (int64_t j = first; j < cols; ++j) r[j] = kNegInf<C>;
    }
  }
}

// Eight floats in one AVX register (GCC/Clang vector extension; plain code on other targets). No
// function takes or returns one, so no ABI depends on the target's vector width.
using Vec8 = float __attribute__((vector_size(32)));
#define COHORT_LOAD8(v, p) std::memcpy(&(v), (p), sizeof(Vec8))

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

// x[j] = exp(x[j] - shift) for j < n; returns the sum.
template <typename C>
C expRow(C* x, int64_t n, C shift) {
  for (int64_t j = 0; j < n; ++j) x[j] = expC<C>(x[j] - shift);
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
  for (int64_t j = 0; j < n; ++j) dst[j] = DropoutKeys::keep(rk, k0 + j, threshold) ? src[j] * scale : C(0);
}

// ---- forward --------------------------------------------------------------------------------------------

template <typename C, typename S>
struct FwdScratch {
  Tensor hold, holdS;
  C *s, *acc, *m, *l;
  S* ps = nullptr;  // the weights tile as S, when S is not C
  explicit FwdScratch(int64_t ev) {
    const int64_t n = kFwdBlockQ * kFwdBlockK + kFwdBlockQ * std::max<int64_t>(ev, 1) + 2 * kFwdBlockQ;
    hold = empty({n}, {.dtype = DTypeOf<C>::value});
    s = hold.template data<C>();
    acc = s + kFwdBlockQ * kFwdBlockK;
    m = acc + kFwdBlockQ * std::max<int64_t>(ev, 1);
    l = m + kFwdBlockQ;
    if constexpr (!std::is_same_v<S, C>) {
      holdS = empty({kFwdBlockQ * kFwdBlockK}, {.dtype = DTypeOf<S>::value});
      ps = holdS.template data<S>();
    }
  }
};

// One block of query rows [q0, q0 + kFwdBlockQ) of batch entry b: out rows and their log-sum-exp.
template <typename C, typename S>
void forwardBlock(const Problem<C, S>& P, FwdScratch<C, S>& w, int64_t b, int64_t q0, C* out, C* lse) {
  const Dims& d = P.d;
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
      C* r = w.s + i * lds;
      const C mNew = std::max(w.m[i], rowMax(r, cols));
      const C shift = mNew == kNegInf<C> ? C(0) : mNew;  // a row masked so far stays at 0 weight
      const C corr = expC<C>(w.m[i] - shift);
      const C sum = expRow(r, cols, shift);
      w.l[i] = w.l[i] * corr + sum;
      w.m[i] = mNew;
      if (!first && corr != C(1)) {
        C* a = w.acc + i * d.ev;
        for (int64_t e = 0; e < d.ev; ++e) a[e] *= corr;
      }
      if (P.drop.on) dropRow(r, r, cols, P.drop.row(b, q0 + i), k0, P.drop.threshold, dropScale);
    }
    gemm<C, S>(blas::Trans::No, blas::Trans::No, rows, d.ev, cols, C(1), asStorage(w.s, w.ps, rows, cols, lds), lds,
               P.v.at(b) + k0 * P.v.ld, P.v.ld, first ? C(0) : C(1), w.acc, std::max<int64_t>(d.ev, 1));
  }
  for (int64_t i = 0; i < rows; ++i) {
    C* o = out + ((b * d.tq) + q0 + i) * d.ev;
    C& ls = lse[b * d.tq + q0 + i];
    if (kEnd == 0) {  // no keys at all: an empty sum, as PyTorch's matmul of empty weights
      std::fill(o, o + d.ev, C(0));
      ls = kNegInf<C>;
    } else if (w.l[i] == C(0)) {  // every key masked out: NaN, as PyTorch's softmax of all -inf
      std::fill(o, o + d.ev, std::numeric_limits<C>::quiet_NaN());
      ls = kNegInf<C>;
    } else {
      const C inv = C(1) / w.l[i];
      const C* a = w.acc + i * d.ev;
      for (int64_t e = 0; e < d.ev; ++e) o[e] = a[e] * inv;
      ls = w.m[i] + std::log(w.l[i]);
    }
  }
}

template <typename C, typename S>
void runForward(const Problem<C, S>& P, C* out, C* lse) {
  const Dims& d = P.d;
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
  S *ps = nullptr, *dss = nullptr;  // the weights and score-gradient tiles as S, when S is not C
  explicit BwdScratch(int64_t tq) {
    const int64_t tile = kBwdBlockQ * kBwdBlockK;
    hold = empty({3 * tile + std::max<int64_t>(tq, 1)}, {.dtype = DTypeOf<C>::value});
    s = hold.template data<C>();
    pd = s + tile;
    dp = pd + tile;
    dsum = dp + tile;
    if constexpr (!std::is_same_v<S, C>) {
      holdS = empty({2 * tile}, {.dtype = DTypeOf<S>::value});
      ps = holdS.template data<S>();
      dss = ps + tile;
    }
  }
};

// Gradients of batch entry b. go, out: [Tq, Ev] contiguous; lse [Tq]; dq [Tq, E], dk [Tk, E],
// dv [Tk, Ev] contiguous and zeroed.
template <typename C, typename S>
void backwardEntry(const Problem<C, S>& P, BwdScratch<C, S>& w, int64_t b, const S* go, const C* out, const C* lse,
                   C* dq, C* dk, C* dv) {
  const Dims& d = P.d;
  const int64_t lds = kBwdBlockK;
  const int64_t ldo = std::max<int64_t>(d.ev, 1), lde = std::max<int64_t>(d.e, 1);
  for (int64_t i = 0; i < d.tq; ++i) {
    const S* g = go + i * d.ev;
    const C* o = out + i * d.ev;
    C acc = 0;
    for (int64_t e = 0; e < d.ev; ++e) acc += static_cast<C>(g[e]) * o[e];
    w.dsum[i] = acc;
  }
  const S* Qb = P.q.at(b);
  const C dropScale = static_cast<C>(P.drop.scale);
  for (int64_t k0 = 0; k0 < d.tk; k0 += kBwdBlockK) {
    const int64_t cols = std::min(kBwdBlockK, d.tk - k0);
    const S* K = P.k.at(b) + k0 * P.k.ld;
    const S* V = P.v.at(b) + k0 * P.v.ld;
    C* dK = dk + k0 * d.e;
    C* dV = dv + k0 * d.ev;
    // Rows above the first key of this block see none of it under a causal mask.
    const int64_t qStart = P.causal ? (k0 / kBwdBlockQ) * kBwdBlockQ : 0;
    for (int64_t q0 = qStart; q0 < d.tq; q0 += kBwdBlockQ) {
      const int64_t rows = std::min(kBwdBlockQ, d.tq - q0);
      const S* Q = Qb + q0 * P.q.ld;
      const S* dO = go + q0 * d.ev;
      gemm<C, S>(blas::Trans::No, blas::Trans::Yes, rows, cols, d.e, P.scale, Q, P.q.ld, K, P.k.ld, C(0), w.s, lds);
      maskTile(P, w.s, lds, b, q0, rows, k0, cols);
      for (int64_t i = 0; i < rows; ++i) {
        C* r = w.s + i * lds;
        const C shift = lse[q0 + i];
        for (int64_t j = 0; j < cols; ++j) r[j] = expC<C>(r[j] - shift);  // P (NaN for a fully masked row)
        if (P.drop.on) dropRow(w.pd + i * lds, r, cols, P.drop.row(b, q0 + i), k0, P.drop.threshold, dropScale);
      }
      const S* pd = asStorage(P.drop.on ? w.pd : w.s, w.ps, rows, cols, lds);
      gemm<C, S>(blas::Trans::Yes, blas::Trans::No, cols, d.ev, rows, C(1), pd, lds, dO, ldo, C(1), dV, ldo);
      gemm<C, S>(blas::Trans::No, blas::Trans::Yes, rows, cols, d.ev, C(1), dO, ldo, V, P.v.ld, C(0), w.dp, lds);
      for (int64_t i = 0; i < rows; ++i) {
        const C* p = w.s + i * lds;
        C* g = w.dp + i * lds;
        const C di = w.dsum[q0 + i];
        if (P.drop.on) {
          // dP of the dropped weights is zero; the kept ones carry the 1/(1-p) scale.
          const uint64_t rk = P.drop.row(b, q0 + i);
          for (int64_t j = 0; j < cols; ++j) {
            const C z = DropoutKeys::keep(rk, k0 + j, P.drop.threshold) ? dropScale : C(0);
            g[j] = p[j] * (g[j] * z - di);
          }
        } else {
          for (int64_t j = 0; j < cols; ++j) g[j] = p[j] * (g[j] - di);
        }
      }
      const S* ds = asStorage(w.dp, w.dss, rows, cols, lds);
      gemm<C, S>(blas::Trans::No, blas::Trans::No, rows, d.e, cols, P.scale, ds, lds, K, P.k.ld, C(1), dq + q0 * d.e,
                 lde);
      gemm<C, S>(blas::Trans::Yes, blas::Trans::No, cols, d.e, rows, P.scale, ds, lds, Q, P.q.ld, C(1), dK, lde);
    }
  }
}

template <typename C, typename S>
void runBackward(const Problem<C, S>& P, const S* go, const C* out, const C* lse, C* dq, C* dk, C* dv) {
  const Dims& d = P.d;
  parallelFor(d.nb, 1, [&](int64_t lo, int64_t hi) {
    BwdScratch<C, S> w(d.tq);
    for (int64_t b = lo; b < hi; ++b)
      backwardEntry(P, w, b, go + b * d.tq * d.ev, out + b * d.tq * d.ev, lse + b * d.tq, dq + b * d.tq * d.e,
                    dk + b * d.tk * d.e, dv + b * d.tk * d.ev);
  });
}

template <typename C, typename S = C>
Problem<C, S> makeProblem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Dims& d,
                          double scale, bool causal, const DropoutKeys& drop) {
  Problem<C, S> P;
  P.d = d;
  P.scale = static_cast<C>(scale);
  P.causal = causal;
  P.q = makeOperand<S>(q, d, d.tq, d.e);
  P.k = makeOperand<S>(k, d, d.tk, d.e);
  P.v = makeOperand<S>(v, d, d.tk, d.ev);
  P.mask = makeMask<C>(mask, d);
  P.drop = drop;
  return P;
}

Shape withDims(const Shape& batch, int64_t a, int64_t b) {
  Shape s = batch;
  s.push_back(a);
  s.push_back(b);
  return s;
}

// The fused op on the CPU.
Tensor fusedAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Dims& d,
                      double scale, bool causal, const DropoutKeys& drop) {
  const DType ct = q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const bool bf16 = q.dtype() == DType::BFloat16 && blas::hgemmNative(blas::HalfType::BFloat16);
  Tensor outC = empty(withDims(d.batch, d.tq, d.ev), {.dtype = ct});
  Shape lseShape = d.batch;
  lseShape.push_back(d.tq);
  Tensor lse = empty(lseShape, {.dtype = ct});
  {
    autograd::NoGradGuard ng;
    if (outC.numel() > 0 || lse.numel() > 0) {
      if (bf16) {
        Problem<float, BFloat16> P = makeProblem<float, BFloat16>(q, k, v, mask, d, scale, causal, drop);
        runForward(P, outC.data<float>(), lse.data<float>());
      } else if (ct == DType::Float32) {
        Problem<float> P = makeProblem<float>(q, k, v, mask, d, scale, causal, drop);
        runForward(P, outC.data<float>(), lse.data<float>());
      } else {
        Problem<double> P = makeProblem<double>(q, k, v, mask, d, scale, causal, drop);
        runForward(P, outC.data<double>(), lse.data<double>());
      }
    }
  }
  Tensor out = outC.to(q.dtype());
  const bool hasMask = mask.defined();
  autograd::record(kOp, {q, k, v, mask}, {out}, {q, k, v, mask, outC, lse},
                   [d, scale, causal, drop, ct, bf16, hasMask](Ctx& ctx, const GradList& g) -> GradList {
                     GradList r(4);
                     const bool want[3] = {ctx.needsInputGrad(0), ctx.needsInputGrad(1), ctx.needsInputGrad(2)};
                     if (!want[0] && !want[1] && !want[2]) return r;
                     Tensor qs = ctx.saved(0), ks = ctx.saved(1), vs = ctx.saved(2);
                     Tensor ms = hasMask ? ctx.saved(3) : Tensor();
                     Tensor outS = ctx.saved(4), lseS = ctx.saved(5);
                     Tensor go = g[0].to(bf16 ? DType::BFloat16 : ct).contiguous();
                     Tensor dq = zeros(withDims(d.batch, d.tq, d.e), {.dtype = ct});
                     Tensor dk = zeros(withDims(d.batch, d.tk, d.e), {.dtype = ct});
                     Tensor dv = zeros(withDims(d.batch, d.tk, d.ev), {.dtype = ct});
                     if (go.numel() > 0 && d.tk > 0) {
                       if (bf16) {
                         Problem<float, BFloat16> P =
                             makeProblem<float, BFloat16>(qs, ks, vs, ms, d, scale, causal, drop);
                         runBackward(P, go.data<BFloat16>(), outS.data<float>(), lseS.data<float>(), dq.data<float>(),
                                     dk.data<float>(), dv.data<float>());
                       } else if (ct == DType::Float32) {
                         Problem<float> P = makeProblem<float>(qs, ks, vs, ms, d, scale, causal, drop);
                         runBackward(P, go.data<float>(), outS.data<float>(), lseS.data<float>(), dq.data<float>(),
                                     dk.data<float>(), dv.data<float>());
                       } else {
                         Problem<double> P = makeProblem<double>(qs, ks, vs, ms, d, scale, causal, drop);
                         runBackward(P, go.data<double>(), outS.data<double>(), lseS.data<double>(), dq.data<double>(),
                                     dk.data<double>(), dv.data<double>());
                       }
                     }
                     if (want[0]) r[0] = dq;
                     if (want[1]) r[1] = dk;
                     if (want[2]) r[2] = dv;
                     return r;
                   });
  return out;
}

Tensor keepMask(const Shape& attnShape, const DropoutKeys& drop) {
  Tensor m = empty(attnShape, {.dtype = DType::Bool});
  const int64_t tq = attnShape[attnShape.size() - 2], tk = attnShape.back();
  const int64_t nb = tq * tk == 0 ? 0 : m.numel() / (tq * tk);
  bool* p = m.numel() > 0 ? m.data<bool>() : nullptr;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const uint64_t rk = drop.row(b, i);
      bool* r = p + (b * tq + i) * tk;
      for (int64_t j = 0; j < tk; ++j) r[j] = DropoutKeys::keep(rk, j, drop.threshold);
    }
  return m;
}

// The fused op on another device, through its registered kernels, when it has them for these
// inputs: no mask or dropout, one batch shape, e == ev, a dtype and head size the kernel takes.
// Returns an undefined tensor otherwise (the caller runs the unfused formula).
Tensor deviceFusedAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts, const Dims& d) {
  if (opts.mask.defined() || opts.dropout > 0.0 || d.e != d.ev || d.tq == 0 || d.tk == 0) return Tensor();
  const Shape batch(q.sizes().begin(), q.sizes().end() - 2);
  if (Shape(k.sizes().begin(), k.sizes().end() - 2) != batch || Shape(v.sizes().begin(), v.sizes().end() - 2) != batch)
    return Tensor();
  auto* supports = dispatch::find<detail::SdpaSupportsKernel>(kOp, q.device());
  auto* forward = dispatch::find<detail::SdpaForwardKernel>(kOp, q.device());
  auto* backward = dispatch::find<detail::SdpaBackwardKernel>(kOp, q.device());
  if (supports == nullptr || forward == nullptr || backward == nullptr || !supports(q.dtype(), d.e)) return Tensor();
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const bool causal = opts.causal;
  Tensor qc, kc, vc, out, lse;
  {
    autograd::NoGradGuard ng;
    qc = q.contiguous().reshape({d.nb, d.tq, d.e});
    kc = k.contiguous().reshape({d.nb, d.tk, d.e});
    vc = v.contiguous().reshape({d.nb, d.tk, d.e});
    out = empty({d.nb, d.tq, d.e}, {.dtype = q.dtype(), .device = q.device()});
    lse = empty({d.nb, d.tq}, {.dtype = DType::Float32, .device = q.device()});
    forward(out, lse, qc, kc, vc, scale, causal);
  }
  Tensor result = out.view(withDims(d.batch, d.tq, d.e));
  autograd::record(kOp, {q, k, v}, {result}, {qc, kc, vc, out, lse},
                   [d, scale, causal, backward](Ctx& ctx, const GradList& g) -> GradList {
                     GradList r(3);
                     Tensor qs = ctx.saved(0), ks = ctx.saved(1), vs = ctx.saved(2);
                     Tensor dq = empty(qs.sizes(), {.dtype = qs.dtype(), .device = qs.device()});
                     Tensor dk = empty(ks.sizes(), {.dtype = ks.dtype(), .device = ks.device()});
                     Tensor dv = empty(vs.sizes(), {.dtype = vs.dtype(), .device = vs.device()});
                     Tensor go = g[0].to(qs.dtype()).contiguous().reshape(qs.sizes());
                     backward(dq, dk, dv, qs, ks, vs, ctx.saved(3), ctx.saved(4), go, scale, causal);
                     if (ctx.needsInputGrad(0)) r[0] = dq.view(withDims(d.batch, d.tq, d.e));
                     if (ctx.needsInputGrad(1)) r[1] = dk.view(withDims(d.batch, d.tk, d.e));
                     if (ctx.needsInputGrad(2)) r[2] = dv.view(withDims(d.batch, d.tk, d.ev));
                     return r;
                   });
  return result;
}

}  // namespace

// The formula with matmul and softmax ([..., Tq, Tk] materialised), also the path of devices
// without the fused kernel. No autocast entry of its own: under autocast the ops inside are
// dispatched one by one, each by its policy.
Tensor scaledDotProductAttentionMath(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  const Dims d = checkArgs(q, k, v, opts);
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const DropoutKeys drop =
      opts.dropout > 0.0 ? DropoutKeys(opts.dropout, drawDropoutKey(opts.generator), d.tq) : DropoutKeys();
  const Device dev = q.device();
  Tensor att = matmul(q, k.transpose(-2, -1)) * scale;  // [..., Tq, Tk]
  if (opts.causal) {
    // Key j is visible to query i when j <= i: a [Tq, Tk] comparison on the device of two index
    // vectors (not a mask built on the host and copied each call).
    Tensor rows = arange(d.tq, {.dtype = DType::Int64, .device = dev}).unsqueeze(1);
    Tensor cols = arange(d.tk, {.dtype = DType::Int64, .device = dev}).unsqueeze(0);
    att = where(le(cols, rows), att,
                full({}, -std::numeric_limits<double>::infinity(), {.dtype = att.dtype(), .device = dev}));
  } else if (opts.mask.defined()) {
    if (opts.mask.dtype() == DType::Bool)
      att = where(opts.mask, att,
                  full({}, -std::numeric_limits<double>::infinity(), {.dtype = att.dtype(), .device = dev}));
    else att = att + opts.mask.to(att.dtype());
  }
  att = softmax(att, -1);
  if (drop.on) {
    Tensor keep = keepMask(withDims(d.batch, d.tq, d.tk), drop);
    Tensor z = where(keep, full({}, drop.scale, {.dtype = DType::Float64}), zeros({}, {.dtype = DType::Float64}));
    att = att * z.to(att.dtype()).to(dev);
  }
  return matmul(att, v);
}

Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  COHORT_RECORD_OP("scaledDotProductAttention", q, k, v, opts);
  COHORT_AUTOCAST("scaledDotProductAttention", scaledDotProductAttention, q, k, v, opts);
  const Dims d = checkArgs(q, k, v, opts);
  if (!q.device().isCpu()) {
    if (Tensor out = deviceFusedAttention(q, k, v, opts, d); out.defined()) return out;
    return scaledDotProductAttentionMath(q, k, v, opts);
  }
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.e)));
  const DropoutKeys drop =
      opts.dropout > 0.0 ? DropoutKeys(opts.dropout, drawDropoutKey(opts.generator), d.tq) : DropoutKeys();
  return fusedAttention(q, k, v, opts.mask, d, scale, opts.causal, drop);
}

Tensor scaledDotProductAttentionDropoutMask(const Shape& attnShape, double p, Generator* gen) {
  const char* op = "scaledDotProductAttentionDropoutMask";
  if (attnShape.size() < 2)
    throw ValueError(
        fmt::format("{}: attnShape must have at least 2 dims [..., Tq, Tk], got {}", op, shapeStr(attnShape)));
  for (int64_t s : attnShape)
    if (s < 0) throw ValueError(fmt::format("{}: attnShape {} has a negative size", op, shapeStr(attnShape)));
  if (!(p >= 0.0 && p < 1.0)) throw ValueError(fmt::format("{}: p must be in [0, 1), got {}", op, p));
  const int64_t tq = attnShape[attnShape.size() - 2];
  if (p == 0.0) return ones(attnShape, {.dtype = DType::Bool});
  return keepMask(attnShape, DropoutKeys(p, drawDropoutKey(gen), tq));
}

}  // namespace cohort::nn::functional
