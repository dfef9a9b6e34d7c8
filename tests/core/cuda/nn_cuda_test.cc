// Normalisation and losses on a GPU against the CPU on the same inputs: softmax / log_softmax over
// every dim (forward and backward), nll and cross-entropy (ignoreIndex, every reduction, label
// smoothing, int32 and int64 targets, [N, C] and [N, C, d] inputs), layer norm with and without
// weight and bias (forward, saved statistics, and all three gradients), and mse. Odd sizes (1, 7,
// 1000, 4097), rows long enough for the block-per-row kernels and enough rows to split the
// parameter-gradient sums; every float dtype; empty inputs; float64 finite-difference checks of the
// device gradients; the CPU's errors for bad labels. conv2d (strides, padding, dilation, groups)
// and max/avg pooling, forward and backward.
//
// Tolerances. Both devices compute elementwise steps in the same order and precision (float for
// half types) and accumulate row sums in double; they differ through the summation order and
// CUDA's expf/logf (within 2 ulp of the CPU's). float32: rtol 1e-5 (softmax, losses, layer norm
// outputs), 1e-4 for gradients; float64: 1e-11; float16 / bfloat16 outputs: two units in the
// last place (rtol 2^-9 / 2^-6) with a small absolute floor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <cohort/core/ops/dispatch.h>
#include <cohort/core/ops/functional.h>

#include "core/cuda/cuda_test_util.h"
#include "core/gradcheck.h"
#include "core/test_util.h"

namespace cohort {
namespace {

namespace F = nn::functional;

using testing::kFloatTypes;
using testing::values;

using testing::expectClose;

struct Tol {
  double atol, rtol;
};
Tol outTol(DType dt) {
  switch (dt) {
    case DType::Float64: return {1e-12, 1e-11};
    case DType::Float16: return {1e-4, 1.0 / 512};
    case DType::BFloat16: return {1e-3, 1.0 / 64};
    default: return {1e-6, 1e-5};
  }
}
Tol gradTol(DType dt) {
  switch (dt) {
    case DType::Float64: return {1e-11, 1e-10};
    case DType::Float16: return {1e-3, 1.0 / 256};
    case DType::BFloat16: return {1e-2, 1.0 / 32};
    default: return {1e-5, 1e-4};
  }
}

Tensor cuda(const Tensor& t) { return t.to(Device::cuda()); }

// f on CPU leaves and on CUDA copies of them; backward of sum(f(...) * w) on both; compares the
// outputs and every leaf's gradient. `inputs` are CPU tensors; those marked in `grad` require grad.
void compareWithGrad(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                     const std::vector<bool>& grad, Tol fwd, Tol bwd, const std::string& what) {
  std::vector<Tensor> c, g;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) {
      c.emplace_back();
      g.emplace_back();
      continue;
    }
    c.push_back(inputs[k].detach().clone());
    g.push_back(cuda(inputs[k].detach()));
    if (grad[k]) {
      c.back().setRequiresGrad(true);
      g.back().setRequiresGrad(true);
    }
  }
  Tensor yc = f(c), yg = f(g);
  ASSERT_TRUE(yg.device().isCuda()) << what;
  expectClose(yg, yc, fwd.atol, fwd.rtol, what + " forward");
  Generator gen(11);
  Tensor w = rand(yc.sizes(), {}, &gen).to(yc.dtype());
  (yc * w).sum().backward();
  (yg * cuda(w)).sum().backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!grad[k] || !inputs[k].defined()) continue;
    ASSERT_TRUE(g[k].grad().defined()) << what << " input " << k;
    EXPECT_TRUE(g[k].grad().device().isCuda()) << what;
    expectClose(g[k].grad(), c[k].grad(), bwd.atol, bwd.rtol, what + fmt::format(" grad of input {}", k));
  }
}

// ---- softmax ----------------------------------------------------------------------------------------

