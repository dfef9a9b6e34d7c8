// Reductions on a GPU against the CPU on the same inputs: sum, mean, amax/amin, var/std, norm,
// max/min (values and indices), argmax/argmin, over inner / outer / middle / several / all dims,
// with and without keepdim, odd sizes (1, 7, 1000, 4097), shapes long enough to split the reduced
// extent across blocks, non-contiguous inputs, 0-dim and empty tensors, and every dtype the op
// takes; then gradients of each through autograd on both devices, and float64 finite-difference
// checks of the device gradients.
//
// Tolerances. The GPU sums in double in a tree order, the CPU in float blocks folded in double:
// float32 sums agree within rtol 1e-5 plus an absolute 1e-6 * |x|max * sqrt(n) for cancellation;
// float64 within 1e-12 relative; float16/bfloat16 results, computed in float/double on both sides
// and rounded once, within one unit in the last place (rtol 2^-10 / 2^-7). var/std/norm likewise.
// Max/min/argmax/argmin, the values of max/min and the max/min gradients are bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <cohort/core/ops/dispatch.h>

#include "core/cuda/cuda_test_util.h"
#include "core/gradcheck.h"
#include "core/test_util.h"

namespace cohort {
namespace {

using testing::expectBitEqual;

using testing::expectClose;

using testing::kFloatTypes;
using testing::values;
const std::vector<DType> kIntTypes = {DType::Int64, DType::Int32, DType::UInt8, DType::Bool};

// Small integers stored in a float type: many ties for max/min/argmax.
Tensor tied(const Shape& s, DType dt, uint64_t seed = 2) {
  Generator g(seed);
  return (rand(s, {}, &g) * 5.0).to(DType::Int64).to(dt);
}

Tensor cuda(const Tensor& t) { return t.to(Device::cuda()); }

struct Tol {
  double atol, rtol;
};
// Tolerance of a sum-like result over n elements of magnitude up to `mag`.
Tol sumTol(DType dt, int64_t n, double mag = 4.0) {
  const double spread = mag * std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)));
  switch (dt) {
    case DType::Float64: return {1e-12 * spread, 1e-12};
    case DType::Float16: return {1e-6 * spread, 1.0 / 1024};
    case DType::BFloat16: return {1e-6 * spread, 1.0 / 128};
    default: return {1e-6 * spread, 1e-5};
  }
}

struct Case {
  Shape shape;
  Shape dims;
};

// Inner, outer, middle, several (adjacent and not), all dims; odd sizes; splits of long extents.
const std::vector<Case> kCases = {
    {{7}, {}},
    {{1}, {0}},
    {{1000}, {0}},
    {{4097}, {}},
    {{7, 1000}, {1}},
    {{7, 1000}, {0}},
    {{4097, 7}, {0}},
    {{4097, 7}, {1}},
    {{1, 4097}, {1}},
    {{3, 4097, 5}, {1}},
    {{3, 4097, 5}, {0, 2}},
    {{3, 7, 5}, {0, 1}},
    {{2, 3, 4, 5}, {1, 3}},
    {{2, 3, 4, 5}, {-1, 0}},
    {{3, 200000}, {1}},
    {{200000, 3}, {0}},
    {{1 << 20}, {}},
    {{}, {}},
};

std::string label(const Case& c, DType dt, bool keep, const std::string& op) {
  return fmt::format("{} {} of {} over {}{}", op, dt, shapeStr(c.shape), c.dims.empty() ? "all" : shapeStr(c.dims),
                     keep ? " keepdim" : "");
}

int64_t reducedCount(const Case& c) {
  if (c.shape.empty()) return 1;
  if (c.dims.empty()) return shapeNumel(c.shape);
  int64_t n = 1;
  for (int64_t d : c.dims) n *= c.shape[static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(c.shape.size()) : d)];
  return n;
}

// ---- forward values -------------------------------------------------------------------------------

