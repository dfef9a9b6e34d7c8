// View ops, joining and conversions (core/tensor/views.cc): values, storage sharing (a write
// through a view changes the base), float64 gradchecks through every view, and typed errors.
// Reference values were produced with /usr/bin/python3 (torch 1.13) where noted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <cohort/cohort.h>

#include "core/gradcheck.h"
#include "core/test_util.h"

using namespace cohort;
using cohort::testing::expectError;
using cohort::testing::gradcheck;
using cohort::testing::randArg;

namespace {

std::vector<double> vals(const Tensor& t) { return t.to(DType::Float64).toVector<double>(); }

Tensor ar(int64_t n, DType dt = DType::Float32) { return arange(0, n, 1, {.dtype = dt}); }

bool sharesStorage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

}  // namespace

// ---- view / reshape ------------------------------------------------------------------------------

TEST(View, ValuesInferenceAndSharing) {
  Tensor a = ar(12);
  Tensor v = a.view({3, -1});
  EXPECT_EQ(v.sizes(), (Shape{3, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_TRUE(sharesStorage(a, v));
  EXPECT_EQ(vals(v), vals(a));
  EXPECT_EQ(a.view({-1, 2, 2}).sizes(), (Shape{3, 2, 2}));
  EXPECT_EQ(a.view({12, 1}).strides()[0], 1);
  EXPECT_EQ(scalarTensor(5.0).view({1, 1}).sizes(), (Shape{1, 1}));
  EXPECT_EQ(ar(1).view({}).dim(), 0);
}

TEST(View, WriteThroughViewChangesBase) {
  Tensor a = zeros({2, 3});
  a.view({6}).narrow(0, 2, 2).fill_(7);
  EXPECT_EQ(vals(a), (std::vector<double>{0, 0, 7, 7, 0, 0}));
}

TEST(View, CompatibleStridesOfNonContiguousInput) {
  Tensor a = ar(24).view({2, 3, 4});
  Tensor p = a.permute({1, 0, 2});  // [3,2,4], strides [4,12,1]: the last dim can still split
  Tensor v = p.view({3, 2, 2, 2});
  EXPECT_EQ(v.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_TRUE(sharesStorage(a, v));
  EXPECT_EQ(vals(v), vals(p.contiguous()));
  // Merging dims that are not adjacent in memory is an error naming view, the shapes and strides.
  expectError<ValueError>([&] { p.view({6, 4}); }, {"view", "[6, 4]", "[3, 2, 4]", "reshape"});
  expectError<ValueError>([&] { a.t(); }, {"t", "[2, 3, 4]"});
}

TEST(View, BadShapes) {
  Tensor a = ar(12);
  expectError<ValueError>([&] { a.view({5, -1}); }, {"view", "[5, -1]", "[12]"});
  expectError<ValueError>([&] { a.view({-1, -1}); }, {"view", "only one dimension can be -1"});
  expectError<ValueError>([&] { a.view({5}); }, {"view", "[5]", "12 elements"});
  expectError<ValueError>([&] { a.view({-3, 4}); }, {"view", "-3"});
  expectError<ValueError>([&] { a.reshape({7, 2}); }, {"reshape", "[7, 2]"});
}

TEST(Reshape, CopiesOnlyWhenNeeded) {
  Tensor a = ar(6).view({2, 3});
  Tensor r = a.reshape({3, 2});
  EXPECT_TRUE(sharesStorage(a, r));
  Tensor t = a.t();  // [[0,3],[1,4],[2,5]]
  Tensor c = t.reshape({-1});
  EXPECT_FALSE(sharesStorage(a, c));
  EXPECT_EQ(vals(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(c.isContiguous());
}

TEST(View, Gradcheck) {
  Tensor a = randArg({3, 4});
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].view({2, -1, 2}) * in[0].view({2, 3, 2});
      },
      {a}));
  // reshape of a transposed view (copies) and of a sliced view.
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].t().reshape({6, 2}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].slice(1, 1, 4).reshape({-1}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].flatten(); }, {a}));
}

