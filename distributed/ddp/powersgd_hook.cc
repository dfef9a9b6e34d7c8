#include <cohort/distributed/ddp/powersgd_hook.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/generator.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/detail/coalesce.h>

namespace cohort::dist {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

DType computeDType(DType dt) { return dt == DType::Float64 ? DType::Float64 : DType::Float32; }

// Orthonormalises the columns of a contiguous row-major [n, r] matrix in place: Gram–Schmidt with
// a second projection pass (one pass loses orthogonality when columns are nearly dependent) and
// dot products accumulated in double. A column whose remainder is zero or at rounding level
// relative to the column it started as is set to zero instead of being blown up to unit length.
// Returns the indices of those columns.
template <typename T>
std::vector<int64_t> orthonormalizeColumns(T* a, int64_t n, int64_t r) {
  constexpr double kRelTol = 16 * std::numeric_limits<T>::epsilon();
  std::vector<int64_t> vanished;
  std::vector<char> zero(r, 0);
  auto norm = [&](int64_t j) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i * r + j]) * a[i * r + j];
    return std::sqrt(s);
  };
  for (int64_t j = 0; j < r; ++j) {
    const double before = norm(j);
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k = 0; k < j; ++k) {
        if (zero[k]) continue;
        double d = 0;
        for (int64_t i = 0; i < n; ++i) d += static_cast<double>(a[i * r + k]) * a[i * r + j];
        for (int64_t i = 0; i < n; ++i) a[i * r + j] -= static_cast<T>(d * a[i * r + k]);
      }
    }
    const double after = norm(j);
    if (!(after > kRelTol * before) || !std::isfinite(after)) {
      for (int64_t i = 0; i < n; ++i) a[i * r + j] = T(0);
      zero[j] = 1;
      vanished.push_back(j);
      continue;
    }
    const double inv = 1.0 / after;
    for (int64_t i = 0; i < n; ++i) a[i * r + j] = static_cast<T>(a[i * r + j] * inv);
  }
  return vanished;
}

std::vector<int64_t> orthonormalize(Tensor& m) {
  COHORT_CHECK(m.dim() == 2 && m.isContiguous(), "PowerSGD: orthonormalize needs a contiguous matrix");
  if (m.dtype() == DType::Float64) return orthonormalizeColumns(m.data<double>(), m.size(0), m.size(1));
  return orthonormalizeColumns(m.data<float>(), m.size(0), m.size(1));
}

}  // namespace

// One compressed gradient of a bucket.
struct PowerSGDMatrix {
  size_t slot = 0;
  int64_t offset = 0;  // in the bucket's buffer
  int64_t rows = 0, cols = 0, rank = 0;
  Tensor q;      // [cols, rank]: the averaged Q of the last step (warm start)
  Tensor error;  // [rows, cols]: this rank's M − approximation of the last step
};

struct PowerSGDHook::BucketState {
  // The layout this state belongs to.
  std::vector<std::weak_ptr<TensorImpl>> params;
  std::vector<int64_t> offsets;
  DType dtype = DType::Float32;
  int64_t numel = 0;

  std::vector<PowerSGDMatrix> matrices;
  std::vector<size_t> uncompressed;  // slots averaged as they are
  std::vector<char> compressedSlot;
  Generator gen;  // same seed on every rank, drawn from in the same order: Q stays identical

  bool matches(const GradBucket& b) const {
    if (b.parameters.size() != params.size() || b.offsets != offsets || b.buffer.dtype() != dtype ||
        b.buffer.numel() != numel)
      return false;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].lock().get() != b.parameters[i].impl()) return false;
    return true;
  }
};

PowerSGDHook::PowerSGDHook(PowerSGDOptions options) : opts_(options) {
  if (opts_.matrixApproximationRank < 1) {
    throw ValueError(fmt::format("powerSGDHook: PowerSGDOptions::matrixApproximationRank must be at least 1, got {}",
                                 opts_.matrixApproximationRank));
  }
  if (opts_.minCompressionRate < 0) {
    throw ValueError(fmt::format(
        "powerSGDHook: PowerSGDOptions::minCompressionRate must be 0 or more (0 compresses every matrix), got {}",
        opts_.minCompressionRate));
  }
}

PowerSGDHook::~PowerSGDHook() = default;

