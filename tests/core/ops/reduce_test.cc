// Reductions: values against PyTorch, gradients by finite differences (float64), dtype rules,
// empty and 0-dim tensors, and typed errors for bad dims.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <cohort/cohort.h>

#include "core/gradcheck.h"

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::testing;
using cohort::testing::gradcheck;
using cohort::testing::randArg;

namespace {

// x = round(3 * sin(1.3 * arange(24)), 4).reshape(2, 3, 4) with x[1, 2, 3] = x[1, 2, 0] (a tie).
// Every expected value in this file marked "torch" was printed by /usr/bin/python3 (torch 1.13)
// from this tensor, e.g. x.sum((0, 2)), x.var(1), torch.linalg.vector_norm(x, 3, (0, 2)).
const std::vector<double> kX = {0.0,     2.8907,  1.5465,  -2.0633, -2.6504, 0.6454,  2.9956,  0.9573,
                                -2.4835, -2.286,  1.2605,  2.9603,  0.3233,  -2.7874, -1.8145, 1.8166,
                                2.7864,  -0.3259, -2.9607, -1.2581, 2.2877,  2.482,   -0.9598, 2.2877};

Tensor X(DType dt = DType::Float64) { return fromVector<double>(kX, {2, 3, 4}).to(dt); }

}  // namespace

// ---- values vs torch ------------------------------------------------------------------------

TEST(Reduce, SumMeanValues) {
  Tensor x = X();
  expectNear(sum(x, {0, 2}), {-0.0881, 0.1896, 5.5489});  // torch
  Tensor m = mean(x, {1}, true);
  EXPECT_EQ(m.sizes(), (Shape{2, 1, 4}));
  expectNear(m, {-1.7113, 0.4167, 1.9342, 0.6181, 1.799133333333, -0.210433333333, -1.911666666667,
                 0.948733333333});  // torch
  EXPECT_NEAR(sum(x).item<double>(), 5.6504, 1e-12);
  // Negative and out-of-order dims name the same reduction.
  expectNear(sum(x, {-1, 0}), sum(x, {0, 2}).toVector<double>());
}