// ---- transpose / permute --------------------------------------------------------------------------

TEST(Permute, ValuesStridesAndSharing) {
  Tensor a = ar(24).view({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_FALSE(p.isContiguous());
  // p[i][j][k] = a[j][k][i] = 12j + 4k + i
  std::vector<double> want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) want.push_back(12 * j + 4 * k + i);
  EXPECT_EQ(vals(p), want);
  Tensor t = a.transpose(-1, 0);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  t.select(0, 3).select(0, 2).fill_(-1);  // a[:, 2, 3]
  EXPECT_EQ(a.select(1, 2).select(1, 3).toVector<float>(), (std::vector<float>{-1, -1}));
  EXPECT_EQ(ar(3).t().sizes(), (Shape{3}));
}

TEST(Permute, BadDims) {
  Tensor a = zeros({2, 3, 4});
  expectError<ValueError>([&] { a.permute({0, 1}); }, {"permute", "[0, 1]", "3 dims"});
  expectError<ValueError>([&] { a.permute({0, 1, 1}); }, {"permute", "repeats"});
  expectError<IndexError>([&] { a.permute({0, 1, 3}); }, {"permute", "dim 3"});
  expectError<IndexError>([&] { a.transpose(0, -4); }, {"transpose", "dim -4"});
}

TEST(Permute, Gradcheck) {
  Tensor a = randArg({2, 3, 4});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].permute({2, 0, 1}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].transpose(0, 2).transpose(1, 2); }, {a}));
}

// ---- slice / narrow / select -------------------------------------------------------------------------

TEST(Slice, StepsAndNegativeIndices) {
  Tensor x = ar(10);
  // torch: x[-7:-1:3] = [3, 6]; x[1::4] = [1, 5, 9]; x[-100:100:3] = [0, 3, 6, 9]
  EXPECT_EQ(vals(x.slice(0, -7, -1, 3)), (std::vector<double>{3, 6}));
  EXPECT_EQ(vals(x.slice(0, 1, 10, 4)), (std::vector<double>{1, 5, 9}));
  EXPECT_EQ(vals(x.slice(0, -100, 100, 3)), (std::vector<double>{0, 3, 6, 9}));
  EXPECT_EQ(x.slice(0, 7, 3).numel(), 0);
  EXPECT_EQ(x.slice(0, 12, 20).numel(), 0);
  Tensor m = ar(12).view({3, 4});
  Tensor s = m.slice(1, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.sizes(), (Shape{3, 2}));
  EXPECT_EQ(s.strides(), (Shape{4, 2}));
  EXPECT_EQ(vals(s), (std::vector<double>{1, 3, 5, 7, 9, 11}));
  s.fill_(0);
  EXPECT_EQ(vals(m), (std::vector<double>{0, 0, 2, 0, 4, 0, 6, 0, 8, 0, 10, 0}));
  expectError<ValueError>([&] { x.slice(0, 0, 5, 0); }, {"slice", "step", "0"});
  expectError<IndexError>([&] { x.slice(1, 0, 5); }, {"slice", "dim 1"});
  expectError<IndexError>([&] { scalarTensor(1.0).slice(0, 0, 1); }, {"slice", "0-dimensional"});
}

