// Indexing ops (core/ops/index.cc): values against PyTorch, float64 gradchecks (including
// non-contiguous inputs), and bad inputs giving typed errors that name the op and the values.
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

void expectValues(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  std::vector<double> got = t.to(DType::Float64).toVector<double>();
  ASSERT_EQ(got.size(), want.size()) << t;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

Tensor arange24() { return arange(0, 24, 1, {.dtype = DType::Float32}).view({2, 3, 4}); }

Tensor idx64(const std::vector<int64_t>& v, const Shape& s = {}) { return fromVector<int64_t>(v, s); }

}  // namespace

// ---- index_select ------------------------------------------------------------------------------

TEST(IndexSelect, ValuesMatchTorch) {
  // torch.arange(24.).view(2,3,4).index_select(1, torch.tensor([2,0,2])) and (2, [3,1]).
  Tensor a = arange24();
  Tensor r1 = indexSelect(a, 1, idx64({2, 0, 2}));
  EXPECT_EQ(r1.sizes(), (Shape{2, 3, 4}));
  expectValues(r1, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 20, 21, 22, 23, 12, 13, 14, 15, 20, 21, 22, 23});
  Tensor r2 = a.indexSelect(-1, fromVector<int32_t>({3, 1}));  // int32 index, negative dim
  EXPECT_EQ(r2.sizes(), (Shape{2, 3, 2}));
  expectValues(r2, {3, 1, 7, 5, 11, 9, 15, 13, 19, 17, 23, 21});
  // Non-contiguous input: the transposed view selects the same as its contiguous copy.
  Tensor at = a.transpose(0, 2);
  expectValues(indexSelect(at, 0, idx64({1, 1})), indexSelect(at.contiguous(), 0, idx64({1, 1})).toVector<double>());
  // 0-d index keeps the dim with size 1 (torch).
  EXPECT_EQ(indexSelect(a, 1, scalarTensor(2, {.dtype = DType::Int64})).sizes(), (Shape{2, 1, 4}));
  // Empty index.
  EXPECT_EQ(indexSelect(a, 0, fromVector<int64_t>({}, {0})).sizes(), (Shape{0, 3, 4}));
  // Integer payloads.
  Tensor ai = arange(0, 6, 1, {.dtype = DType::Int64}).view({3, 2});
  EXPECT_EQ(indexSelect(ai, 0, idx64({2, 0})).toVector<int64_t>(), (std::vector<int64_t>{4, 5, 0, 1}));
}

TEST(IndexSelect, Gradcheck) {
  Tensor a = randArg({4, 3});
  // Repeated indices accumulate.
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return indexSelect(in[0], 0, idx64({3, 0, 3, 1})); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return indexSelect(in[0], 1, idx64({2, 2})); }, {a}));
  // Through a transposed (non-contiguous) view.
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return indexSelect(in[0].t(), 1, idx64({0, 3, 0}));
      },
      {a}));
  // Expanded input.
  Tensor b = randArg({3}, 11);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        return indexSelect(in[0].expand({4, 3}), 0, idx64({1, 2}));
      },
      {b}));
}

TEST(IndexSelect, BadInputs) {
  Tensor a = arange24();
  expectError<IndexError>([&] { indexSelect(a, 1, idx64({0, 3})); }, {"indexSelect", "index 3", "dim 1", "size 3"});
  expectError<IndexError>([&] { indexSelect(a, 2, idx64({-1})); }, {"indexSelect", "index -1", "size 4"});
  expectError<IndexError>([&] { indexSelect(a, 3, idx64({0})); }, {"indexSelect", "dim 3"});
  expectError<ValueError>([&] { indexSelect(a, 0, fromVector<float>({0})); },
                          {"indexSelect", "int64 or int32", "float32"});
  expectError<ValueError>([&] { indexSelect(a, 0, idx64({0, 1}, {1, 2})); }, {"indexSelect", "[1, 2]"});
}

// ---- gather ------------------------------------------------------------------------------------