TEST(CudaReduce, SumMeanVarStdNormEveryFloatDtype) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (const Case& c : kCases) {
      Tensor x = values(c.shape, dt);
      Tensor xd = cuda(x);
      const int64_t n = reducedCount(c);
      for (bool keep : {false, true}) {
        Tol t = sumTol(dt, n);
        expectClose(sum(xd, c.dims, keep), sum(x, c.dims, keep), t.atol, t.rtol, label(c, dt, keep, "sum"));
        expectClose(mean(xd, c.dims, keep), mean(x, c.dims, keep), t.atol / static_cast<double>(n), t.rtol,
                    label(c, dt, keep, "mean"));
        // var / std: both sides accumulate in double; the result's rounding dominates.
        Tol v = sumTol(dt, 1);
        expectClose(var(xd, c.dims, 1, keep), var(x, c.dims, 1, keep), v.atol, v.rtol + 1e-9,
                    label(c, dt, keep, "var"));
        expectClose(std(xd, c.dims, 0, keep), std(x, c.dims, 0, keep), v.atol, v.rtol + 1e-9,
                    label(c, dt, keep, "std"));
        for (double p : {2.0, 1.0, 0.0, 3.0, 0.5}) {
          Tol q = sumTol(dt, n);
          expectClose(norm(xd, p, c.dims, keep), norm(x, p, c.dims, keep), q.atol, q.rtol * 2,
                      label(c, dt, keep, fmt::format("norm p={}", p)));
        }
        for (double p : {INFINITY, -INFINITY})
          expectBitEqual(norm(xd, p, c.dims, keep), norm(x, p, c.dims, keep),
                         label(c, dt, keep, fmt::format("norm p={}", p)));
      }
    }
  }
}

TEST(CudaReduce, AmaxAminMaxMinArgmaxBitIdentical) {
  COHORT_REQUIRE_GPU();
  std::vector<DType> types = kFloatTypes;
  types.insert(types.end(), kIntTypes.begin(), kIntTypes.end());
  for (DType dt : types) {
    for (const Case& c : kCases) {
      for (const Tensor& x : {values(c.shape, dt), isFloating(dt) ? tied(c.shape, dt) : values(c.shape, dt, 5)}) {
        Tensor xd = cuda(x);
        for (bool keep : {false, true}) {
          expectBitEqual(amax(xd, c.dims, keep), amax(x, c.dims, keep), label(c, dt, keep, "amax"));
          expectBitEqual(amin(xd, c.dims, keep), amin(x, c.dims, keep), label(c, dt, keep, "amin"));
          if (dt != DType::Bool) {
            Tensor s = sum(xd, c.dims, keep);
            EXPECT_EQ(s.dtype(), isFloating(dt) ? dt : DType::Int64);
            if (!isFloating(dt)) expectBitEqual(s, sum(x, c.dims, keep), label(c, dt, keep, "integer sum"));
          }
          const int64_t nd = x.dim();
          for (int64_t d = 0; d < std::max<int64_t>(nd, 1); ++d) {
            auto [v, i] = max(xd, d, keep);
            auto [vc, ic] = max(x, d, keep);
            expectBitEqual(v, vc, label(c, dt, keep, fmt::format("max values dim {}", d)));
            expectBitEqual(i, ic, label(c, dt, keep, fmt::format("max indices dim {}", d)));
            auto [w, j] = min(xd, d, keep);
            auto [wc, jc] = min(x, d, keep);
            expectBitEqual(w, wc, label(c, dt, keep, fmt::format("min values dim {}", d)));
            expectBitEqual(j, jc, label(c, dt, keep, fmt::format("min indices dim {}", d)));
            expectBitEqual(argmax(xd, d, keep), argmax(x, d, keep), label(c, dt, keep, "argmax"));
            expectBitEqual(argmin(xd, d, keep), argmin(x, d, keep), label(c, dt, keep, "argmin"));
          }
          expectBitEqual(argmax(xd, std::nullopt, keep), argmax(x, std::nullopt, keep),
                         label(c, dt, keep, "argmax all"));
          expectBitEqual(argmin(xd, std::nullopt, keep), argmin(x, std::nullopt, keep),
                         label(c, dt, keep, "argmin all"));
        }
      }
    }
  }
}