TEST(Narrow, ValuesAndErrors) {
  Tensor m = ar(12).view({3, 4});
  EXPECT_EQ(vals(m.narrow(1, 1, 2)), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(vals(m.narrow(0, -1, 1)), (std::vector<double>{8, 9, 10, 11}));
  m.narrow(0, 1, 1).fill_(-5);
  EXPECT_EQ(vals(m.select(0, 1)), (std::vector<double>{-5, -5, -5, -5}));
  expectError<IndexError>([&] { m.narrow(1, 2, 3); }, {"narrow", "start 2", "length 3", "size 4"});
  expectError<IndexError>([&] { m.narrow(0, 0, -1); }, {"narrow", "length -1"});
}

TEST(Select, ValuesAndErrors) {
  Tensor a = ar(24).view({2, 3, 4});
  Tensor s = a.select(1, -1);  // a[:, 2, :]
  EXPECT_EQ(s.sizes(), (Shape{2, 4}));
  EXPECT_EQ(vals(s), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(a.select(0, 1).select(0, 2).select(0, 3).item<double>(), 23);
  a.select(2, 0).fill_(100);
  EXPECT_EQ(a.toVector<float>()[12], 100);
  expectError<IndexError>([&] { a.select(1, 3); }, {"select", "index 3", "dim 1", "size 3"});
  expectError<IndexError>([&] { a.select(1, -4); }, {"select", "index -4"});
  expectError<IndexError>([&] { scalarTensor(1.0).select(0, 0); }, {"select", "0-dimensional"});
}

TEST(SliceNarrowSelect, Gradcheck) {
  Tensor a = randArg({4, 5});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].slice(1, -4, 5, 2); }, {a}));
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return in[0].t().slice(0, 1, 5, 3).slice(1, 0, 4, 2); }, {a}));
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return in[0].narrow(0, 1, 2) * in[0].narrow(0, 2, 2); }, {a}));
  EXPECT_TRUE(
      gradcheck([](const std::vector<Tensor>& in) { return in[0].select(1, -2) + in[0].t().select(0, 0); }, {a}));
}

// ---- expand / squeeze / unsqueeze / flatten ---------------------------------------------------------

TEST(Expand, ValuesAndErrors) {
  Tensor v = fromVector<float>({1, 2, 3}, {3, 1});
  Tensor e = v.expand({2, 3, 4});
  EXPECT_EQ(e.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(sharesStorage(v, e));
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) want.push_back(j + 1);
  EXPECT_EQ(vals(e), want);
  EXPECT_EQ(v.expand({-1, 5}).sizes(), (Shape{3, 5}));
  EXPECT_EQ(scalarTensor(2.0).expand({2, 2}).sizes(), (Shape{2, 2}));
  expectError<ValueError>([&] { v.expand({4, 4}); }, {"expand", "[3, 1]", "[4, 4]"});
  expectError<ValueError>([&] { v.expand({3}); }, {"expand", "fewer dims"});
  expectError<ValueError>([&] { v.expand({-1, 3, 1}); }, {"expand", "-1"});
  expectError<ValueError>([&] { v.expand({3, -2}); }, {"expand", "-2"});
}

TEST(Squeeze, ShapesAndSharing) {
  Tensor a = zeros({1, 3, 1, 2});
  EXPECT_EQ(a.squeeze().sizes(), (Shape{3, 2}));
  EXPECT_EQ(a.squeeze(2).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(a.squeeze(1).sizes(), (Shape{1, 3, 1, 2}));  // not size 1: unchanged
  EXPECT_EQ(a.squeeze(-4).sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(a.unsqueeze(0).sizes(), (Shape{1, 1, 3, 1, 2}));
  EXPECT_EQ(a.unsqueeze(-1).sizes(), (Shape{1, 3, 1, 2, 1}));
  EXPECT_EQ(scalarTensor(1.0).unsqueeze(0).sizes(), (Shape{1}));
  Tensor t = ar(6).view({2, 3}).t();  // non-contiguous
  Tensor u = t.unsqueeze(1);
  EXPECT_EQ(u.sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(vals(u), vals(t));
  u.squeeze().select(0, 0).fill_(9);
  EXPECT_EQ(vals(t.select(0, 0)), (std::vector<double>{9, 9}));
  expectError<IndexError>([&] { a.squeeze(4); }, {"squeeze", "dim 4"});
  expectError<IndexError>([&] { a.unsqueeze(5); }, {"unsqueeze", "dim 5"});
}

TEST(Flatten, ShapesAndErrors) {
  Tensor a = ar(24).view({2, 3, 4});
  EXPECT_EQ(a.flatten().sizes(), (Shape{24}));
  EXPECT_EQ(a.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(a.flatten(0, 1).sizes(), (Shape{6, 4}));
  EXPECT_TRUE(sharesStorage(a, a.flatten(1)));
  EXPECT_EQ(vals(a.transpose(1, 2).flatten(1)).at(1), 4);
  EXPECT_EQ(scalarTensor(3.0).flatten().sizes(), (Shape{1}));
  expectError<ValueError>([&] { a.flatten(2, 1); }, {"flatten", "start dim 2", "end dim 1"});
}

TEST(ExpandSqueeze, Gradcheck) {
  Tensor v = randArg({3, 1});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].expand({2, 3, 4}); }, {v}));
  Tensor a = randArg({3, 4}, 21);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].t().unsqueeze(1).expand({4, 2, 3}); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].unsqueeze(0).unsqueeze(-1).squeeze(); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].slice(0, 0, 1).squeeze(0); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].t().flatten(); }, {a}));
}