TEST(Gather, ValuesMatchTorch) {
  Tensor a = arange24();
  // torch.arange(24.).view(2,3,4).gather(1, idx) with idx [2,2,4] below.
  Tensor i1 = idx64({0, 2, 1, 0, 2, 2, 0, 1, 1, 0, 0, 2, 0, 1, 2, 2}, {2, 2, 4});
  Tensor g1 = gather(a, 1, i1);
  EXPECT_EQ(g1.sizes(), (Shape{2, 2, 4}));
  expectValues(g1, {0, 9, 6, 3, 8, 9, 2, 7, 16, 13, 14, 23, 12, 17, 22, 23});
  // gather(2, idx2) with idx2 [2,3,2], as int32.
  Tensor i2 = fromVector<int32_t>({3, 0, 1, 1, 2, 0, 0, 0, 3, 2, 1, 3}, {2, 3, 2});
  expectValues(a.gather(-1, i2), {3, 0, 5, 5, 10, 8, 12, 12, 19, 18, 21, 23});
  // A transposed input reads through its strides.
  Tensor at = a.transpose(1, 2);  // [2,4,3]
  Tensor i3 = idx64({2, 0, 1, 1}, {1, 2, 2});
  expectValues(gather(at, 2, i3), gather(at.contiguous(), 2, i3).toVector<double>());
  // A non-contiguous index.
  Tensor i4 = idx64({0, 1, 2, 2, 1, 0}, {2, 3}).t();  // [3,2]
  Tensor m = arange(0, 6, 1, {.dtype = DType::Float64}).view({3, 2});
  expectValues(gather(m, 0, i4), {0, 5, 2, 3, 4, 1});
}

TEST(Gather, Gradcheck) {
  Tensor a = randArg({3, 4});
  Tensor idx = idx64({0, 0, 3, 1, 2, 2, 2, 0}, {2, 4});
  // Repeats in the index accumulate; index smaller than input in dim 0.
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return gather(in[0], 1, idx); }, {a}));
  Tensor idx0 = idx64({2, 0, 1, 2, 0, 0}, {2, 3});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return gather(in[0].t(), 0, idx0); }, {a}));
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return gather(in[0].slice(1, 0, 4, 2), 1, idx64({1, 0, 1}, {3, 1}));
      },
      {a}));
}

TEST(Gather, BadInputs) {
  Tensor a = arange24();
  expectError<IndexError>([&] { gather(a, 1, idx64({0, 5}, {1, 1, 2})); }, {"gather", "index 5", "dim 1", "size 3"});
  expectError<ValueError>([&] { gather(a, 1, idx64({0, 1})); }, {"gather", "[2]", "[2, 3, 4]"});
  expectError<ValueError>(
      [&] {
        gather(a, 1, zeros({3, 1, 1}, {.dtype = DType::Int64}));
      },
      {"gather", "[3, 1, 1]", "dim 0"});
  expectError<ValueError>([&] { gather(a, 1, zeros({1, 1, 1}, {.dtype = DType::UInt8})); }, {"gather", "uint8"});
}

// ---- scatter_add -------------------------------------------------------------------------------

TEST(ScatterAdd, ValuesMatchTorch) {
  // torch.zeros(3,4).scatter_add(0, [[0,1,2,0],[2,0,0,1]], arange(1,13).view(3,4)); the src is
  // larger than the index, so its last row is unused.
  Tensor z = zeros({3, 4});
  Tensor src = arange(1, 13, 1).view({3, 4});
  Tensor r0 = scatterAdd(z, 0, idx64({0, 1, 2, 0, 2, 0, 0, 1}, {2, 4}), src);
  expectValues(r0, {1, 6, 7, 4, 0, 2, 0, 8, 5, 0, 3, 0});
  Tensor r1 = z.scatterAdd(1, fromVector<int32_t>({3, 3, 0, 1, 2, 1, 0, 0, 0}, {3, 3}), src);
  expectValues(r1, {3, 0, 0, 3, 0, 12, 6, 0, 30, 0, 0, 0});
  EXPECT_EQ(z.toVector<float>(), std::vector<float>(12, 0.0f));  // out of place
  // Non-zero base, integer dtype, non-contiguous src.
  Tensor base = ones({2, 3}, {.dtype = DType::Int64});
  Tensor s = arange(0, 6, 1, {.dtype = DType::Int64}).view({3, 2}).t();  // [[0,2,4],[1,3,5]]
  Tensor r2 = scatterAdd(base, 1, idx64({2, 2, 2, 0, 1, 0}, {2, 3}), s);
  EXPECT_EQ(r2.toVector<int64_t>(), (std::vector<int64_t>{1, 1, 7, 7, 4, 1}));
}