std::shared_ptr<PowerSGDHook::BucketState> PowerSGDHook::stateFor(const GradBucket& b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (states_.size() <= b.index) states_.resize(b.index + 1);
  auto& slot = states_[b.index];
  if (slot && slot->matches(b)) return slot;

  auto s = std::make_shared<BucketState>();
  for (const Tensor& p : b.parameters) s->params.push_back(p.implPtr());
  s->offsets = b.offsets;
  s->dtype = b.buffer.dtype();
  s->numel = b.buffer.numel();
  // Every rank creates a bucket's state at the same iteration (buckets change together).
  s->gen.manualSeed(splitmix(splitmix(opts_.seed) ^ splitmix(b.index * 0x100000001b3ULL + b.iteration)));
  s->compressedSlot.assign(b.parameters.size(), 0);
  for (size_t i = 0; i < b.parameters.size(); ++i) {
    const Tensor& p = b.parameters[i];
    if (p.dim() <= 1 || p.numel() == 0) {
      s->uncompressed.push_back(i);
      continue;
    }
    PowerSGDMatrix m;
    m.slot = i;
    m.offset = b.offsets[i];
    m.rows = p.size(0);
    m.cols = p.numel() / m.rows;
    m.rank = std::min<int64_t>({opts_.matrixApproximationRank, m.rows, m.cols});
    if (m.rows * m.cols < opts_.minCompressionRate * m.rank * (m.rows + m.cols)) {
      s->uncompressed.push_back(i);
      continue;
    }
    s->compressedSlot[i] = 1;
    s->matrices.push_back(std::move(m));
  }
  ++resets_;
  slot = s;
  return s;
}

std::shared_ptr<const PowerSGDHook::BucketState> PowerSGDHook::findState(size_t bucket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return bucket < states_.size() ? states_[bucket] : nullptr;
}

bool PowerSGDHook::isCompressed(size_t bucket, size_t slot) const {
  auto s = findState(bucket);
  return s && slot < s->compressedSlot.size() && s->compressedSlot[slot];
}

Tensor PowerSGDHook::error(size_t bucket, size_t slot) const {
  auto s = findState(bucket);
  if (!s) return Tensor();
  for (const auto& m : s->matrices)
    if (m.slot == slot) return m.error;
  return Tensor();
}

Tensor PowerSGDHook::q(size_t bucket, size_t slot) const {
  auto s = findState(bucket);
  if (!s) return Tensor();
  for (const auto& m : s->matrices)
    if (m.slot == slot) return m.q;
  return Tensor();
}

uint64_t PowerSGDHook::stateResets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resets_;
}

