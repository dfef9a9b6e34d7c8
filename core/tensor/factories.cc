// Tensor factories and random fills.
#include <cmath>

#include <cohort/core/autograd/function.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {
namespace {

void checkShape(const Shape& shape, const char* op) {
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      throw ValueError(fmt::format("{}: negative size {} at dim {} in shape {}", op, shape[i], i, shapeStr(shape)));
}

Tensor finish(Tensor t, const TensorOptions& opts) {
  if (opts.requiresGrad) t.setRequiresGrad(true);
  return t;
}

// Factories that compute their values element by element (ranges, identity, random draws) build
// them on the host and move them: a device tensor gets exactly the CPU's values, random streams
// included, at the cost of one copy (these run at initialisation, or on small index tensors).
TensorOptions hostOptions(TensorOptions opts) {
  opts.device = Device::cpu();
  opts.requiresGrad = false;
  return opts;
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions opts) {
  checkShape(shape, "empty");
  int64_t n = shapeNumel(shape);
  auto storage = std::make_shared<Storage>(static_cast<size_t>(n) * elementSize(opts.dtype), opts.device);
  return finish(Tensor(
                    std::make_shared<TensorImpl>(std::move(storage), 0, shape, contiguousStrides(shape), opts.dtype)),
                opts);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions opts) {
  COHORT_RECORD_OP("full", shape, value, opts);
  bool rg = opts.requiresGrad;
  opts.requiresGrad = false;
  Tensor t = empty(shape, opts);
  t.fill_(value);
  if (rg) t.setRequiresGrad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) {
  COHORT_RECORD_OP("zeros", shape, opts);
  return full(shape, 0, opts);
}
Tensor ones(const Shape& shape, TensorOptions opts) {
  COHORT_RECORD_OP("ones", shape, opts);
  return full(shape, 1, opts);
}
Tensor emptyLike(const Tensor& t) { return empty(t.sizes(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zerosLike(const Tensor& t) {
  COHORT_RECORD_OP("zerosLike", t);
  return zeros(t.sizes(), {.dtype = t.dtype(), .device = t.device()});
}
Tensor onesLike(const Tensor& t) {
  COHORT_RECORD_OP("onesLike", t);
  return ones(t.sizes(), {.dtype = t.dtype(), .device = t.device()});
}
Tensor fullLike(const Tensor& t, Scalar v) {
  COHORT_RECORD_OP("fullLike", t, v);
  return full(t.sizes(), v, {.dtype = t.dtype(), .device = t.device()});
}

Tensor scalarTensor(Scalar v, TensorOptions opts) {
  COHORT_RECORD_OP("scalarTensor", v, opts);
  return full({}, v, opts);
}

Tensor arange(Scalar end, TensorOptions opts) {
  COHORT_RECORD_OP("arange", end, opts);
  return arange(0, end, 1, opts);
}

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  COHORT_RECORD_OP("arange", start, end, step, opts);
  double s = start.toDouble(), e = end.toDouble(), st = step.toDouble();
  if (st == 0) throw ValueError("arange: step must be nonzero");
  if ((e - s) / st < 0)
    throw ValueError(fmt::format("arange: upper bound {} and lower bound {} are inconsistent with step {}", e, s, st));
  if (!opts.device.isCpu()) return finish(arange(start, end, step, hostOptions(opts)).to(opts.device), opts);
  int64_t n = static_cast<int64_t>(std::ceil((e - s) / st));
  Tensor t = empty({n}, {.dtype = opts.dtype, .device = opts.device});
  COHORT_DISPATCH(opts.dtype, "arange", [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<Acc<T>>(s + static_cast<double>(i) * st));
  });
  return finish(t, opts);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts) {
  COHORT_RECORD_OP("linspace", start, end, steps, opts);
  if (steps < 0) throw ValueError(fmt::format("linspace: number of steps must be non-negative, got {}", steps));
  if (!opts.device.isCpu()) return finish(linspace(start, end, steps, hostOptions(opts)).to(opts.device), opts);
  Tensor t = empty({steps}, {.dtype = opts.dtype, .device = opts.device});
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  COHORT_DISPATCH(opts.dtype, "linspace", [&]<typename T>() {
    T* p = t.data<T>();
    // Fill from both ends, as torch does, so the last value is exactly `end` (a single step is
    // `start`, as in torch).
    int64_t half = steps == 1 ? 1 : steps / 2;
    for (int64_t i = 0; i < steps; ++i) {
      double v = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - i - 1);
      p[i] = static_cast<T>(static_cast<Acc<T>>(v));
    }
  });
  return finish(t, opts);
}

Tensor eye(int64_t n, int64_t m, TensorOptions opts) {
  COHORT_RECORD_OP("eye", n, m, opts);
  if (m < 0) m = n;
  if (n < 0) throw ValueError(fmt::format("eye: n must be non-negative, got {}", n));
  if (!opts.device.isCpu()) return finish(eye(n, m, hostOptions(opts)).to(opts.device), opts);
  bool rg = opts.requiresGrad;
  opts.requiresGrad = false;
  Tensor t = zeros({n, m}, opts);
  COHORT_DISPATCH(opts.dtype, "eye", [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = static_cast<T>(static_cast<Acc<T>>(1));
  });
  return rg ? t.setRequiresGrad(true) : t;
}

template <typename T>
Tensor fromVector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  checkShape(s, "fromVector");
  if (shapeNumel(s) != static_cast<int64_t>(values.size()))
    throw ValueError(fmt::format("fromVector: {} values do not fill shape {} ({} elements)", values.size(), shapeStr(s),
                                 shapeNumel(s)));
  if (!opts.device.isCpu()) return finish(fromVector(values, s, hostOptions(opts)).to(opts.device), opts);
  bool rg = opts.requiresGrad;
  opts.requiresGrad = false;
  Tensor t = empty(s, opts);
  COHORT_DISPATCH(opts.dtype, "fromVector", [&]<typename D>() {
    D* p = t.data<D>();
    for (size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>) p[i] = static_cast<D>(static_cast<Acc<D>>(values[i] ? 1 : 0));
      else p[i] = static_cast<D>(static_cast<Acc<D>>(values[i]));
    }
  });
  return rg ? t.setRequiresGrad(true) : t;
}
template Tensor fromVector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor fromVector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor fromVector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor fromVector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor fromVector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor fromVector<bool>(const std::vector<bool>&, const Shape&, TensorOptions);