TEST(CudaNn, SoftmaxAndLogSoftmaxEveryDimForwardAndBackward) {
  COHORT_REQUIRE_GPU();
  const std::vector<Shape> shapes = {{7}, {1, 1}, {7, 1000}, {4097, 7}, {3, 4097, 5}, {2, 3, 4, 5}, {5, 1, 2000}};
  for (DType dt : kFloatTypes) {
    for (const Shape& s : shapes) {
      Tensor x = values(s, dt);
      for (int64_t d = -1; d < static_cast<int64_t>(s.size()); ++d) {
        std::string what = fmt::format("{} {} dim {}", dt, shapeStr(s), d);
        compareWithGrad([d](const std::vector<Tensor>& in) { return F::softmax(in[0], d); }, {x}, {true}, outTol(dt),
                        gradTol(dt), "softmax " + what);
        compareWithGrad([d](const std::vector<Tensor>& in) { return F::logSoftmax(in[0], d); }, {x}, {true},
                        {outTol(dt).atol * 10, outTol(dt).rtol}, gradTol(dt), "logSoftmax " + what);
      }
    }
    // A transposed input (the op plans a contiguous copy), a 0-dim input and an empty one.
    Tensor x = values({33, 70}, dt);
    compareWithGrad([](const std::vector<Tensor>& in) { return F::softmax(in[0].transpose(0, 1), 1); }, {x}, {true},
                    outTol(dt), gradTol(dt), fmt::format("{} transposed softmax", dt));
    compareWithGrad([](const std::vector<Tensor>& in) { return F::logSoftmax(in[0], 0); }, {values({}, dt)}, {true},
                    outTol(dt), gradTol(dt), fmt::format("{} 0-dim logSoftmax", dt));
    Tensor e = values({0, 5}, dt);
    EXPECT_EQ(F::softmax(cuda(e), 1).sizes(), (Shape{0, 5}));
    EXPECT_EQ(F::logSoftmax(cuda(e), 0).sizes(), (Shape{0, 5}));
  }
}

TEST(CudaNn, SoftmaxInfinitiesAndNaNAsOnTheCpu) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (int64_t n : {7, 3000}) {
      Tensor x = values({4, n}, dt);
      {
        autograd::NoGradGuard ng;
        x.narrow(0, 0, 1).fill_(-INFINITY);                                                 // all -inf: NaN row
        x.narrow(0, 1, 1).narrow(1, 3, 1).fill_(INFINITY);                                  // +inf: NaN row
        x.narrow(0, 2, 1).narrow(1, 1, 1).fill_(std::numeric_limits<double>::quiet_NaN());  // NaN row
        x.narrow(0, 3, 1).narrow(1, 0, 2).fill_(-INFINITY);                                 // zeros there
      }
      for (int64_t d : {0, 1}) {
        std::string what = fmt::format("{} n={} dim {}", dt, n, d);
        expectClose(F::softmax(cuda(x), d), F::softmax(x, d), outTol(dt).atol, outTol(dt).rtol, "softmax " + what);
        expectClose(F::logSoftmax(cuda(x), d), F::logSoftmax(x, d), outTol(dt).atol * 10, outTol(dt).rtol,
                    "logSoftmax " + what);
      }
    }
  }
}

// ---- nll / cross-entropy -------------------------------------------------------------------------

Tensor labels(const Shape& s, int64_t classes, DType dt, int64_t ignoreEvery = 0, int64_t ignoreIndex = -100) {
  Generator g(5);
  Tensor t = (rand(s, {}, &g) * static_cast<double>(classes)).to(DType::Int64);
  if (ignoreEvery > 0) {
    std::vector<int64_t> v = t.contiguous().toVector<int64_t>();
    for (size_t k = 0; k < v.size(); k += static_cast<size_t>(ignoreEvery)) v[k] = ignoreIndex;
    t = fromVector<int64_t>(v).reshape(s);  // (fromVector reads an empty shape as 1-D)
  }
  return t.to(dt);
}

