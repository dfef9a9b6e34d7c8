// The coalescing helper (distributed/detail/coalesce.h): layouts and their errors, pack/unpack round
// trips (mixed shapes, 0-element and non-contiguous tensors), the byte forms, and views that alias
// the flat buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/detail/coalesce.h>

namespace cohort::dist::detail {
namespace {

std::vector<float> values(const Tensor& t) {
  Tensor c = t.contiguous();
  const float* p = c.data<float>();
  return {p, p + c.numel()};
}

// Tensors of mixed shapes: a matrix, a 0-element tensor, a scalar-shaped one and a vector.
std::vector<Tensor> mixed() {
  return {arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3}), empty({0, 4}, {.dtype = DType::Float32}),
          full({1}, 7.0, {.dtype = DType::Float32}), arange(10, 14, 1, {.dtype = DType::Float32})};
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(Coalesce, LayoutOffsetsAndTotal) {
  const auto ts = mixed();
  const FlatLayout l = FlatLayout::of(ts, "test");
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 6, 6, 7}));
  EXPECT_EQ(l.numels, (std::vector<int64_t>{6, 0, 1, 4}));
  EXPECT_EQ(l.total, 11);
  EXPECT_EQ(l.nbytes(), 44u);
  EXPECT_EQ(l.dtype, DType::Float32);
  EXPECT_EQ(l.shapes[1], (Shape{0, 4}));
  EXPECT_EQ(packedNumel(ts), 11);
  EXPECT_EQ(packedBytes(ts), 44u);

  const FlatLayout s = FlatLayout::ofShapes({{3, 2}, {0}, {5}}, DType::Float64);
  EXPECT_EQ(s.offsets, (std::vector<int64_t>{0, 6, 6}));
  EXPECT_EQ(s.total, 11);
  EXPECT_EQ(s.nbytes(), 88u);
}

TEST(Coalesce, PackUnpackRoundTrip) {
  const auto ts = mixed();
  const FlatLayout l = FlatLayout::of(ts, "test");
  Tensor flat = pack(ts, l);
  EXPECT_EQ(values(flat), (std::vector<float>{0, 1, 2, 3, 4, 5, 7, 10, 11, 12, 13}));
  std::vector<Tensor> back = {zeros({2, 3}), empty({0, 4}), zeros({1}), zeros({4})};
  unpack(flat, back, l);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(values(back[i]), values(ts[i])) << "tensor " << i;
}

TEST(Coalesce, PackUnpackNonContiguous) {
  Tensor m = arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3});
  Tensor mt = m.t();  // [3, 2], not contiguous
  ASSERT_FALSE(mt.isContiguous());
  std::vector<Tensor> ts = {mt, full({2}, 9.0, {.dtype = DType::Float32})};
  const FlatLayout l = FlatLayout::of(ts, "test");
  Tensor flat = pack(ts, l);
  EXPECT_EQ(values(flat), (std::vector<float>{0, 3, 1, 4, 2, 5, 9, 9}));

  Tensor target = zeros({2, 3});
  std::vector<Tensor> outs = {target.t(), zeros({2})};
  unpack(flat, outs, l);
  EXPECT_EQ(values(target), values(m));
  EXPECT_EQ(values(outs[1]), (std::vector<float>{9, 9}));

  std::vector<Tensor> tooFew = {zeros({3, 2})};
  EXPECT_NE(errorOf([&] { unpack(flat, tooFew, l); }).find("1 tensors for a layout of 2 entries"), std::string::npos);
}

TEST(Coalesce, BytesRoundTripAndNonContiguousError) {
  const auto ts = mixed();
  std::vector<float> buf(packedNumel(ts));
  packBytes(ts, buf.data(), "test");
  EXPECT_EQ(buf, (std::vector<float>{0, 1, 2, 3, 4, 5, 7, 10, 11, 12, 13}));
  std::vector<Tensor> back = {zeros({2, 3}), empty({0, 4}), zeros({1}), zeros({4})};
  unpackBytes(buf.data(), back, "test");
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(values(back[i]), values(ts[i])) << "tensor " << i;

  std::vector<Tensor> strided = {zeros({2}), zeros({2, 3}).t()};
  const std::string e = errorOf([&] { packBytes(strided, buf.data(), "allreduce_coalesced"); });
  EXPECT_NE(e.find("allreduce_coalesced: tensor 1 must be a contiguous"), std::string::npos) << e;
  EXPECT_NE(errorOf([&] { unpackBytes(buf.data(), strided, "x"); }).find("tensor 1"), std::string::npos);
}

TEST(Coalesce, MixedDtypesNameTheIndex) {
  std::vector<Tensor> ts = {zeros({2}), zeros({3}), zeros({1}, {.dtype = DType::Int64})};
  const std::string e = errorOf([&] { FlatLayout::of(ts, "allreduce_coalesced"); });
  EXPECT_NE(e.find("allreduce_coalesced: tensor 2 has dtype int64, but tensor 0 has dtype float32"), std::string::npos)
      << e;
  EXPECT_NE(errorOf([] { FlatLayout::of({}, "x"); }).find("no tensors"), std::string::npos);
  EXPECT_NE(errorOf([] {
              FlatLayout::of({zeros({1}), Tensor()}, "x");
            }).find("tensor 1 is undefined"),
            std::string::npos);
}

TEST(Coalesce, ViewsAliasTheBuffer) {
  const FlatLayout l = FlatLayout::of(mixed(), "test");
  Tensor flat = zeros({l.total});
  std::vector<Tensor> vs = views(flat, l);
  ASSERT_EQ(vs.size(), 4u);
  EXPECT_EQ(vs[0].sizes(), (Shape{2, 3}));
  EXPECT_EQ(vs[1].numel(), 0);
  vs[0].copy_(full({2, 3}, 1.0));
  vs[3].copy_(full({4}, 2.0));
  EXPECT_EQ(values(flat), (std::vector<float>{1, 1, 1, 1, 1, 1, 0, 2, 2, 2, 2}));
  flat.narrow(0, 6, 1).copy_(full({1}, 5.0));
  EXPECT_EQ(values(vs[2]), (std::vector<float>{5}));

  const std::string e = errorOf([&] { views(zeros({3}), l); });
  EXPECT_NE(e.find("needs 11 elements"), std::string::npos) << e;
}

}  // namespace
}  // namespace cohort::dist::detail