Future<Tensor> PowerSGDHook::run(ProcessGroup& pg, GradBucket& bucket) {
  Tensor buffer = bucket.buffer;
  if (!buffer.device().isCpu()) {
    return Future<Tensor>::failed(std::make_exception_ptr(NotSupportedError(
        fmt::format("powerSGDHook: bucket {} is on {}; PowerSGD compresses CPU gradients only (its "
                    "orthogonalisation runs on the host); use the default all-reduce or bf16CompressHook on a GPU",
                    bucket.index, buffer.device()))));
  }
  if (bucket.iteration < opts_.startPowerSGDIter) return firstOutput(pg.allreduce(buffer, {.op = ReduceOp::Avg}));
  if (!isFloating(buffer.dtype())) {
    return Future<Tensor>::failed(std::make_exception_ptr(ValueError(
        fmt::format("powerSGDHook: bucket {} holds {} gradients; PowerSGD compresses floating-point gradients only",
                    bucket.index, buffer.dtype()))));
  }
  autograd::NoGradGuard noGrad;
  auto state = stateFor(bucket);
  if (state->matrices.empty()) return firstOutput(pg.allreduce(buffer, {.op = ReduceOp::Avg}));

  try {
    const DType ct = computeDType(buffer.dtype());
    const size_t k = state->matrices.size();

    // 1. The uncompressed gradients: one allreduce of all of them, issued first.
    Tensor flat;
    WorkPtr flatWork;
    std::vector<Tensor> plain;
    auto plainLayout = std::make_shared<detail::FlatLayout>();
    if (!state->uncompressed.empty()) {
      for (size_t slot : state->uncompressed) plain.push_back(bucket.gradient(slot));
      *plainLayout = detail::FlatLayout::of(plain, "powerSGDHook");
      flat = detail::pack(plain, *plainLayout);
      flatWork = pg.allreduce(flat, {.op = ReduceOp::Avg});
    }

    // 2. M (+ error), Q, P = M·Q for every compressed gradient, P packed into one tensor.
    std::vector<Tensor> ms(k);
    std::vector<Shape> pShapes(k), qShapes(k);  // P_i is rows x rank, Q_i is cols x rank
    for (size_t i = 0; i < k; ++i) {
      PowerSGDMatrix& mat = state->matrices[i];
      Tensor view = buffer.narrow(0, mat.offset, mat.rows * mat.cols).view({mat.rows, mat.cols});
      // A view of the bucket for float32/float64 (so M += error changes the bucket, which the
      // approximation overwrites below); a float32 copy for half-precision buckets.
      ms[i] = view.to(ct);
      if (opts_.useErrorFeedback && mat.error.defined()) ms[i].add_(mat.error);
      if (!opts_.warmStart || !mat.q.defined()) mat.q = randn({mat.cols, mat.rank}, {.dtype = ct}, &state->gen);
      // Keep Q at full column rank: redraw columns that vanish (Q is the same on every rank, and
      // so are these draws).
      for (int attempt = 0;; ++attempt) {
        auto vanished = orthonormalize(mat.q);
        if (vanished.empty() || attempt == 3) break;
        Tensor fresh = randn({mat.cols, static_cast<int64_t>(vanished.size())}, {.dtype = ct}, &state->gen);
        for (size_t c = 0; c < vanished.size(); ++c) mat.q.select(1, vanished[c]).copy_(fresh.select(1, c));
      }
      pShapes[i] = {mat.rows, mat.rank};
      qShapes[i] = {mat.cols, mat.rank};
    }
    const detail::FlatLayout pLayout = detail::FlatLayout::ofShapes(pShapes, ct);
    Tensor pAll = empty({pLayout.total}, {.dtype = ct});
    std::vector<Tensor> ps = detail::views(pAll, pLayout);
    for (size_t i = 0; i < k; ++i) ps[i].copy_(mm(ms[i], state->matrices[i].q));
    WorkPtr pWork = pg.allreduce(pAll, {.op = ReduceOp::Sum});
    pWork->wait();  // bounded by the group's timeout; Q's allreduce needs the orthonormalised P

    // 3. Orthonormalise P, Q = Mᵀ·P, allreduce Q (Avg).
    const detail::FlatLayout qLayout = detail::FlatLayout::ofShapes(qShapes, ct);
    Tensor qAll = empty({qLayout.total}, {.dtype = ct});
    std::vector<Tensor> qs = detail::views(qAll, qLayout);
    for (size_t i = 0; i < k; ++i) {
      orthonormalize(ps[i]);
      qs[i].copy_(mm(ms[i].t(), ps[i]));
    }
    WorkPtr qWork = pg.allreduce(qAll, {.op = ReduceOp::Avg});

    // 4. Decompress when Q arrives; then put the averaged uncompressed gradients back.
    const bool feedback = opts_.useErrorFeedback;
    return qWork->future().then([state, ms, ps, qs, buffer, flat, flatWork, feedback, plain,
                                 plainLayout](Future<std::vector<Tensor>> done) mutable -> Future<Tensor> {
      done.value();  // rethrows the allreduce's error
      autograd::NoGradGuard noGrad;
      for (size_t i = 0; i < ms.size(); ++i) {
        PowerSGDMatrix& mat = state->matrices[i];
        Tensor approx = mm(ps[i], qs[i].t());
        if (feedback) mat.error = ms[i] - approx;
        mat.q = qs[i];
        buffer.narrow(0, mat.offset, mat.rows * mat.cols).view({mat.rows, mat.cols}).copy_(approx);
      }
      if (!flatWork) return Future<Tensor>::ready(buffer);
      return flatWork->future().then([buffer, flat, plain, plainLayout](Future<std::vector<Tensor>> f) -> Tensor {
        f.value();
        autograd::NoGradGuard noGrad;
        detail::unpack(flat, plain, *plainLayout);
        return buffer;
      });
    });
  } catch (...) {
    // This rank's collectives are now out of step with its peers: the group is unusable, and the
    // bucket's state is half updated. Start it afresh if the hook is ever reused.
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bucket.index < states_.size() && states_[bucket.index] == state) states_[bucket.index] = nullptr;
    }
    return Future<Tensor>::failed(std::current_exception());
  }
}

CommHookPtr powerSGDHook(PowerSGDOptions options) { return std::make_shared<PowerSGDHook>(options); }

}  // namespace cohort::dist
