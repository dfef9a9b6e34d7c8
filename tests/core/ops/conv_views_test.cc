// The device-neutral conv2d and pooling (core/ops/conv_views.cc, what a GPU runs) against the CPU's
// direct kernels (core/ops/conv.cc), both on the CPU: outputs and every gradient, over strides,
// padding, dilation, groups (depthwise too), 1x1 kernels, non-square shapes and empty batches, with
// the batch whole and in chunks.
// The GPU tests check the same path on a GPU against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/ops/detail/conv_views.h>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

using nn::functional::Conv2dOptions;
using nn::functional::Pool2dOptions;
using testing::expectBitEqual;
using testing::expectClose;
namespace fd = nn::functional::detail;

struct ConvCase {
  Shape x, w;
  Conv2dOptions opts;
  bool bias;
};

std::string describe(const ConvCase& c) {
  return fmt::format("x {} w {} stride ({}, {}) padding ({}, {}) dilation ({}, {}) groups {}{}", shapeStr(c.x),
                     shapeStr(c.w), c.opts.stride.first, c.opts.stride.second, c.opts.padding.first,
                     c.opts.padding.second, c.opts.dilation.first, c.opts.dilation.second, c.opts.groups,
                     c.bias ? " bias" : "");
}

const std::vector<ConvCase>& convCases() {
  static const std::vector<ConvCase> kCases = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {}, true},
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, true},
      {{1, 4, 11, 7}, {6, 2, 3, 2}, {.stride = {2, 1}, .padding = {2, 1}, .dilation = {2, 3}, .groups = 2}, true},
      {{3, 5, 6, 6}, {5, 1, 3, 3}, {.padding = {1, 1}, .groups = 5}, false},  // depthwise
      {{2, 6, 5, 7}, {8, 6, 1, 1}, {}, true},                                 // 1x1: the direct case on the CPU
      {{2, 6, 5, 7}, {8, 6, 1, 1}, {.stride = {2, 2}}, false},
      {{1, 2, 4, 4}, {3, 2, 4, 4}, {}, true},  // one output position
      {{2, 3, 8, 8}, {4, 3, 5, 5}, {.stride = {3, 3}, .padding = {2, 2}}, true},
      {{0, 3, 6, 6}, {4, 3, 3, 3}, {.padding = {1, 1}}, true},  // empty batch
  };
  return kCases;
}