// ---- random ------------------------------------------------------------------------------------

namespace {

// Fills the contiguous tensor t with fn(u) for uniforms u in [0,1) drawn from gen.
void fillUniform(Tensor& t, Generator& gen, double low, double high) {
  int64_t n = t.numel();
  COHORT_DISPATCH_FLOAT(t.dtype(), "uniform_", [&]<typename T>() {
    T* p = t.data<T>();
    if constexpr (std::is_same_v<T, double>) {
      uint64_t c = gen.reserve(static_cast<uint64_t>((n + 1) / 2));
      for (int64_t i = 0; i < n; i += 2) {
        auto w = Generator::philox(gen.seed(), c + static_cast<uint64_t>(i / 2));
        p[i] = low + (high - low) * Generator::toUniformDouble(w[0], w[1]);
        if (i + 1 < n) p[i + 1] = low + (high - low) * Generator::toUniformDouble(w[2], w[3]);
      }
    } else {
      uint64_t c = gen.reserve(static_cast<uint64_t>((n + 3) / 4));
      float lo = static_cast<float>(low), span = static_cast<float>(high - low);
      for (int64_t i = 0; i < n; i += 4) {
        auto w = Generator::philox(gen.seed(), c + static_cast<uint64_t>(i / 4));
        for (int k = 0; k < 4 && i + k < n; ++k) p[i + k] = static_cast<T>(lo + span * Generator::toUniformFloat(w[k]));
      }
    }
  });
}

void fillNormal(Tensor& t, Generator& gen, double mean, double stddev) {
  int64_t n = t.numel();
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  COHORT_DISPATCH_FLOAT(t.dtype(), "normal_", [&]<typename T>() {
    T* p = t.data<T>();
    // Box-Muller: each Philox block gives two (double) or four (float) normals.
    if constexpr (std::is_same_v<T, double>) {
      uint64_t c = gen.reserve(static_cast<uint64_t>((n + 1) / 2));
      for (int64_t i = 0; i < n; i += 2) {
        auto w = Generator::philox(gen.seed(), c + static_cast<uint64_t>(i / 2));
        double u1 = 1.0 - Generator::toUniformDouble(w[0], w[1]);  // (0, 1]
        double u2 = Generator::toUniformDouble(w[2], w[3]);
        double r = std::sqrt(-2.0 * std::log(u1));
        p[i] = mean + stddev * r * std::cos(kTwoPi * u2);
        if (i + 1 < n) p[i + 1] = mean + stddev * r * std::sin(kTwoPi * u2);
      }
    } else {
      uint64_t c = gen.reserve(static_cast<uint64_t>((n + 3) / 4));
      for (int64_t i = 0; i < n; i += 4) {
        auto w = Generator::philox(gen.seed(), c + static_cast<uint64_t>(i / 4));
        for (int k = 0; k < 4; k += 2) {
          double u1 = 1.0 - static_cast<double>(Generator::toUniformFloat(w[k]));
          double u2 = static_cast<double>(Generator::toUniformFloat(w[k + 1]));
          double r = std::sqrt(-2.0 * std::log(u1));
          if (i + k < n) p[i + k] = static_cast<T>(static_cast<float>(mean + stddev * r * std::cos(kTwoPi * u2)));
          if (i + k + 1 < n)
            p[i + k + 1] = static_cast<T>(static_cast<float>(mean + stddev * r * std::sin(kTwoPi * u2)));
        }
      }
    }
  });
}

template <typename Fill>
Tensor& fillRandom(Tensor& t, Generator* gen, const char* op, Fill&& fill) {
  if (!isFloating(t.dtype()))
    throw ValueError(fmt::format("{}: expected a floating-point tensor, got {}", op, t.dtype()));
  autograd::checkInplace(op, t);
  Generator& g = gen ? *gen : defaultGenerator();
  if (t.isContiguous() && t.device().isCpu()) {
    fill(t, g);
    t.bumpVersion();
  } else {  // drawn on the host (device tensors get the CPU's stream), then copied in
    Tensor tmp = empty(t.sizes(), {.dtype = t.dtype()});
    fill(tmp, g);
    t.copy_(tmp);
  }
  return t;
}

}  // namespace

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  COHORT_RECORD_OP("uniform_", t, low, high, gen);
  return fillRandom(t, gen, "uniform_", [&](Tensor& x, Generator& g) { fillUniform(x, g, low, high); });
}
Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen) {
  COHORT_RECORD_OP("normal_", t, mean, stddev, gen);
  return fillRandom(t, gen, "normal_", [&](Tensor& x, Generator& g) { fillNormal(x, g, mean, stddev); });
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  COHORT_RECORD_OP("rand", shape, opts, gen);
  Tensor t = empty(shape, {.dtype = opts.dtype, .device = opts.device});
  uniform_(t, 0.0, 1.0, gen);
  return finish(t, opts);
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  COHORT_RECORD_OP("randn", shape, opts, gen);
  Tensor t = empty(shape, {.dtype = opts.dtype, .device = opts.device});
  normal_(t, 0.0, 1.0, gen);
  return finish(t, opts);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  COHORT_RECORD_OP("randint", low, high, shape, opts, gen);
  if (high <= low) throw ValueError(fmt::format("randint: high ({}) must be greater than low ({})", high, low));
  if (!opts.device.isCpu()) return randint(low, high, shape, hostOptions(opts), gen).to(opts.device);
  Tensor t = empty(shape, {.dtype = opts.dtype, .device = opts.device});
  Generator& g = gen ? *gen : defaultGenerator();
  int64_t n = t.numel();
  uint64_t range = static_cast<uint64_t>(high - low);
  uint64_t c = g.reserve(static_cast<uint64_t>((n + 1) / 2));
  COHORT_DISPATCH_NUMERIC(opts.dtype, "randint", [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; i += 2) {
      auto w = Generator::philox(g.seed(), c + static_cast<uint64_t>(i / 2));
      // 64 random bits per value: the modulo bias is below 2^-32 for any range that fits in 32 bits.
      uint64_t a = (static_cast<uint64_t>(w[0]) << 32) | w[1];
      uint64_t b = (static_cast<uint64_t>(w[2]) << 32) | w[3];
      p[i] = static_cast<T>(static_cast<Acc<T>>(low + static_cast<int64_t>(a % range)));
      if (i + 1 < n) p[i + 1] = static_cast<T>(static_cast<Acc<T>>(low + static_cast<int64_t>(b % range)));
    }
  });
  return t;
}

}  // namespace cohort
