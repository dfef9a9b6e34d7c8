// In-place elementwise members: values, broadcasting of the other operand, dtype rules, the
// version counter, autograd through in-place ops, and the errors that must come before any write.
#include <gtest/gtest.h>

#include <cohort/cohort.h>

#include "core/gradcheck.h"
#include "core/test_util.h"

using namespace cohort;
using cohort::testing::expectError;
using cohort::testing::gradcheck;
using cohort::testing::randArg;
using In = std::vector<Tensor>;

namespace {
std::vector<double> vals(const Tensor& t) { return t.to(DType::Float64).toVector<double>(); }

}  // namespace

TEST(Inplace, Values) {
  Tensor a = fromVector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = fromVector<float>({10, 20}, {1, 2});  // broadcast over rows
  a.add_(b, 0.5);
  EXPECT_EQ(vals(a), (std::vector<double>{6, 12, 8, 14}));
  a.add_(1);
  EXPECT_EQ(vals(a), (std::vector<double>{7, 13, 9, 15}));
  a.sub_(b);
  EXPECT_EQ(vals(a), (std::vector<double>{-3, -7, -1, -5}));
  a.sub_(b, 0.1);
  EXPECT_EQ(vals(a), (std::vector<double>{-3 - 1.0f, -7 - 2.0f, -1 - 1.0f, -5 - 2.0f}));
  a.mul_(b);
  EXPECT_EQ(vals(a), (std::vector<double>{-40, -180, -20, -140}));
  a.mul_(0.5);
  EXPECT_EQ(vals(a), (std::vector<double>{-20, -90, -10, -70}));
  a.div_(b);
  EXPECT_EQ(vals(a), (std::vector<double>{-2, -4.5, -1, -3.5}));
  a.div_(4);
  EXPECT_EQ(vals(a), (std::vector<double>{-0.5, -1.125, -0.25, -0.875}));
  // self += value * t1 * t2 and self += value * t1 / t2 (Adam's update shapes).
  Tensor p = fromVector<double>({1, 2, 3});
  p.addcmul_(fromVector<double>({1, 2, 3}), fromVector<double>({2}), -0.5);
  EXPECT_EQ(vals(p), (std::vector<double>{0, 0, 0}));
  p.addcdiv_(fromVector<double>({1, 2, 3}), fromVector<double>({4, 4, 4}), 2);
  EXPECT_EQ(vals(p), (std::vector<double>{0.5, 1, 1.5}));
  // lerp_: self + w (end - self); weight 1 gives exactly end.
  Tensor l = fromVector<float>({0, 10});
  l.lerp_(fromVector<float>({10, 20}), 0.25);
  EXPECT_EQ(vals(l), (std::vector<double>{2.5, 12.5}));
  l.lerp_(fromVector<float>({0.1f, 0.3f}), 1.0);
  EXPECT_EQ(vals(l), (std::vector<double>{0.1f, 0.3f}));
  // clamp_, sqrt_, maskedFill_ (mask broadcast over rows).
  Tensor c = fromVector<float>({-2, 0.5, 9});
  c.clamp_(0.0, 4.0);
  EXPECT_EQ(vals(c), (std::vector<double>{0, 0.5, 4}));
  c.sqrt_();
  EXPECT_EQ(vals(c), (std::vector<double>{0, std::sqrt(0.5f), 2}));
  Tensor m = zeros({2, 3});
  m.maskedFill_(fromVector<bool>({true, false, true}), 7);
  EXPECT_EQ(vals(m), (std::vector<double>{7, 0, 7, 7, 0, 7}));
  // Integer tensors with integer operands stay integer.
  Tensor i = fromVector<int64_t>({1, 2, 3});
  i.add_(fromVector<int64_t>({1, 1, 1}), 2).mul_(3).clamp_(0, 10);
  EXPECT_EQ(i.toVector<int64_t>(), (std::vector<int64_t>{9, 10, 10}));
}