TEST(Reduce, AmaxAminValues) {
  Tensor x = X();
  expectNear(amax(x, {0, 2}), {2.8907, 2.9956, 2.9603});                              // torch
  expectNear(amin(x, {-1}), {-2.0633, -2.6504, -2.4835, -2.7874, -2.9607, -0.9598});  // torch
  EXPECT_EQ(amax(x, {0, 2}, true).sizes(), (Shape{1, 3, 1}));
  EXPECT_DOUBLE_EQ(x.max().item<double>(), 2.9956);
  EXPECT_DOUBLE_EQ(x.min().item<double>(), -2.9607);
  // Integer and bool inputs keep their dtype.
  Tensor xi = fromVector<int32_t>({3, -7, 5, 9, 0, -2}, {2, 3});
  EXPECT_EQ(amax(xi, {1}).dtype(), DType::Int32);
  EXPECT_EQ(amax(xi, {1}).toVector<int32_t>(), (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(amin(xi, {0}).toVector<int32_t>(), (std::vector<int32_t>{3, -7, -2}));
  Tensor b = fromVector<bool>({false, true, false, false}, {2, 2});
  EXPECT_EQ(amax(b, {1}).toVector<bool>(), (std::vector<bool>{true, false}));
  // NaN propagates, as in torch.
  Tensor n = fromVector<float>({1, NAN, 3, 2}, {2, 2});
  EXPECT_TRUE(std::isnan(amax(n, {1}).toVector<float>()[0]));
  EXPECT_EQ(amax(n, {1}).toVector<float>()[1], 3.0f);
}

TEST(Reduce, MaxMinDimAndArgmax) {
  Tensor x = X();
  auto [v, i] = max(x, 1);
  EXPECT_EQ(i.dtype(), DType::Int64);
  expectNear(v, {0.0, 2.8907, 2.9956, 2.9603, 2.7864, 2.482, -0.9598, 2.2877});  // torch
  EXPECT_EQ(i.toVector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 2, 1, 2, 2, 2}));
  auto [v2, i2] = min(x, 2);
  expectNear(v2, {-2.0633, -2.6504, -2.4835, -2.7874, -2.9607, -0.9598});  // torch
  EXPECT_EQ(i2.toVector<int64_t>(), (std::vector<int64_t>{3, 0, 0, 1, 2, 2}));
  auto [v3, i3] = x.max(-1, true);
  EXPECT_EQ(v3.sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(i3.sizes(), (Shape{2, 3, 1}));
  // Ties give the first index, as torch: [[1, 3, 3], [2, -1, 2]].max(1) -> indices [1, 0].
  Tensor t = fromVector<float>({1, 3, 3, 2, -1, 2}, {2, 3});
  EXPECT_EQ(max(t, 1).second.toVector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(min(t, 0).second.toVector<int64_t>(), (std::vector<int64_t>{0, 1, 1}));
  // argmax / argmin: flattened or over a dim.
  EXPECT_EQ(argmax(x).item<int64_t>(), 6);  // torch
  EXPECT_EQ(x.argmax().dim(), 0);
  EXPECT_EQ(argmin(x, 0).toVector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1}));  // torch
  EXPECT_EQ(argmax(x, std::nullopt, true).sizes(), (Shape{1, 1, 1}));
  EXPECT_EQ(argmax(x, 2, true).sizes(), (Shape{2, 3, 1}));
  // Integer inputs.
  Tensor xi = fromVector<int64_t>({4, 8, 8, -1}, {2, 2});
  EXPECT_EQ(argmax(xi, 1).toVector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(max(xi, 0).first.toVector<int64_t>(), (std::vector<int64_t>{8, 8}));
}

TEST(Reduce, VarStdValues) {
  Tensor x = X();
  expectNear(var(x, {1}), {2.20337467, 6.73878349, 0.86537647, 6.39543172, 1.695738443333, 6.951643503333,
                           1.007981223333, 3.708068823333});  // torch
  expectNear(var(x, {}, 0), {4.291074068056});                // torch: x.var(unbiased=False)
  Tensor s = x.std({0, 2}, 1, true);
  EXPECT_EQ(s.sizes(), (Shape{1, 3, 1}));
  expectNear(s, {2.051849788736, 2.253426163487, 2.250260328075});  // torch
  // One element with correction 1: NaN, as torch.
  EXPECT_TRUE(std::isnan(var(fromVector<double>({2.0})).item<double>()));
  // float32 over a large row stays accurate (two-pass).
  // A constant float32 row far from 0: a one-pass E[x^2] - E[x]^2 would cancel badly.
  Tensor big = full({100000}, 1e4 + 0.5, {.dtype = DType::Float32});
  EXPECT_EQ(var(big).item<double>(), 0.0);
}

TEST(Reduce, NormValues) {
  Tensor x = X();
  expectNear(norm(x, 2, {2}), {3.873630807137, 4.163076262813, 4.663239709687, 3.803494111998, 4.268348143017,
                               4.189114777611});  // torch.linalg.vector_norm(x, 2, (2,))
  expectNear(norm(x, 1), {44.8296});              // torch
  const double inf = std::numeric_limits<double>::infinity();
  expectNear(norm(x, inf, {1}), {2.6504, 2.8907, 2.9956, 2.9603, 2.7864, 2.7874, 2.9607, 2.2877});  // torch
  expectNear(norm(x, -inf), {0.0});                                                                 // torch
  expectNear(norm(x, 3, {0, 2}), {4.127113737829, 4.582954057287, 4.568157560298});                 // torch
  expectNear(norm(x, 0.5, {1}), {10.26508637354, 16.124450348277, 16.786094141106, 17.101437920095, 14.065204262221,
                                 14.560816573064, 16.381415051218, 15.856149394793});  // torch
  expectNear(norm(x, 0), {23.0});                                                      // torch: the count of non-zeros
  EXPECT_EQ(x.norm(2, {0}, true).sizes(), (Shape{1, 3, 4}));
}

// ---- dtype behaviour ------------------------------------------------------------------------

TEST(Reduce, DTypes) {
  Tensor xi = fromVector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sum(xi).dtype(), DType::Int64);
  EXPECT_EQ(sum(xi, {0}).toVector<int64_t>(), (std::vector<int64_t>{5, 7, 9}));
  Tensor xb = fromVector<bool>({true, true, false, true});
  EXPECT_EQ(sum(xb).dtype(), DType::Int64);
  EXPECT_EQ(sum(xb).item<int64_t>(), 3);
  Tensor xu = full({300}, 200, {.dtype = DType::UInt8});
  EXPECT_EQ(sum(xu).item<int64_t>(), 60000);  // no uint8 overflow
  EXPECT_THROW(mean(xi), ValueError);
  EXPECT_THROW(var(xi), ValueError);
  EXPECT_THROW(norm(xi), ValueError);
  // Half types accumulate in float: 4096 ones sum exactly (a float16 accumulator stops at 2048),
  // and the result keeps the input dtype.
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor h = ones({4096}, {.dtype = dt});
    EXPECT_EQ(sum(h).dtype(), dt);
    EXPECT_EQ(sum(h).item<double>(), 4096.0);
    EXPECT_EQ(mean(h).item<double>(), 1.0);
    Tensor h2 = ones({4000, 4}, {.dtype = dt});  // an outer reduction; 4000 is exact in both half types
    EXPECT_EQ(sum(h2, {0}).to(DType::Float32).toVector<float>(), (std::vector<float>{4000, 4000, 4000, 4000}));
    expectNear(var(X(dt), {1}), var(X(dt).to(DType::Float32), {1}).toVector<double>(), 1e-2);
    expectNear(norm(X(dt), 2, {2}), norm(X(dt).to(DType::Float32), 2, {2}).toVector<double>(), 1e-2);
  }
}

