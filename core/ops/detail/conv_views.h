// Internal: the geometry of conv2d and 2-D pooling, and their forward and backward passes built
// from device-neutral tensor operations (strided views, copies, elementwise ops, reductions and
// batched GEMMs). Those run on every device that has the core kernels, so a device gets conv2d
// and pooling without kernels of its own; the CPU keeps its direct loops (core/ops/conv.cc), and
// tests compare the two on the CPU.
//
// All functions take tensors in the compute type (float32 or float64), run without autograd (the
// ops record their own backward) and return results on the inputs' device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <cohort/core/ops/functional.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::nn::functional::detail {

struct ConvGeom {
  int64_t n, cin, h, w, cout, kh, kw, groups;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t ho, wo;
  int64_t cg() const { return cin / groups; }
  int64_t coutg() const { return cout / groups; }
  int64_t kdim() const { return cg() * kh * kw; }  // rows of the patch matrix
  int64_t ospatial() const { return ho * wo; }
  bool direct() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// planes: N*C for a 4-D input, C for a 3-D one.
struct PoolGeom {
  int64_t planes, h, w, kh, kw, sh, sw, ph, pw, ho, wo;
};

// Average pooling's divisor at output (oh, ow), torch's count_include_pad: the window's positions,
// padded ones included, clipped to the padded input.
inline int64_t avgPoolDivisor(const PoolGeom& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  const int64_t he = std::min(hs + g.kh, g.h + g.ph), we = std::min(ws + g.kw, g.w + g.pw);
  return (he - hs) * (we - ws);
}

// The checked geometry of conv2d(input, weight, bias, opts) and of a pooling op's (ValueError naming
// what is wrong, as the ops report it).
ConvGeom convGeometry(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dOptions& opts);
PoolGeom poolGeometry(const Tensor& x, const Pool2dOptions& opts, const char* op);

// Kernels a device registers for the ops (the CPU's direct loops), under "conv2d" and
// "conv2d backward", "maxPool2d" and "maxPool2d backward", "avgPool2d" and "avgPool2d backward";
// where a device has no pair, the ops run the composites below (ByViews). Inputs are contiguous
// where the composites' are; conv and average pooling compute in float32 or float64, max pooling
// takes any float type and the gradient arrives in the compute type. Max pooling's second result
// is whatever its own backward reads.
using ConvForwardKernel = Tensor(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g);
using ConvBackwardKernel = std::vector<Tensor>(const Tensor& x, const Tensor& w, const Tensor& gout, const ConvGeom& g,
                                               bool needX, bool needW, bool needB);
using MaxPoolForwardKernel = std::pair<Tensor, Tensor>(const Tensor& x, const PoolGeom& g);
using MaxPoolBackwardKernel = Tensor(const Tensor& gout, const Tensor& argmax, const PoolGeom& g);
using AvgPoolForwardKernel = Tensor(const Tensor& x, const PoolGeom& g);
using AvgPoolBackwardKernel = Tensor(const Tensor& gout, const PoolGeom& g);

// The batch is taken in chunks whose patch matrix holds at most this many values (256 MiB of
// float32): a whole batch's would hold kH*kW copies of the input at once.
inline constexpr int64_t kMaxPatchElements = int64_t{1} << 26;

// conv2d: x [N, Cin, H, W], w [Cout, Cin/groups, kH, kW], b [Cout] or undefined -> [N, Cout, Ho, Wo].
Tensor convForwardByViews(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g,
                          int64_t maxPatchElements = kMaxPatchElements);
// Gradients of x, w and b (undefined where not needed), from gout [N, Cout, Ho, Wo].
std::vector<Tensor> convBackwardByViews(const Tensor& x, const Tensor& w, const Tensor& gout, const ConvGeom& g,
                                        bool needX, bool needW, bool needB,
                                        int64_t maxPatchElements = kMaxPatchElements);

// Max pooling over x [planes, H, W]: the maxima [planes, Ho, Wo] and, for each, the position of the
// first maximum (NaN counts as the maximum) within its window, row-major over kH x kW.
std::pair<Tensor, Tensor> maxPoolByViews(const Tensor& x, const PoolGeom& g);
// The input gradient [planes, H, W]: each output's gradient goes to its window's maximum.
Tensor maxPoolBackwardByViews(const Tensor& gout, const Tensor& windowArgmax, const PoolGeom& g);

// Average pooling over x [planes, H, W], padded positions counted in the divisor as torch's
// count_include_pad does, and its input gradient.
Tensor avgPoolByViews(const Tensor& x, const PoolGeom& g);
Tensor avgPoolBackwardByViews(const Tensor& gout, const PoolGeom& g);

}  // namespace cohort::nn::functional::detail