TEST(Inplace, NonContiguousSelfAndOperands) {
  // self a transposed view: the update lands in the right elements of the base.
  Tensor base = fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = base.t();  // [3, 2]
  v.add_(fromVector<float>({100, 200}, {1, 2}));
  EXPECT_EQ(vals(base), (std::vector<double>{101, 102, 103, 204, 205, 206}));
  // A sliced self and a transposed operand.
  Tensor big = zeros({2, 6});
  Tensor s = big.slice(1, 0, 6, 2);  // [2, 3], stride 2
  s.addcmul_(fromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).t(), fromVector<float>({2}), 1);
  EXPECT_EQ(vals(big), (std::vector<double>{2, 0, 6, 0, 10, 0, 4, 0, 8, 0, 12, 0}));
  // A large contiguous update (the vectorized path) agrees with the strided one.
  Generator g(5);
  Tensor x = randn({1000, 37}, {}, &g), y = randn({1000, 37}, {}, &g), z = rand({1000, 37}, {}, &g) + 0.5;
  Tensor x1 = x.clone(), x2 = x.t().contiguous().t();  // same values, column-major
  x1.addcdiv_(y, z, 0.3).lerp_(y, 0.1).mul_(z);
  x2.addcdiv_(y, z, 0.3).lerp_(y, 0.1).mul_(z);
  EXPECT_EQ(vals(x1), vals(x2));
}

TEST(Inplace, MixedDtypesComputeInPromotedTypeAndRoundOnce) {
  // torch.tensor([1., 2.], dtype=torch.float16).add_(torch.tensor([1e-3, 1e-3])) -> [1.0010, 2.0020]
  Tensor h = fromVector<float>({1.0f, 2.0f}).to(DType::Float16);
  h.add_(fromVector<float>({1e-3f, 1e-3f}));
  EXPECT_EQ(h.dtype(), DType::Float16);
  EXPECT_EQ(vals(h), (std::vector<double>{static_cast<float>(Half(1.001f)), static_cast<float>(Half(2.001f))}));
  // A bfloat16 parameter updated from float32 moments: one rounding of the float32 result.
  Tensor p = fromVector<float>({1.0f}).to(DType::BFloat16);
  p.addcdiv_(fromVector<float>({0.003f}), fromVector<float>({0.7f}), -1.0);
  EXPECT_EQ(vals(p)[0], static_cast<float>(BFloat16(1.0f + -1.0f * 0.003f / 0.7f)));
  // float64 other into float32 self.
  Tensor f = fromVector<float>({1.0f});
  f.mul_(fromVector<double>({1.0 / 3}));
  EXPECT_EQ(vals(f)[0], static_cast<float>(1.0 / 3));
}

TEST(Inplace, ErrorsComeBeforeAnyWrite) {
  Tensor a = fromVector<float>({1, 2, 3});
  // The other operand would change self's shape.
  expectError<ValueError>([&] { a.add_(zeros({2, 3})); }, {"add_", "[2, 3]", "[3]"});
  expectError<ValueError>([&] { a.mul_(zeros({4})); }, {"mul_", "[4]", "[3]"});
  expectError<ValueError>([&] { a.addcmul_(zeros({3}), zeros({2, 1})); }, {"addcmul_", "[2, 1]", "[3]"});
  expectError<ValueError>([&] { a.maskedFill_(fromVector<bool>({true, false}), 0); }, {"maskedFill_", "[2]"});
  EXPECT_EQ(vals(a), (std::vector<double>{1, 2, 3}));
  // Integer tensors cannot take floating results (torch: "result type Float can't be cast").
  Tensor i = fromVector<int64_t>({1, 2});
  expectError<ValueError>([&] { i.add_(0.5); }, {"add_", "float32", "int64"});
  expectError<ValueError>([&] { i.mul_(fromVector<float>({0.5f, 1.0f})); }, {"mul_", "float32", "int64"});
  expectError<ValueError>([&] { i.div_(2); }, {"div_", "int64"});
  expectError<ValueError>([&] { i.add_(fromVector<int64_t>({1, 1}), 0.5); }, {"add_"});
  expectError<ValueError>([&] { i.sqrt_(); }, {"sqrt_"});
  expectError<ValueError>([&] { i.addcdiv_(i, i); }, {"addcdiv_", "int64"});
  EXPECT_EQ(i.toVector<int64_t>(), (std::vector<int64_t>{1, 2}));
  // A mask that is not bool; clamp_ with no bounds; an expanded (self-overlapping) self.
  expectError<ValueError>([&] { a.maskedFill_(fromVector<int64_t>({1, 0, 1}), 0); }, {"maskedFill_", "int64"});
  expectError<ValueError>([&] { a.clamp_(std::nullopt, std::nullopt); }, {"clamp_"});
  Tensor e = fromVector<float>({1}).expand({3});
  expectError<ValueError>([&] { e.add_(1); }, {"add_", "[3]"});
  EXPECT_THROW(Tensor().add_(1), ValueError);
}