// Accuracy and layout coverage of the vectorized paths: every shape of [outer, reduced, inner]
// (narrow, wide, tiled columns, rows longer than a lane block) against a double reference.
TEST(Reduce, KernelPathsMatchReference) {
  Generator g(3);
  for (Shape shape :
       {Shape{1000, 3}, Shape{7, 2500}, Shape{5000, 17}, Shape{3, 2100, 5}, Shape{37, 1100}, Shape{9000}}) {
    Tensor x32 = rand(shape, {.dtype = DType::Float32}, &g);
    Tensor x64 = x32.to(DType::Float64);
    for (int64_t d = 0; d < x32.dim(); ++d) {
      expectNear(sum(x32, {d}), sum(x64, {d}).toVector<double>(), 1e-5);
      expectNear(mean(x32, {d}), mean(x64, {d}).toVector<double>(), 1e-5);
      expectNear(amax(x32, {d}), amax(x64, {d}).toVector<double>(), 0);
      expectNear(amin(x32, {d}), amin(x64, {d}).toVector<double>(), 0);
      expectNear(norm(x32, 2, {d}), norm(x64, 2, {d}).toVector<double>(), 1e-5);
    }
  }
  // Half types (converted to float in blocks, F16C for float16) over the same layouts, tails included.
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    for (Shape shape : {Shape{37, 1100}, Shape{1000, 3}, Shape{5001}, Shape{3, 70, 4100}}) {
      Tensor xh = rand(shape, {.dtype = dt}, &g);
      Tensor x64 = xh.to(DType::Float64);
      for (int64_t d = 0; d < xh.dim(); ++d) {
        expectNear(sum(xh, {d}), sum(x64, {d}).toVector<double>(), 8e-3);
        expectNear(amax(xh, {d}), amax(x64, {d}).toVector<double>(), 0);
      }
    }
  }
  // A large float32 sum stays accurate: 2^24 + 1 ones would saturate a plain float accumulator.
  Tensor big = ones({(1 << 24) + 8}, {.dtype = DType::Float32});
  EXPECT_EQ(sum(big).item<double>(), static_cast<double>((1 << 24) + 8));
  Tensor col = ones({(1 << 22) + 3, 2}, {.dtype = DType::Float32});
  EXPECT_EQ(sum(col, {0}).toVector<float>(), (std::vector<float>{(1 << 22) + 3, (1 << 22) + 3}));
}