TEST(ScatterAdd, Gradcheck) {
  Tensor self = randArg({3, 4});
  Tensor src = randArg({2, 5}, 12);  // larger than the index in dim 1
  Tensor idx = idx64({0, 2, 2, 1, 1, 1, 0, 2}, {2, 4});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return scatterAdd(in[0], 0, idx, in[1]); }, {self, src}));
  // Non-contiguous self and src.
  Tensor selfT = randArg({4, 3}, 13);
  Tensor srcT = randArg({4, 2}, 14);
  Tensor idx1 = idx64({3, 0, 3, 1, 1, 2}, {2, 3});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return scatterAdd(in[0].t(), 1, idx1, in[1].t()); },
                        {selfT, srcT}));
}

TEST(ScatterAdd, BadInputs) {
  Tensor z = zeros({3, 4});
  Tensor src = ones({3, 4});
  expectError<IndexError>(
      [&] {
        scatterAdd(z, 1, idx64({4}, {1, 1}), src);
      },
      {"scatterAdd", "index 4", "dim 1", "size 4"});
  expectError<ValueError>(
      [&] {
        scatterAdd(z, 1, zeros({1, 5}, {.dtype = DType::Int64}), src);
      },
      {"scatterAdd", "[1, 5]"});
  expectError<ValueError>(
      [&] {
        scatterAdd(z, 1, zeros({1, 1}, {.dtype = DType::Int64}), ones({3, 4}, {.dtype = DType::Float64}));
      },
      {"scatterAdd", "float64", "float32"});
  expectError<ValueError>(
      [&] {
        scatterAdd(z, 1, zeros({4, 1}, {.dtype = DType::Int64}), ones({5, 4}));
      },
      {"scatterAdd", "[4, 1]", "[3, 4]"});
}

// ---- masked_fill -------------------------------------------------------------------------------

TEST(MaskedFill, ValuesAndBroadcast) {
  Tensor a = arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3});
  Tensor mask = fromVector<bool>({true, false, true}, {1, 3});
  expectValues(maskedFill(a, mask, -1.5), {-1.5, 1, -1.5, -1.5, 4, -1.5});
  expectValues(a.t().maskedFill(fromVector<bool>({false, true}), 9), {0, 9, 1, 9, 2, 9});  // non-contiguous input
  Tensor ai = arange(0, 4, 1, {.dtype = DType::Int64});
  EXPECT_EQ(maskedFill(ai, fromVector<bool>({true, false, false, true}), 7).toVector<int64_t>(),
            (std::vector<int64_t>{7, 1, 2, 7}));
  // A mask with more dims broadcasts the result (as torch's out-of-place masked_fill).
  EXPECT_EQ(maskedFill(fromVector<float>({1, 2}), fromVector<bool>({true, false, false, true}, {2, 2}), 0).sizes(),
            (Shape{2, 2}));
  Tensor h = fromVector<float>({1, 2, 3}).to(DType::BFloat16);
  expectValues(maskedFill(h, fromVector<bool>({false, true, false}), 0.5), {1, 0.5, 3});
}

TEST(MaskedFill, Gradcheck) {
  Tensor a = randArg({3, 4});
  Tensor mask = fromVector<bool>({true, false, false, true}, {4});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return maskedFill(in[0], mask, 2.0) * in[0]; }, {a}));
  Tensor m2 = fromVector<bool>({false, true, true}, {3, 1});
  EXPECT_TRUE(
      gradcheck([&](const std::vector<Tensor>& in) { return maskedFill(in[0].t().slice(0, 0, 4, 2), m2.t(), 0.0); },
                {a}));
  // Input broadcast by the mask: gradients sum back.
  Tensor b = randArg({4}, 15);
  Tensor m3 = fromVector<bool>({true, false, false, true, false, false, true, true}, {2, 4});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return maskedFill(in[0], m3, 1.0); }, {b}));
}