TEST(CudaReduce, IntegerSumsAreExactInt64) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kIntTypes) {
    Tensor x = values({5, 4097}, dt);
    Tensor s = sum(cuda(x), {1});
    EXPECT_EQ(s.dtype(), DType::Int64);
    expectBitEqual(s, sum(x, {1}), fmt::format("{} sum", dt));
    expectBitEqual(sum(cuda(x)), sum(x), fmt::format("{} sum all", dt));
  }
}

TEST(CudaReduce, NaNAndInfinityPropagateAsOnTheCpu) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    Tensor x = values({6, 300}, dt);
    {
      autograd::NoGradGuard ng;
      x.narrow(0, 1, 1).narrow(1, 17, 1).fill_(std::numeric_limits<double>::quiet_NaN());
      x.narrow(0, 1, 1).narrow(1, 200, 1).fill_(std::numeric_limits<double>::quiet_NaN());
      x.narrow(0, 2, 1).narrow(1, 5, 1).fill_(INFINITY);
      x.narrow(0, 3, 1).fill_(-INFINITY);
    }
    Tensor xd = cuda(x);
    for (int64_t d : {0, 1}) {
      expectBitEqual(amax(xd, {d}), amax(x, {d}), fmt::format("{} amax dim {}", dt, d));
      expectBitEqual(amin(xd, {d}), amin(x, {d}), fmt::format("{} amin dim {}", dt, d));
      expectBitEqual(argmax(xd, d), argmax(x, d), fmt::format("{} argmax dim {}", dt, d));
      expectBitEqual(argmin(xd, d), argmin(x, d), fmt::format("{} argmin dim {}", dt, d));
      expectBitEqual(max(xd, d).first, max(x, d).first, fmt::format("{} max dim {}", dt, d));
      Tol t = sumTol(dt, 300);
      expectClose(sum(xd, {d}), sum(x, {d}), t.atol, t.rtol, fmt::format("{} sum with NaN/inf", dt));
    }
  }
}

TEST(CudaReduce, NonContiguousInputs) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    Tensor base = values({40, 33, 9}, dt);
    Tensor bd = cuda(base);
    const std::vector<std::function<Tensor(const Tensor&)>> views = {
        [](const Tensor& t) { return t.transpose(0, 2); },
        [](const Tensor& t) { return t.slice(1, 3, 30, 2); },
        [](const Tensor& t) { return t.narrow(0, 1, 7).transpose(1, 2); },
        [](const Tensor& t) {
          return t.slice(0, 0, 40, 3).expand({3, 14, 33, 9});
        },
    };
    for (size_t k = 0; k < views.size(); ++k) {
      Tensor x = views[k](base), xd = views[k](bd);
      for (const Shape& dims : {Shape{0}, Shape{1}, Shape{-1}, Shape{0, 2}, Shape{}}) {
        Tol t = sumTol(dt, x.numel());
        std::string what = fmt::format("{} view {} over {}", dt, k, shapeStr(dims));
        expectClose(sum(xd, dims), sum(x, dims), t.atol, t.rtol, "sum " + what);
        expectBitEqual(amax(xd, dims, true), amax(x, dims, true), "amax " + what);
      }
      expectBitEqual(argmax(xd, 1), argmax(x, 1), fmt::format("{} argmax view {}", dt, k));
    }
  }
}