// var/std rows along the last dim (the blocked float32 kernel): against a float64 reference on
// data with a large mean, where a naive one-pass sum of squares in float would lose every digit.
TEST(Reduce, VarStdRowKernelLargeMean) {
  Generator g(21);
  for (Shape shape : {Shape{(1 << 20) + 77}, Shape{3, 9000}, Shape{5, 300}, Shape{2, 4096}}) {
    Tensor x32 = randn(shape, {.dtype = DType::Float32}, &g) + 1e4;
    Tensor x64 = x32.to(DType::Float64);  // the same float32 values, reduced in double
    const int64_t last = x32.dim() - 1;
    for (int64_t correction : {0, 1}) {
      std::vector<double> want = var(x64, {last}, correction).toVector<double>();
      std::vector<float> got = var(x32, {last}, correction).toVector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6 * want[i]) << i;
      std::vector<double> wantS = cohort::std(x64, {last}, correction).toVector<double>();
      std::vector<float> gotS = cohort::std(x32, {last}, correction).toVector<float>();
      for (size_t i = 0; i < gotS.size(); ++i) EXPECT_NEAR(gotS[i], wantS[i], 2e-6 * wantS[i]) << i;
    }
    EXPECT_NEAR(var(x32).item<double>(), var(x64).item<double>(), 2e-6 * var(x64).item<double>());
  }
  // Blocks with very different means (Chan's merge): half the row at 0, half at 1e4.
  std::vector<float> v(20000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i < v.size() / 2 ? 0.0f : 1e4f) + static_cast<float>(i % 7);
  Tensor steps = fromVector(v, {static_cast<int64_t>(v.size())});
  EXPECT_NEAR(var(steps).item<double>(), var(steps.to(DType::Float64)).item<double>(), 1e-6 * 2.5e7);
  // Overflowing float sums fall back to double; inf and NaN give NaN, as torch.
  Tensor huge = full({5000}, 3e37, {.dtype = DType::Float32});
  huge.narrow(0, 0, 2500).fill_(-3e37);
  EXPECT_TRUE(std::isinf(var(huge).item<float>()));  // 9e74 does not fit a float
  EXPECT_NEAR(cohort::std(huge).item<double>() / 3e37, std::sqrt(5000.0 / 4999.0), 1e-6);
  Tensor withInf = zeros({1000}, {.dtype = DType::Float32});
  withInf.narrow(0, 600, 1).fill_(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(var(withInf).item<float>()));
  Tensor withNaN = zeros({1000}, {.dtype = DType::Float32});
  withNaN.narrow(0, 999, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(var(withNaN).item<float>()));
  // Half types through the same kernel.
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor xh = (randn({4, 5000}, {.dtype = DType::Float32}, &g) * 3 + 100).to(dt);
    expectNear(var(xh, {1}), var(xh.to(DType::Float64), {1}).toVector<double>(), 0.02);
  }
}