TEST(CudaNn, NllAndCrossEntropyEveryReductionForwardAndBackward) {
  COHORT_REQUIRE_GPU();
  struct Layout {
    Shape input, target;
  };
  const std::vector<Layout> layouts = {
      {{7, 5}, {7}},    {{1, 1}, {1}},       {{1000, 7}, {1000}},       {{4097, 3}, {4097}},
      {{3, 1000}, {3}}, {{4, 6, 7}, {4, 7}}, {{2, 5, 3, 4}, {2, 3, 4}}, {{5}, {}}};
  for (DType dt : kFloatTypes) {
    for (const Layout& l : layouts) {
      const int64_t classes = l.input.size() == 1 ? l.input[0] : l.input[1];
      Tensor x = values(l.input, dt);
      for (DType tt : {DType::Int64, DType::Int32}) {
        for (int64_t ignoreEvery : {0, 3}) {
          const int64_t ignore = ignoreEvery ? 1 : -100;  // a real class, to check it is skipped
          Tensor t = labels(l.target, classes, tt, ignoreEvery, ignore);
          for (F::Reduction r : {F::Reduction::None, F::Reduction::Mean, F::Reduction::Sum}) {
            std::string what = fmt::format("{} {} target {} ignoreEvery {} reduction {}", dt, shapeStr(l.input), tt,
                                           ignoreEvery, static_cast<int>(r));
            Tol fwd = outTol(dt);
            if (r != F::Reduction::None) fwd.atol *= std::sqrt(static_cast<double>(x.numel()));
            compareWithGrad([&](const std::vector<Tensor>& in) { return F::nllLoss(in[0], in[1], r, ignore); }, {x, t},
                            {true, false}, fwd, gradTol(dt), "nllLoss " + what);
            for (double smoothing : {0.0, 0.1}) {
              compareWithGrad(
                  [&](const std::vector<Tensor>& in) {
                    return F::crossEntropy(in[0], in[1],
                                           {.reduction = r, .ignoreIndex = ignore, .labelSmoothing = smoothing});
                  },
                  {x, t}, {true, false}, {fwd.atol * 10, fwd.rtol * 4}, gradTol(dt),
                  fmt::format("crossEntropy smoothing {} {}", smoothing, what));
            }
          }
        }
      }
    }
  }
}

TEST(CudaNn, NllAllIgnoredAndEmptyBatchAsOnTheCpu) {
  COHORT_REQUIRE_GPU();
  Tensor x = values({4, 3}, DType::Float32);
  Tensor t = fromVector<int64_t>({-100, -100, -100, -100}, {4});
  for (F::Reduction r : {F::Reduction::None, F::Reduction::Mean, F::Reduction::Sum})
    expectClose(F::nllLoss(cuda(x), cuda(t), r), F::nllLoss(x, t, r), 0, 0, "all ignored");
  Tensor xe = values({0, 3}, DType::Float32);
  Tensor te = empty({0}, {.dtype = DType::Int64});
  for (F::Reduction r : {F::Reduction::None, F::Reduction::Mean, F::Reduction::Sum})
    expectClose(F::crossEntropy(cuda(xe), cuda(te), {.reduction = r}), F::crossEntropy(xe, te, {.reduction = r}), 0, 0,
                "empty batch");
}

TEST(CudaNn, BadLabelsGiveTheCpuIndexError) {
  COHORT_REQUIRE_GPU();
  Tensor x = values({6, 4}, DType::Float32);
  for (DType tt : {DType::Int64, DType::Int32}) {
    for (int64_t bad : {4, -1, 1000}) {
      Tensor t = fromVector<int64_t>({0, 1, 2, bad, 3, 7}, {6}).to(tt);
      std::string cpu = testing::messageOf<IndexError>([&] { F::nllLoss(x, t); });
      std::string gpu = testing::messageOf<IndexError>([&] { F::nllLoss(cuda(x), cuda(t)); });
      EXPECT_EQ(gpu, cpu);
      EXPECT_EQ(testing::messageOf<IndexError>([&] { F::crossEntropy(cuda(x), cuda(t)); }),
                testing::messageOf<IndexError>([&] { F::crossEntropy(x, t); }));
    }
  }
  // Targets on another device than the input: a clear error, not a crash.
  EXPECT_THROW(F::nllLoss(cuda(x), fromVector<int64_t>({0, 1, 2, 3, 0, 1}, {6})), Error);
}

// ---- layer norm ---------------------------------------------------------------------------------------