TEST(CudaReduce, EmptyAndZeroDimMatchTheCpu) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (const Shape& s : {Shape{0, 5}, Shape{5, 0}, Shape{0}}) {
      Tensor x = values(s, dt), xd = cuda(x);
      for (const Shape& dims : {Shape{0}, Shape{}, Shape{-1}}) {
        std::string what = fmt::format("{} {} over {}", dt, shapeStr(s), shapeStr(dims));
        expectBitEqual(sum(xd, dims), sum(x, dims), "sum " + what);
        expectClose(mean(xd, dims), mean(x, dims), 0, 0, "mean " + what);  // NaN where the CPU has NaN
        expectClose(var(xd, dims), var(x, dims), 0, 0, "var " + what);
        expectBitEqual(norm(xd, INFINITY, dims), norm(x, INFINITY, dims), "norm inf " + what);
        // The same typed error as the CPU for reductions without an identity.
        const bool emptyReduced =
            x.numel() == 0 &&
            (dims.empty() ||
             s[static_cast<size_t>(dims[0] < 0 ? dims[0] + static_cast<int64_t>(s.size()) : dims[0])] == 0);
        if (emptyReduced) {
          std::string cpuMsg = testing::messageOf<ValueError>([&] { amax(x, dims); });
          std::string gpuMsg = testing::messageOf<ValueError>([&] { amax(xd, dims); });
          EXPECT_EQ(gpuMsg, cpuMsg) << what;
          EXPECT_EQ(
              testing::messageOf<ValueError>([&] { argmax(xd, dims.empty() ? std::optional<int64_t>() : dims[0]); }),
              testing::messageOf<ValueError>([&] { argmax(x, dims.empty() ? std::optional<int64_t>() : dims[0]); }))
              << what;
          EXPECT_EQ(testing::messageOf<ValueError>([&] { norm(xd, -INFINITY, dims); }),
                    testing::messageOf<ValueError>([&] { norm(x, -INFINITY, dims); }))
              << what;
        }
      }
    }
    Tensor s0 = values({}, dt), sd = cuda(s0);
    expectBitEqual(sum(sd), sum(s0), fmt::format("{} 0-dim sum", dt));
    expectBitEqual(amax(sd, {0}, true), amax(s0, {0}, true), fmt::format("{} 0-dim amax", dt));
    expectBitEqual(argmax(sd), argmax(s0), fmt::format("{} 0-dim argmax", dt));
    expectBitEqual(max(sd, 0).second, max(s0, 0).second, fmt::format("{} 0-dim max", dt));
    expectClose(var(sd, {}, 0), var(s0, {}, 0), 0, 0, fmt::format("{} 0-dim var", dt));
  }
}

TEST(CudaReduce, BadDimsGiveTheCpuErrors) {
  COHORT_REQUIRE_GPU();
  Tensor x = values({3, 4}, DType::Float32), xd = cuda(x);
  EXPECT_EQ(testing::messageOf<IndexError>([&] { sum(xd, {2}); }),
            testing::messageOf<IndexError>([&] { sum(x, {2}); }));
  EXPECT_EQ(testing::messageOf<ValueError>([&] {
              sum(xd, {1, -1});
            }),
            testing::messageOf<ValueError>([&] {
              sum(x, {1, -1});
            }));
  EXPECT_EQ(testing::messageOf<ValueError>([&] { var(xd, {1}, -1); }),
            testing::messageOf<ValueError>([&] { var(x, {1}, -1); }));
}

// ---- gradients ------------------------------------------------------------------------------------

// Runs f on a CPU leaf and on a CUDA copy of it, backpropagates sum(f(x) * w) on both (w fixed
// random weights) and compares the outputs and the leaves' gradients.
void compareGrad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x0, Tol fwd, Tol bwd,
                 const std::string& what, bool bitExactGrad = false) {
  Tensor xc = x0.detach().clone();
  xc.setRequiresGrad(true);
  Tensor xg = cuda(x0.detach());
  xg.setRequiresGrad(true);
  Tensor yc = f(xc), yg = f(xg);
  expectClose(yg, yc, fwd.atol, fwd.rtol, what + " forward");
  Generator g(11);
  Tensor w = rand(yc.sizes(), {}, &g).to(yc.dtype());
  (yc * w).sum().backward();
  (yg * cuda(w)).sum().backward();
  ASSERT_TRUE(xg.grad().defined()) << what;
  EXPECT_TRUE(xg.grad().device().isCuda()) << what;
  if (bitExactGrad) expectBitEqual(xg.grad(), xc.grad(), what + " grad");
  else expectClose(xg.grad(), xc.grad(), bwd.atol, bwd.rtol, what + " grad");
}