// max/min/argmax along the last dim (the blocked contiguous kernel): the first extreme index,
// the first NaN, ties across blocks, against the general strided loop (the same data transposed).
TEST(Reduce, MaxMinLastDimKernel) {
  Generator g(5);
  for (Shape shape : {Shape{6, 10000}, Shape{4096, 130}, Shape{3, 4096}, Shape{2, 129}}) {
    Tensor x = randint(0, 50, shape, {.dtype = DType::Float32}, &g);  // many ties
    Tensor xt = x.t().contiguous().t();                               // same values, strided rows
    auto [mv, mi] = max(x, 1);
    auto [mvt, mit] = max(xt, 1);
    EXPECT_EQ(mi.toVector<int64_t>(), mit.toVector<int64_t>());
    EXPECT_EQ(mv.toVector<float>(), mvt.toVector<float>());
    auto [nv, ni] = min(x, 1);
    auto [nvt, nit] = min(xt, 1);
    EXPECT_EQ(ni.toVector<int64_t>(), nit.toVector<int64_t>());
    EXPECT_EQ(nv.toVector<float>(), nvt.toVector<float>());
    EXPECT_EQ(argmax(x, 1).toVector<int64_t>(), mit.toVector<int64_t>());
    EXPECT_EQ(argmin(x, 1).toVector<int64_t>(), nit.toVector<int64_t>());
    // First occurrence: every index returned holds the extreme and no earlier element does.
    std::vector<float> xv = x.toVector<float>();
    std::vector<int64_t> idx = mi.toVector<int64_t>();
    const int64_t R = shape[1];
    for (int64_t o = 0; o < shape[0]; ++o)
      for (int64_t r = 0; r < idx[o]; ++r) ASSERT_LT(xv[o * R + r], xv[o * R + idx[o]]);
  }
  // The maximum sits in a later block and equals an element of an earlier block: the first wins.
  std::vector<float> v(12000, 0.0f);
  v[100] = 5.0f;
  v[9000] = 5.0f;
  v[11999] = -1.0f;
  Tensor t = fromVector(v, {1, 12000});
  EXPECT_EQ(max(t, 1).second.item<int64_t>(), 100);
  EXPECT_EQ(argmin(t, 1).item<int64_t>(), 11999);
  EXPECT_EQ(argmax(fromVector(v, {12000})).item<int64_t>(), 100);
  // NaN counts as the extreme: the first NaN, for max and for min, even after a larger value.
  v[7000] = std::numeric_limits<float>::quiet_NaN();
  v[8000] = std::numeric_limits<float>::quiet_NaN();
  t = fromVector(v, {1, 12000});
  EXPECT_EQ(max(t, 1).second.item<int64_t>(), 7000);
  EXPECT_TRUE(std::isnan(max(t, 1).first.item<float>()));
  EXPECT_EQ(min(t, 1).second.item<int64_t>(), 7000);
  // -inf everywhere but one element; +inf as the max.
  std::vector<float> w(300, -std::numeric_limits<float>::infinity());
  w[299] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(argmax(fromVector(w, {1, 300}), 1).item<int64_t>(), 299);
  EXPECT_EQ(argmin(fromVector(w, {1, 300}), 1).item<int64_t>(), 0);
  // Other dtypes through the same kernel.
  for (DType dt : {DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32, DType::UInt8}) {
    Tensor x = randint(0, 100, {5, 5000}, {.dtype = DType::Float32}, &g);
    Tensor xd = x.to(dt);
    EXPECT_EQ(max(xd, 1).second.toVector<int64_t>(), max(x, 1).second.toVector<int64_t>()) << dtypeName(dt);
    EXPECT_EQ(argmin(xd, 1).toVector<int64_t>(), argmin(x, 1).toVector<int64_t>()) << dtypeName(dt);
  }
}

// ---- empty and 0-dim ------------------------------------------------------------------------

TEST(Reduce, EmptyAndScalar) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e, {0}).toVector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(sum(e, {1}).sizes(), (Shape{0}));
  EXPECT_EQ(sum(e).item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(mean(e).item<float>()));
  EXPECT_EQ(norm(e).item<float>(), 0.0f);
  EXPECT_EQ(amax(e, {1}).sizes(), (Shape{0}));  // nothing reduced over an empty dim
  expectError<ValueError>([&] { amax(e, {0}); }, {"amax", "[0, 3]"});
  expectError<ValueError>([&] { max(e, 0); }, {"max", "[0, 3]"});
  expectError<ValueError>([&] { argmax(e); }, {"argmax"});

  Tensor s = scalarTensor(2.5, {.dtype = DType::Float64});
  EXPECT_EQ(sum(s).dim(), 0);
  EXPECT_EQ(sum(s, {0}).item<double>(), 2.5);
  EXPECT_EQ(mean(s, {-1}, true).dim(), 0);
  EXPECT_EQ(amax(s).item<double>(), 2.5);
  auto [v, i] = max(s, 0);
  EXPECT_EQ(v.item<double>(), 2.5);
  EXPECT_EQ(i.item<int64_t>(), 0);
  EXPECT_EQ(argmin(s).item<int64_t>(), 0);
  EXPECT_EQ(var(s, {}, 0).item<double>(), 0.0);
  EXPECT_EQ(norm(scalarTensor(-3.0, {.dtype = DType::Float64})).item<double>(), 3.0);
  EXPECT_THROW(sum(s, {1}), IndexError);
}

// ---- bad inputs ---------------------------------------------------------------------------