// ---- chunk / split ------------------------------------------------------------------------------------

TEST(ChunkSplit, SizesValuesAndSharing) {
  // torch.arange(10).chunk(4) -> sizes 3,3,3,1; torch.arange(5).chunk(3) -> 2,2,1
  auto sizesOf = [](const std::vector<Tensor>& parts, int64_t d) {
    Shape s;
    for (const auto& p : parts) s.push_back(p.size(d));
    return s;
  };
  EXPECT_EQ(sizesOf(ar(10).chunk(4), 0), (Shape{3, 3, 3, 1}));
  EXPECT_EQ(sizesOf(ar(5).chunk(3), 0), (Shape{2, 2, 1}));
  Tensor m = ar(12).view({3, 4});
  auto parts = m.split(3, 1);
  EXPECT_EQ(sizesOf(parts, 1), (Shape{3, 1}));
  EXPECT_EQ(vals(parts[1]), (std::vector<double>{3, 7, 11}));
  auto secs = m.split(Shape{1, 2}, 0);
  EXPECT_EQ(vals(secs[1]), (std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11}));
  secs[0].fill_(-1);
  EXPECT_EQ(vals(m.select(0, 0)), (std::vector<double>{-1, -1, -1, -1}));
  expectError<ValueError>([&] { m.split(Shape{1, 1}, 0); }, {"split", "[1, 1]", "sum to 2", "size 3"});
  expectError<ValueError>([&] { m.split(0, 0); }, {"split", "positive"});
  expectError<ValueError>([&] { m.chunk(0, 0); }, {"chunk", "positive"});
  expectError<IndexError>([&] { m.chunk(2, 2); }, {"chunk", "dim 2"});
  expectError<ValueError>([&] { scalarTensor(1.0).split(1); }, {"split", "0-dimensional"});
  expectError<ValueError>([&] { scalarTensor(1.0).chunk(2); }, {"chunk", "0-dimensional"});
}

// The parts of a split share one backward: it concatenates their gradients, with zeros for a part
// that got none (the middle one below) or whose gradient is only partial.
TEST(ChunkSplit, GradientsOfThePartsMeetInOneBackward) {
  Tensor a = randArg({3, 7});
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = in[0].split(Shape{2, 3, 2}, 1);
        return p[0] * p[2] + p[0].sum();  // p[1] unused
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = in[0].chunk(3, 0);  // 1 row each
        return (p[2] * 2.0 - p[0]).exp().slice(1, 2, 5);
      },
      {a}));
  // The split sits in the graph once, with the input's gradient in one piece.
  Tensor b = randn({2, 6}).setRequiresGrad(true);
  auto parts = b.split(2, 1);
  (parts[0].sum() + (parts[1] * 3.0).sum()).backward();
  EXPECT_EQ(vals(b.grad()), (std::vector<double>{1, 1, 3, 3, 0, 0, 1, 1, 3, 3, 0, 0}));
  EXPECT_EQ(parts[0].gradFn(), parts[2].gradFn());
  // Each part's own backward, one after another, through the shared node (as a pipeline's
  // micro-batches of one batch do): the gradients add up.
  Tensor c = randn({4}).setRequiresGrad(true);
  auto halves = c.split(2, 0);
  halves[0].sum().backward();
  (halves[1] * 3.0).sum().backward();
  EXPECT_EQ(vals(c.grad()), (std::vector<double>{1, 1, 3, 3}));
}