TEST(CudaNn, LayerNormForwardStatsAndGradients) {
  COHORT_REQUIRE_GPU();
  struct Case {
    Shape x, norm;
  };
  const std::vector<Case> cases = {{{7, 1000}, {1000}}, {{4097, 7}, {7}},  {{3, 5, 4097}, {4097}},
                                   {{1, 1}, {1}},       {{20000, 8}, {8}}, {{6, 4, 9}, {4, 9}},
                                   {{7}, {7}},          {{0, 5}, {5}}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      Tensor x = values(c.x, dt);
      Tensor w = values(c.norm, dt, 3, -1, 1) + 1.0;
      Tensor b = values(c.norm, dt, 4, -1, 1);
      for (int variant = 0; variant < 4; ++variant) {
        const bool hasW = variant & 1, hasB = variant & 2;
        std::string what = fmt::format("{} {} weight {} bias {}", dt, shapeStr(c.x), hasW, hasB);
        Tol g = gradTol(dt);
        // dw/db sum over many rows: their tolerance grows with the row count.
        const double rows = static_cast<double>(std::max<int64_t>(1, x.numel() / shapeNumel(c.norm)));
        compareWithGrad([&](const std::vector<Tensor>& in) { return F::layerNorm(in[0], c.norm, in[1], in[2], 1e-5); },
                        {x, hasW ? w : Tensor(), hasB ? b : Tensor()}, {true, hasW, hasB},
                        {outTol(dt).atol * 10, outTol(dt).rtol * 4}, {g.atol * std::sqrt(rows) * 10, g.rtol * 10},
                        "layerNorm " + what);
      }
    }
    // A non-contiguous input.
    Tensor x = values({40, 33}, dt);
    compareWithGrad([](const std::vector<Tensor>& in) { return F::layerNorm(in[0].transpose(0, 1), {40}); }, {x},
                    {true}, {outTol(dt).atol * 10, outTol(dt).rtol * 4}, {gradTol(dt).atol * 10, gradTol(dt).rtol * 10},
                    fmt::format("{} transposed layerNorm", dt));
  }
}

// ---- mse ----------------------------------------------------------------------------------------------

TEST(CudaNn, MseLossEveryReduction) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (const Shape& s : {Shape{7}, Shape{4097, 3}, Shape{}}) {
      Tensor a = values(s, dt, 1), b = values(s, dt, 2);
      for (F::Reduction r : {F::Reduction::None, F::Reduction::Mean, F::Reduction::Sum}) {
        Tol fwd = outTol(dt);
        fwd.atol *= 100 * std::sqrt(static_cast<double>(a.numel()));
        compareWithGrad([r](const std::vector<Tensor>& in) { return F::mseLoss(in[0], in[1], r); }, {a, b},
                        {true, true}, fwd, gradTol(dt),
                        fmt::format("mseLoss {} {} {}", dt, shapeStr(s), static_cast<int>(r)));
      }
    }
  }
}

// ---- float64 gradient checks on the device ----------------------------------------------------------

TEST(CudaNn, Float64GradcheckOnTheDevice) {
  COHORT_REQUIRE_GPU();
  auto dev = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> out;
    for (const Tensor& t : in) out.push_back(t.defined() ? cuda(t) : t);
    return out;
  };
  using testing::gradcheck;
  using testing::randArg;
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return F::softmax(dev(in)[0], 1).to(Device::cpu()); },
                        {randArg({3, 5, 4})}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return F::logSoftmax(dev(in)[0], -1).to(Device::cpu()); },
                        {randArg({3, 5})}));
  Tensor t = fromVector<int64_t>({1, -100, 4, 0}, {4});
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return F::crossEntropy(dev(in)[0], cuda(t), {.labelSmoothing = 0.2}).to(Device::cpu());
      },
      {randArg({4, 5})}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> d = dev(in);
        return F::layerNorm(d[0], {6}, d[1], d[2]).to(Device::cpu());
      },
      {randArg({4, 6}), randArg({6}, 8), randArg({6}, 9)}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> d = dev(in);
        return F::conv2d(d[0], d[1], d[2], {.stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .groups = 2})
            .to(Device::cpu());
      },
      {randArg({2, 4, 6, 5}), randArg({4, 2, 3, 2}, 8), randArg({4}, 9)}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return F::avgPool2d(dev(in)[0], {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}).to(Device::cpu());
      },
      {randArg({2, 2, 5, 6})}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return F::maxPool2d(dev(in)[0], {.kernel = {2, 2}, .stride = {1, 1}}).to(Device::cpu());
      },
      {randArg({2, 2, 5, 6})}));
}

