#include <gtest/gtest.h>

#include <cohort/cohort.h>

using namespace cohort;

TEST(Smoke, AddMulBackward) {
  Tensor a = fromVector<float>({1, 2, 3}).setRequiresGrad();
  Tensor b = fromVector<float>({4, 5, 6}).setRequiresGrad();
  Tensor c = (a * b + a).sum();
  EXPECT_FLOAT_EQ(c.item<float>(), 4 + 10 + 18 + 6);
  c.backward();
  EXPECT_EQ(a.grad().toVector<float>(), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(b.grad().toVector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(Smoke, MatmulBackward) {
  Tensor a = fromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).setRequiresGrad();
  Tensor b = fromVector<double>({1, 0, 0, 1, 1, 1}, {3, 2}).setRequiresGrad();
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.toVector<double>(), (std::vector<double>{4, 5, 10, 11}));
  c.sum().backward();
  EXPECT_EQ(a.grad().toVector<double>(), (std::vector<double>{1, 1, 2, 1, 1, 2}));
}

#include "core/gradcheck.h"

TEST(Smoke, GradcheckBroadcastAndViews) {
  using cohort::testing::gradcheck;
  using cohort::testing::randArg;
  Tensor a = randArg({3, 4}), b = randArg({4}, 8);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[1] + in[0] / (in[1] + 3.0); }, {a, b}));
  // Non-contiguous input: a transposed view of a leaf.
  Tensor c = randArg({4, 3}, 9);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0].t(), in[1].slice(1, 0, 3, 2)); },
                        {c, randArg({4, 2}, 10)}));
}