TEST(Inplace, LeafRequiringGradIsRefused) {
  Tensor w = fromVector<float>({1, 2}).setRequiresGrad();
  expectError<ValueError>([&] { w.add_(1); }, {"add_", "leaf"});
  expectError<ValueError>([&] { w.mul_(fromVector<float>({2, 2})); }, {"mul_", "leaf"});
  expectError<ValueError>([&] { w.addcmul_(w.detach(), w.detach()); }, {"addcmul_", "leaf"});
  expectError<ValueError>([&] { w.lerp_(zeros({2}), 0.5); }, {"lerp_", "leaf"});
  expectError<ValueError>([&] { w.clamp_(0, 1); }, {"clamp_", "leaf"});
  expectError<ValueError>([&] { w.sqrt_(); }, {"sqrt_", "leaf"});
  EXPECT_EQ(vals(w), (std::vector<double>{1, 2}));
  // Under NoGradGuard (an optimizer step) it is allowed and bumps the version.
  uint32_t v0 = w.version();
  {
    autograd::NoGradGuard ng;
    w.add_(fromVector<float>({1, 1}), -0.5);
    w.mul_(2);
  }
  EXPECT_EQ(vals(w), (std::vector<double>{1, 3}));
  EXPECT_GE(w.version(), v0 + 2);
}

TEST(Inplace, ModifyingASavedTensorIsDetectedInBackward) {
  // exp saves its output; changing it in place must make backward fail naming exp.
  Tensor x = fromVector<double>({0.1, 0.2}).setRequiresGrad();
  Tensor y = exp(x);
  Tensor loss = y.sum();
  {
    autograd::NoGradGuard ng;
    y.mul_(2.0);
  }
  expectError<Error>([&] { loss.backward(); }, {"exp", "in-place"});
  // mul saves both inputs: modifying one through add_ (recorded, grad on) also fails.
  Tensor a = fromVector<double>({1, 2}).setRequiresGrad();
  Tensor b = a * 1.0;
  Tensor c = b * b;
  b.add_(1);
  expectError<Error>([&] { c.sum().backward(); }, {"mul", "version"});
  // log saves its input: clamping that input in place afterwards breaks log's backward.
  Tensor s = sigmoid(fromVector<double>({0.3}).setRequiresGrad());
  Tensor t = s * 3.0;
  Tensor u = log(t);
  t.clamp_(0, 0.5);
  expectError<Error>([&] { u.sum().backward(); }, {"log"});
}

TEST(Inplace, AutogradThroughInplaceOps) {
  // In-place ops on a non-leaf record their backward: gradcheck f(in) = clone(in0) op_ ...
  Tensor a = randArg({3, 4}, 41), b = randArg({4}, 42), c = randArg({3, 1}, 43);
  Tensor pos = (randArg({4}, 44).detach() + 2.0).setRequiresGrad();
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.add_(in[1], 0.7);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.sub_(in[1], 2);
        return t;
      },
      {a, c}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.mul_(in[1]);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.div_(in[1]);
        return t;
      },
      {a, pos}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.mul_(3).add_(2).div_(4);
        return t;
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.addcmul_(in[1], in[2], 0.5);
        return t;
      },
      {a, b, c}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.addcdiv_(in[1], in[2], -1.5);
        return t;
      },
      {a, c, pos}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.lerp_(in[1], 0.3);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.lerp_(in[1], 0.8);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.clamp_(-0.3, 0.4);
        return t;
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0] * 1.0;
        t.sqrt_();
        return t;
      },
      {pos}));
  Tensor mask = fromVector<bool>({true, false, false, true});
  EXPECT_TRUE(gradcheck(
      [&](const In& in) {
        Tensor t = in[0] * 1.0;
        t.maskedFill_(mask, 2.0);
        return t;
      },
      {a}));
  // Non-contiguous operands: transposed and sliced.
  Tensor at = randArg({4, 3}, 45), bs = randArg({3, 8}, 46);
  EXPECT_TRUE(gradcheck(
      [](const In& in) {
        Tensor t = in[0].t() * 1.0;
        t.addcmul_(in[1].slice(1, 0, 8, 2), in[1].slice(1, 1, 8, 2));
        return t;
      },
      {at, bs}));
  // A leaf that does not require grad updated in place by a tensor that does.
  Tensor w = randArg({3}, 47);
  Tensor buf = zeros({3}, {.dtype = DType::Float64});
  buf.add_(w, 2.0);
  buf.sum().backward();
  EXPECT_EQ(vals(w.grad()), (std::vector<double>{2, 2, 2}));
}