TEST(CudaReduce, GradientsMatchTheCpu) {
  COHORT_REQUIRE_GPU();
  const std::vector<Case> cases = {{{7, 1000}, {1}}, {{4097, 7}, {0}}, {{3, 33, 5}, {0, 2}}, {{1000}, {}}, {{}, {}}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      Tensor x = values(c.shape, dt);
      const int64_t n = reducedCount(c);
      Tol s = sumTol(dt, n), e = sumTol(dt, 1);
      Tol g{e.atol + 1e-6, e.rtol * 4};  // gradients: a few roundings of the result's type
      auto L = [&](const std::string& op) { return label(c, dt, false, op); };
      compareGrad([&](const Tensor& t) { return sum(t, c.dims); }, x, s, g, L("sum"), true);
      compareGrad([&](const Tensor& t) { return mean(t, c.dims, true); }, x, {s.atol / n, s.rtol}, g, L("mean"));
      compareGrad([&](const Tensor& t) { return var(t, c.dims); }, x, e, {g.atol * 10, g.rtol * 10}, L("var"));
      compareGrad([&](const Tensor& t) { return std(t, c.dims, 1, true); }, x, e, {g.atol * 10, g.rtol * 10}, L("std"));
      compareGrad([&](const Tensor& t) { return norm(t, 2, c.dims); }, x, s, {g.atol * 10, g.rtol * 10}, L("norm 2"));
      compareGrad([&](const Tensor& t) { return norm(t, 3, c.dims); }, x, s, {g.atol * 10, g.rtol * 10}, L("norm 3"));
      compareGrad([&](const Tensor& t) { return norm(t, 1, c.dims); }, x, s, g, L("norm 1"));
      // Ties split the gradient evenly: tied inputs exercise the hit counting.
      Tensor xt = tied(c.shape, dt);
      compareGrad([&](const Tensor& t) { return amax(t, c.dims); }, xt, {0, 0}, g, L("amax"));
      compareGrad([&](const Tensor& t) { return amin(t, c.dims, true); }, xt, {0, 0}, g, L("amin"));
      compareGrad([&](const Tensor& t) { return norm(t, INFINITY, c.dims); }, xt, {0, 0}, g, L("norm inf"));
      if (x.dim() > 0) {
        compareGrad([&](const Tensor& t) { return max(t, 0).first; }, xt, {0, 0}, {0, 0}, L("max dim 0"), true);
        compareGrad([&](const Tensor& t) { return min(t, -1, true).first; }, xt, {0, 0}, {0, 0}, L("min dim -1"), true);
      }
    }
  }
}

TEST(CudaReduce, Float64GradcheckOnTheDevice) {
  COHORT_REQUIRE_GPU();
  auto onDevice = [](std::function<Tensor(const Tensor&)> f) {
    return [f](const std::vector<Tensor>& in) { return f(cuda(in[0])).to(Device::cpu()); };
  };
  const Shape s = {3, 4, 5};
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return sum(t, {0, 2}); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return mean(t, {1}, true); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return var(t, {2}); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return std(t, {0, 1}); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return norm(t, 3, {1}); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return amax(t, {2}); }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return max(t, 1).first; }), {testing::randArg(s)}));
  EXPECT_TRUE(testing::gradcheck(onDevice([](const Tensor& t) { return norm(t.transpose(0, 2), 2, {0}); }),
                                 {testing::randArg(s)}));
}

// ---- without a GPU --------------------------------------------------------------------------------

TEST(CudaReduce, KernelsAreRegisteredInCudaBuilds) {
  std::vector<std::string> ops = dispatch::opsWithKernels(DeviceType::CUDA);
  auto has = [&](const std::string& op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA kernels";
  for (const char* op : {"sum", "mean", "amax", "amin", "norm", "var", "std", "max", "min", "argmax", "argmin",
                         "max backward", "reduce backward"})
    EXPECT_TRUE(has(op)) << op;
}

}  // namespace
}  // namespace cohort