TEST(ChunkSplit, Gradcheck) {
  Tensor a = randArg({5, 3});
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = in[0].chunk(3, 0);  // 2, 2, 1
        return p[0] * p[1] + p[2];
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = in[0].t().split(Shape{1, 3, 1}, 1);
        return p[1] * p[0];
      },
      {a}));
}

// ---- cat / stack ------------------------------------------------------------------------------------------

TEST(Cat, ValuesAndPromotion) {
  Tensor a = ar(6).view({2, 3});
  Tensor b = fromVector<float>({10, 11, 12}, {1, 3});
  EXPECT_EQ(vals(cat({a, b})), (std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12}));
  Tensor c = cat({a, a.t().t().slice(1, 0, 2)}, -1);
  EXPECT_EQ(c.sizes(), (Shape{2, 5}));
  EXPECT_EQ(vals(c), (std::vector<double>{0, 1, 2, 0, 1, 3, 4, 5, 3, 4}));
  EXPECT_FALSE(sharesStorage(c, a));
  // torch.cat: int64 + float32 -> float32; int32 + int64 -> int64; float16 + bfloat16 -> float32.
  Tensor p = cat({fromVector<int64_t>({1, 2}), fromVector<float>({0.5f})});
  EXPECT_EQ(p.dtype(), DType::Float32);
  EXPECT_EQ(vals(p), (std::vector<double>{1, 2, 0.5}));
  EXPECT_EQ(cat({fromVector<int32_t>({1, 2}), fromVector<int64_t>({3})}).dtype(), DType::Int64);
  EXPECT_EQ(cat({ones({1}, {.dtype = DType::Float16}), ones({1}, {.dtype = DType::BFloat16})}).dtype(), DType::Float32);
  EXPECT_EQ(cat({zeros({0, 3}), a}).sizes(), (Shape{2, 3}));
}

TEST(Cat, Errors) {
  Tensor a = zeros({2, 3});
  expectError<ValueError>([&] { cat({}); }, {"cat", "non-empty"});
  expectError<ValueError>([&] { cat({a, zeros({2, 4})}); }, {"cat", "[2, 4]", "[2, 3]"});
  expectError<ValueError>([&] { cat({a, zeros({3})}); }, {"cat", "[3]", "[2, 3]"});
  expectError<ValueError>([&] { cat({scalarTensor(1.0), scalarTensor(2.0)}); }, {"cat", "zero-dimensional"});
  expectError<IndexError>([&] { cat({a, a}, 2); }, {"cat", "dim 2"});
  expectError<ValueError>([&] { stack({a, zeros({3, 2})}); }, {"stack", "[3, 2]", "[2, 3]"});
  expectError<ValueError>([&] { stack({}); }, {"stack", "non-empty"});
}

TEST(Stack, Values) {
  Tensor a = ar(3), b = fromVector<float>({10, 11, 12});
  Tensor s0 = stack({a, b});
  EXPECT_EQ(s0.sizes(), (Shape{2, 3}));
  EXPECT_EQ(vals(s0), (std::vector<double>{0, 1, 2, 10, 11, 12}));
  Tensor s1 = stack({a, b}, -1);
  EXPECT_EQ(s1.sizes(), (Shape{3, 2}));
  EXPECT_EQ(vals(s1), (std::vector<double>{0, 10, 1, 11, 2, 12}));
  EXPECT_EQ(stack({scalarTensor(1.0), scalarTensor(2.0)}).sizes(), (Shape{2}));
  EXPECT_EQ(stack({fromVector<int64_t>({1}), fromVector<double>({2})}).dtype(), DType::Float64);
}