// ---- convolution and pooling ------------------------------------------------------------------------

// The GPU takes conv2d and pooling through device-neutral tensor ops (patch matrices as strided
// views, batched GEMMs); the CPU runs its direct loops. Sums of up to 27 products in another order:
// the output and gradient tolerances with a tenfold absolute floor.
TEST(CudaNn, Conv2dAndPoolingForwardAndBackward) {
  COHORT_REQUIRE_GPU();
  struct ConvCase {
    Shape x, w;
    F::Conv2dOptions opts;
  };
  const std::vector<ConvCase> convs = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {{1, 4, 11, 7}, {6, 2, 3, 2}, {.stride = {2, 1}, .padding = {2, 1}, .dilation = {2, 3}, .groups = 2}},
      {{3, 5, 6, 6}, {5, 1, 3, 3}, {.padding = {1, 1}, .groups = 5}},
      {{2, 6, 5, 7}, {8, 6, 1, 1}, {}},
      {{0, 3, 6, 6}, {4, 3, 3, 3}, {.padding = {1, 1}}},
  };
  const std::vector<F::Pool2dOptions> pools = {{},
                                               {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
                                               {.kernel = {2, 3}, .stride = {1, 2}}};
  uint64_t seed = 300;
  for (DType dt : kFloatTypes) {
    Tol fwd = outTol(dt), bwd = gradTol(dt);
    fwd.atol *= 10;
    bwd.atol *= 10;
    for (const ConvCase& c : convs) {
      const std::string at =
          fmt::format("conv2d {} x {} w {} groups {}", dt, shapeStr(c.x), shapeStr(c.w), c.opts.groups);
      std::vector<Tensor> in = {values(c.x, dt, seed++, -1, 1), values(c.w, dt, seed++, -1, 1),
                                values({c.w[0]}, dt, seed++, -1, 1)};
      const F::Conv2dOptions opts = c.opts;
      compareWithGrad([&](const std::vector<Tensor>& t) { return F::conv2d(t[0], t[1], t[2], opts); }, in,
                      {true, true, true}, fwd, bwd, at);
    }
    for (const F::Pool2dOptions& o : pools) {
      const std::string at = fmt::format("{} kernel ({}, {})", dt, o.kernel.first, o.kernel.second);
      const std::vector<Tensor> in = {values({2, 3, 9, 7}, dt, seed++, -1, 1)};
      compareWithGrad([&](const std::vector<Tensor>& t) { return F::maxPool2d(t[0], o); }, in, {true}, {0, 0}, bwd,
                      "maxPool2d " + at);
      compareWithGrad([&](const std::vector<Tensor>& t) { return F::avgPool2d(t[0], o); }, in, {true}, fwd, bwd,
                      "avgPool2d " + at);
    }
  }
}

// A conv2d with mismatched devices is refused by name.
TEST(CudaNn, Conv2dWeightOnAnotherDeviceIsRefused) {
  COHORT_REQUIRE_GPU();
  const Tensor x = values({1, 2, 5, 5}, DType::Float32, 1, -1, 1);
  const Tensor w = values({3, 2, 3, 3}, DType::Float32, 2, -1, 1);
  EXPECT_THROW(F::conv2d(cuda(x), w, Tensor(), {}), ValueError);
}

// ---- without a GPU --------------------------------------------------------------------------------

TEST(CudaNn, KernelsAreRegisteredInCudaBuilds) {
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA kernels";
  std::vector<std::string> ops = dispatch::opsWithKernels(DeviceType::CUDA);
  for (const char* op : {"softmax", "logSoftmax", "softmax backward", "logSoftmax backward", "nllLoss",
                         "nllLoss backward", "layerNorm", "layerNorm backward"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
}

}  // namespace
}  // namespace cohort