TEST(Reduce, BadDims) {
  Tensor x = X();
  expectError<IndexError>([&] { sum(x, {3}); }, {"sum", "dim 3", "[2, 3, 4]"});
  expectError<IndexError>([&] { amax(x, {-4}); }, {"amax", "-4", "[2, 3, 4]"});
  expectError<ValueError>([&] { sum(x, {1, -2}); }, {"sum", "more than once", "[2, 3, 4]"});
  expectError<ValueError>([&] { var(x, {0, 0}); }, {"var", "more than once"});
  expectError<IndexError>([&] { max(x, 5); }, {"max", "[2, 3, 4]"});
  expectError<IndexError>([&] { argmin(x, -9); }, {"argmin"});
  expectError<ValueError>([&] { var(x, {}, -1); }, {"var", "correction"});
  expectError<ValueError>([&] { mean(fromVector<int64_t>({1, 2})); }, {"mean", "int64"});
  EXPECT_THROW(sum(Tensor()), ValueError);
}

// ---- gradients ------------------------------------------------------------------------------

TEST(ReduceGrad, SumMean) {
  Tensor a = randArg({3, 4, 5});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mean(in[0], {1}, true); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mean(in[0]); }, {a}));
  // Non-contiguous inputs: transposed, sliced, expanded.
  Tensor b = randArg({4, 6}, 11);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return sum(in[0].t(), {1}); }, {b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return mean(in[0].slice(1, 0, 6, 2), {0}); }, {b}));
  Tensor c = randArg({1, 5}, 12);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return sum(in[0].expand({3, 5}), {1}); }, {c}));
}

TEST(ReduceGrad, AmaxAminMaxMin) {
  Tensor a = randArg({3, 4, 5}, 21);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return amax(in[0], {0, 2}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return amin(in[0], {1}, true); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return max(in[0], 1).first; }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return min(in[0].transpose(0, 2), 0, true).first; }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return amax(in[0].t()); }, {randArg({4, 6}, 22)}));
}

TEST(ReduceGrad, TiesFollowTorch) {
  // torch: x = [[1, 3, 3], [2, -1, 2]]; x.amax().backward() -> [[0, .5, .5], [0, 0, 0]];
  // x.max(1)[0].sum().backward() -> [[0, 1, 0], [1, 0, 0]].
  Tensor x = fromVector<double>({1, 3, 3, 2, -1, 2}, {2, 3}).setRequiresGrad();
  amax(x).backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0, 0.5, 0.5, 0, 0, 0}));
  x.setGrad(Tensor());
  max(x, 1).first.sum().backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0, 1, 0, 1, 0, 0}));
  x.setGrad(Tensor());
  amin(x, {1}).sum().backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{1, 0, 0, 0, 1, 0}));
  // Ties across separate rows of a non-adjacent reduction share evenly over the whole group.
  Tensor y = fromVector<double>({5, 1, 2, 7, 5, 5, 0, 0}, {2, 2, 2}).setRequiresGrad();
  amax(y, {0, 2}).sum().backward();
  expectNear(y.grad(), {1.0 / 3, 0, 0, 1, 1.0 / 3, 1.0 / 3, 0, 0});
}

TEST(ReduceGrad, VarStd) {
  Tensor a = randArg({3, 4, 5}, 31);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {1}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {0, 2}, 0, true); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return cohort::std(in[0], {2}, 1, true); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return cohort::std(in[0]); }, {a}));
  Tensor b = randArg({5, 4}, 32);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return cohort::std(in[0].t(), {1}); }, {b}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return var(in[0].slice(0, 1, 5, 2), {0}); }, {b}));
}

TEST(ReduceGrad, Norm) {
  Tensor a = randArg({3, 4, 5}, 41);
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {2.0, 1.0, 3.0, 1.5, inf, -inf}) {
    EXPECT_TRUE(gradcheck([p](const std::vector<Tensor>& in) { return norm(in[0], p, {0, 2}); }, {a})) << "p=" << p;
    EXPECT_TRUE(
        gradcheck([p](const std::vector<Tensor>& in) { return norm(in[0].transpose(1, 2), p, {1}, true); }, {a}))
        << "p=" << p;
  }
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return norm(in[0]); }, {a}));
  // A zero vector has a zero subgradient for p = 2 (torch).
  Tensor z = zeros({3}, {.dtype = DType::Float64}).setRequiresGrad();
  norm(z).backward();
  EXPECT_EQ(z.grad().toVector<double>(), (std::vector<double>{0, 0, 0}));
}