TEST(CatStack, Gradcheck) {
  Tensor a = randArg({2, 3}), b = randArg({4, 3}, 31), c = randArg({3, 2}, 32);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2].t()}, 0); }, {a, b, c}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return cat({in[0].t(), in[1]}, 1); }, {a, c}));
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return stack({in[0], in[1].slice(0, 0, 4, 2), in[0]}, 1);
      },
      {a, b}));
  Tensor v = randArg({3}, 33);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return stack({in[0].expand({2, 3}), in[0].unsqueeze(0).expand({2, 3})}, 2);
      },
      {v}));
}

// ---- contiguous / clone / to ------------------------------------------------------------------------------

TEST(Contiguous, SelfOrCopy) {
  Tensor a = ar(6).view({2, 3});
  EXPECT_TRUE(a.contiguous().isSameAs(a));
  Tensor t = a.t();
  Tensor c = t.contiguous();
  EXPECT_FALSE(sharesStorage(a, c));
  EXPECT_TRUE(c.isContiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_EQ(vals(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor e = fromVector<float>({1, 2}).expand({3, 2}).contiguous();
  EXPECT_EQ(vals(e), (std::vector<double>{1, 2, 1, 2, 1, 2}));
}

TEST(Clone, IndependentCopy) {
  Tensor a = ar(4);
  Tensor c = a.clone();
  EXPECT_FALSE(sharesStorage(a, c));
  c.fill_(3);
  EXPECT_EQ(vals(a), (std::vector<double>{0, 1, 2, 3}));
  Tensor s = ar(10).slice(0, 1, 10, 3).clone();
  EXPECT_TRUE(s.isContiguous());
  EXPECT_EQ(vals(s), (std::vector<double>{1, 4, 7}));
}

TEST(To, ConversionsMatchTorch) {
  Tensor a = ar(3);
  EXPECT_TRUE(a.to(DType::Float32).isSameAs(a));
  // torch.tensor([1.00390625, 1.01171875, -2.7, 2.7, 98304.]).to(torch.bfloat16): ties to even
  Tensor f = fromVector<float>({1.00390625f, 1.01171875f, -2.7f, 2.7f, 98304.0f});
  EXPECT_EQ(vals(f.to(DType::BFloat16)), (std::vector<double>{1.0, 1.015625, -2.703125, 2.703125, 98304.0}));
  // .to(torch.int64) truncates toward zero.
  EXPECT_EQ(f.to(DType::Int64).toVector<int64_t>(), (std::vector<int64_t>{1, 1, -2, 2, 98304}));
  // .half(): 1+2^-11 -> 1.0 (tie to even), 1+3*2^-11 -> 1.001953125, 70000 -> inf
  Tensor h = fromVector<double>({1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 70000.0}).to(DType::Float16);
  std::vector<double> hv = vals(h);
  EXPECT_EQ(hv[0], 1.0);
  EXPECT_EQ(hv[1], 1.001953125);
  EXPECT_TRUE(std::isinf(hv[2]));
  EXPECT_EQ(fromVector<float>({0.5f, 0.0f, -1.0f}).to(DType::Bool).toVector<bool>(),
            (std::vector<bool>{true, false, true}));
  EXPECT_EQ(vals(fromVector<int32_t>({-3, 7}).to(DType::Float64)), (std::vector<double>{-3, 7}));
  // Non-contiguous source.
  EXPECT_EQ(ar(6).view({2, 3}).t().to(DType::Int32).toVector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(CloneContiguousTo, Gradcheck) {
  Tensor a = randArg({3, 4});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0].t().contiguous() * in[0].t().clone(); }, {a}));
  // A float32 round trip is linear: a larger step keeps the rounding error small.
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) { return in[0].slice(1, 0, 4, 2).to(DType::Float32).to(DType::Float64); }, {a},
      1e-3, 1e-3, 1e-3));
  Tensor x = randArg({2, 2}, 41);
  x.to(DType::Float32).sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float64);
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{1, 1, 1, 1}));
}