TEST(MaskedFill, BadInputs) {
  Tensor a = zeros({2, 3});
  expectError<ValueError>([&] { maskedFill(a, zeros({2, 3}), 1); }, {"maskedFill", "bool", "float32"});
  expectError<ValueError>([&] { maskedFill(a, fromVector<bool>({true, false}), 1); }, {"maskedFill", "[2, 3]", "[2]"});
}

// ---- tril / triu ---------------------------------------------------------------------------------

TEST(Triangle, ValuesMatchTorch) {
  // torch.arange(12.).view(3,4).tril(), .tril(-1), .triu(1), .triu(-2)
  Tensor m = arange(0, 12, 1).view({3, 4});
  expectValues(tril(m), {0, 0, 0, 0, 4, 5, 0, 0, 8, 9, 10, 0});
  expectValues(m.tril(-1), {0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0});
  expectValues(m.triu(1), {0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11});
  expectValues(triu(m, -2), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  // torch.arange(12.).view(4,3).tril(2) / .triu(2)
  Tensor n = arange(0, 12, 1).view({4, 3});
  expectValues(tril(n, 2), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  expectValues(triu(n, 2), {0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  expectValues(tril(n, -10), std::vector<double>(12, 0));
  // Batched, non-contiguous: each matrix of a [2,3,3] transposed batch.
  Tensor b = arange(0, 18, 1, {.dtype = DType::Int64}).view({2, 3, 3}).transpose(1, 2);
  EXPECT_EQ(triu(b).toVector<int64_t>(),
            (std::vector<int64_t>{0, 3, 6, 0, 4, 7, 0, 0, 8, 9, 12, 15, 0, 13, 16, 0, 0, 17}));
}

TEST(Triangle, Gradcheck) {
  Tensor a = randArg({2, 3, 4});
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return tril(in[0], 1); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return triu(in[0].transpose(1, 2), -1); }, {a}));
  Tensor v = randArg({3}, 16);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return tril(in[0].expand({3, 3})); }, {v}));
}

TEST(Triangle, BadInputs) {
  expectError<ValueError>([] { tril(zeros({3}), 0); }, {"tril", "[3]"});
  expectError<ValueError>([] { triu(scalarTensor(1.0), 0); }, {"triu", "[]"});
}

// ---- one_hot ---------------------------------------------------------------------------------------

TEST(OneHot, ValuesMatchTorch) {
  // torch.nn.functional.one_hot(torch.tensor([[0,2],[1,3]])) and one_hot([1,0], 4)
  Tensor r = oneHot(idx64({0, 2, 1, 3}, {2, 2}));
  EXPECT_EQ(r.dtype(), DType::Int64);
  EXPECT_EQ(r.sizes(), (Shape{2, 2, 4}));
  EXPECT_EQ(r.toVector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(oneHot(fromVector<int32_t>({1, 0}), 4).toVector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(oneHot(fromVector<int64_t>({}, {0}), 3).sizes(), (Shape{0, 3}));
  EXPECT_EQ(oneHot(idx64({2, 0, 1}, {3}).slice(0, 0, 3, 2), 3).toVector<int64_t>(),
            (std::vector<int64_t>{0, 0, 1, 0, 1, 0}));
}

TEST(OneHot, BadInputs) {
  expectError<IndexError>([] { oneHot(idx64({0, -1})); }, {"oneHot", "-1"});
  expectError<IndexError>([] { oneHot(idx64({0, 5}), 3); }, {"oneHot", "5", "3 classes"});
  expectError<ValueError>([] { oneHot(fromVector<int64_t>({}, {0})); }, {"oneHot", "empty"});
  expectError<ValueError>([] { oneHot(fromVector<float>({1})); }, {"oneHot", "float32"});
}