TEST(ConvByViews, MatchesTheCpuKernelsForwardAndBackward) {
  for (DType dt : {DType::Float64, DType::Float32}) {
    const double tol = dt == DType::Float64 ? 1e-12 : 2e-5;
    uint64_t seed = 1;
    for (const ConvCase& c : convCases()) {
      const std::string at = fmt::format("{} {}", dt, describe(c));
      Tensor x = testing::values(c.x, dt, seed++, -1, 1).setRequiresGrad();
      Tensor w = testing::values(c.w, dt, seed++, -1, 1).setRequiresGrad();
      Tensor b = c.bias ? testing::values({c.w[0]}, dt, seed++, -1, 1).setRequiresGrad() : Tensor();
      Tensor want = nn::functional::conv2d(x, w, b, c.opts);
      const Tensor gout = testing::values(want.sizes(), dt, seed++, -1, 1);
      want.backward(gout);

      const fd::ConvGeom g = fd::convGeometry(x, w, b, c.opts);
      // The whole batch at once, and one sample per chunk (a patch matrix limit of one value).
      for (int64_t limit : {fd::kMaxPatchElements, int64_t{1}}) {
        const std::string in = at + (limit == 1 ? " (chunked)" : "");
        const Tensor got = fd::convForwardByViews(x.detach(), w.detach(), c.bias ? b.detach() : Tensor(), g, limit);
        expectClose(got, want.detach(), tol, tol, in + " output");
        std::vector<Tensor> grads = fd::convBackwardByViews(x.detach(), w.detach(), gout, g, true, true, c.bias, limit);
        expectClose(grads[0], x.grad(), tol, tol, in + " input gradient");
        expectClose(grads[1], w.grad(), tol, tol, in + " weight gradient");
        if (c.bias) expectClose(grads[2], b.grad(), tol, tol, in + " bias gradient");
        if (limit == 1) {  // each chunk alone: only the weight gradient needed
          std::vector<Tensor> onlyW =
              fd::convBackwardByViews(x.detach(), w.detach(), gout, g, false, true, false, limit);
          EXPECT_FALSE(onlyW[0].defined()) << in;
          expectClose(onlyW[1], w.grad(), tol, tol, in + " weight gradient alone");
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

struct PoolCase {
  Shape x;
  Pool2dOptions opts;
};

const std::vector<PoolCase>& poolCases() {
  static const std::vector<PoolCase> kCases = {
      {{2, 3, 8, 8}, {}},
      {{2, 3, 9, 7}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},  // overlapping windows
      {{4, 7, 5}, {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 0}}},     // 3-D input
      {{1, 2, 6, 6}, {.kernel = {4, 4}, .stride = {1, 1}, .padding = {2, 2}}},
      {{0, 2, 6, 6}, {}},
  };
  return kCases;
}

// Pools x with `op` on the CPU's kernel (with autograd) and by views; the same values, and gradients
// within gradTol (absolute and relative; inputs and gradients are of order 1): overlapping windows
// add their gradients in another order.
template <typename Op, typename Forward, typename Backward>
void comparePool(const char* name, Op op, Forward byViews, Backward byViewsBackward, double valueTol, double gradTol) {
  uint64_t seed = 100;
  for (DType dt : {DType::Float64, DType::Float32}) {
    for (const PoolCase& c : poolCases()) {
      const std::string at =
          fmt::format("{} {} x {} kernel ({}, {})", name, dt, shapeStr(c.x), c.opts.kernel.first, c.opts.kernel.second);
      Tensor x = testing::values(c.x, dt, seed++, -1, 1).setRequiresGrad();
      Tensor want = op(x, c.opts);
      const Tensor gout = testing::values(want.sizes(), dt, seed++, -1, 1);
      want.backward(gout);
      const fd::PoolGeom g = fd::poolGeometry(x, c.opts, name);
      const Shape planes = {g.planes, g.h, g.w}, outPlanes = {g.planes, g.ho, g.wo};
      auto [got, saved] = byViews(x.detach().reshape(planes), g);
      expectClose(got.reshape(want.sizes()), want.detach(), valueTol, valueTol, at + " output");
      const Tensor gx = byViewsBackward(gout.reshape(outPlanes), saved, g);
      expectClose(gx.reshape(c.x), x.grad(), gradTol, gradTol, at + " input gradient");
    }
  }
}

TEST(PoolByViews, MaxMatchesTheCpuKernelForwardAndBackward) {
  comparePool(
      "maxPool2d", [](const Tensor& x, const Pool2dOptions& o) { return nn::functional::maxPool2d(x, o); },
      [](const Tensor& x, const fd::PoolGeom& g) { return fd::maxPoolByViews(x, g); },
      [](const Tensor& go, const Tensor& idx, const fd::PoolGeom& g) { return fd::maxPoolBackwardByViews(go, idx, g); },
      0.0, 1e-6);  // the maxima are exact
}

TEST(PoolByViews, AvgMatchesTheCpuKernelForwardAndBackward) {
  comparePool(
      "avgPool2d", [](const Tensor& x, const Pool2dOptions& o) { return nn::functional::avgPool2d(x, o); },
      [](const Tensor& x, const fd::PoolGeom& g) {
        return std::pair{fd::avgPoolByViews(x, g), Tensor()};
      },
      [](const Tensor& go, const Tensor&, const fd::PoolGeom& g) { return fd::avgPoolBackwardByViews(go, g); }, 1e-6,
      1e-6);
}

// A NaN in a window is its maximum, as on the CPU (and in torch); the gradient goes to it.
TEST(PoolByViews, MaxPropagatesNan) {
  Tensor x = testing::values({1, 1, 4, 4}, DType::Float32, 7, -1, 1);
  x.select(2, 1).select(2, 2).fill_(NAN);
  const fd::PoolGeom g = fd::poolGeometry(x, {}, "maxPool2d");
  auto [got, idx] = fd::maxPoolByViews(x.reshape({1, 4, 4}), g);
  expectBitEqual(got.reshape({1, 1, 2, 2}), nn::functional::maxPool2d(x, {}), "maxima with a NaN");
  EXPECT_EQ(idx.reshape({4}).toVector<int64_t>()[1], 2) << "the NaN at (1, 2) is the second window's (1, 0)";
}

}  // namespace
}  // namespace cohort
