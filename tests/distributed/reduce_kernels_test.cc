// The shared reduction kernels (distributed/detail/reduce_kernels.h) against a straightforward
// reference: accumulate source by source in Acc<T>, divide once for avg, round once on store. Every
// dtype and op, lengths that are not multiples of the block or of a vector, several sources and
// outputs (an output may be a source), and NaN staying where it was accumulated first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/tensor/dtype.h>
#include <cohort/distributed/detail/reduce_kernels.h>

namespace cohort::dist {
namespace {

constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
constexpr DType kDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                             DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};
// 1 element, a vector's worth and odd, past one 8 KiB block, and a few blocks and a tail.
constexpr size_t kLengths[] = {1, 7, 33, 1000, 2049, 3 * 4096 + 5};

template <typename T>
T sample(std::mt19937& rng) {
  if constexpr (std::is_same_v<T, bool>) {
    return std::uniform_int_distribution<int>(0, 1)(rng) != 0;
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<T>(std::uniform_int_distribution<int>(0, 3)(rng));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::uniform_int_distribution<int>(-3, 3)(rng));
  } else {
    // Quarter steps: exact in every float type, so sums differ only where the order of rounding does.
    return static_cast<T>(std::uniform_int_distribution<int>(-12, 12)(rng) * 0.25f);
  }
}

// Element storage of a logical type (bool as its byte, not std::vector<bool>'s bits).
template <typename T>
using Elem = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
template <typename T>
using Vec = std::vector<Elem<T>>;

// The reference: written plainly, one element at a time, in source order.
template <typename T>
Elem<T> reference(const std::vector<Vec<T>>& srcs, size_t i, ReduceOp op) {
  if constexpr (std::is_same_v<T, bool>) {
    bool acc = srcs[0][i] != 0;
    for (size_t k = 1; k < srcs.size(); ++k) {
      const bool v = srcs[k][i] != 0;
      acc = (op == ReduceOp::Product || op == ReduceOp::Min) ? (acc && v) : (acc || v);
    }
    return static_cast<uint8_t>(acc);
  } else {
    using A = Acc<T>;
    A acc = static_cast<A>(srcs[0][i]);
    for (size_t k = 1; k < srcs.size(); ++k) {
      A v = static_cast<A>(srcs[k][i]);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc = static_cast<A>(acc + v); break;
        case ReduceOp::Product: acc = static_cast<A>(acc * v); break;
        case ReduceOp::Min: acc = v < acc ? v : acc; break;
        case ReduceOp::Max: acc = acc < v ? v : acc; break;
      }
    }
    if constexpr (kIsFloat<A>) {
      if (op == ReduceOp::Avg) acc = acc / static_cast<A>(srcs.size());
    }
    return static_cast<T>(acc);
  }
}

template <typename T>
bool sameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST(ReduceKernels, EveryDTypeAndOpMatchesTheReference) {
  std::mt19937 rng(7);
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !isFloating(dtype)) continue;  // ProcessGroup rejects it
      for (size_t n : kLengths) {
        for (int nsrc : {1, 2, 3, 5}) {
          COHORT_DISPATCH(dtype, "test", [&]<typename T>() {
            std::vector<Vec<T>> srcs(nsrc, Vec<T>(n));
            for (auto& s : srcs)
              for (size_t i = 0; i < n; ++i) s[i] = sample<T>(rng);
            Vec<T> out(n), out2(n);
            std::vector<const void*> ptrs;
            for (auto& s : srcs) ptrs.push_back(s.data());
            detail::reduceSources(dtype, out.data(), out2.data(), ptrs.data(), nsrc, n, op, nsrc);
            for (size_t i = 0; i < n; ++i) {
              Elem<T> want = reference<T>(srcs, i, op);
              ASSERT_TRUE(sameBits(out[i], want) && sameBits(out2[i], want))
                  << "dtype " << fmt::format("{}", dtype) << " op " << static_cast<int>(op) << " n " << n << " sources "
                  << nsrc << " element " << i;
            }
          });
        }
      }
    }
  }
}

TEST(ReduceKernels, OutputMayBeASource) {
  std::mt19937 rng(11);
  const size_t n = 4096 + 17;
  std::vector<std::vector<float>> srcs(3, std::vector<float>(n));
  for (auto& s : srcs)
    for (float& x : s) x = sample<float>(rng);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = reference<float>(srcs, i, ReduceOp::Sum);
  const void* ptrs[3] = {srcs[0].data(), srcs[1].data(), srcs[2].data()};
  void* outs[2] = {srcs[1].data(), srcs[0].data()};
  detail::reduceSourcesInto(DType::Float32, outs, 2, ptrs, 3, n, ReduceOp::Sum, 3);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(srcs[0][i], want[i]) << i;
    ASSERT_EQ(srcs[1][i], want[i]) << i;
  }
}

TEST(ReduceKernels, HalfTypesAccumulateInFloatAndRoundOnce) {
  // 2048 + 1 + 1 is not a float16 (its spacing there is 2): summed in float16 it stays 2048.
  std::vector<std::vector<Half>> srcs = {{Half(2048.f)}, {Half(1.f)}, {Half(1.f)}};
  const void* ptrs[3] = {srcs[0].data(), srcs[1].data(), srcs[2].data()};
  Half out{};
  detail::reduceSources(DType::Float16, &out, nullptr, ptrs, 3, 1, ReduceOp::Sum, 3);
  EXPECT_EQ(static_cast<float>(out), 2050.f);
}

TEST(ReduceKernels, NaNAccumulatedFirstStaysAndLaterNaNIsDropped) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
    std::vector<float> a = {nan, 1.f, nan}, b = {2.f, nan, nan}, c = {3.f, 0.5f, 4.f};
    const void* ptrs[3] = {a.data(), b.data(), c.data()};
    std::vector<float> out(3);
    detail::reduceSources(DType::Float32, out.data(), nullptr, ptrs, 3, 3, op, 3);
    EXPECT_TRUE(std::isnan(out[0])) << static_cast<int>(op);
    // 1 (op) NaN keeps 1; then 0.5 compares normally.
    EXPECT_EQ(out[1], op == ReduceOp::Min ? 0.5f : 1.f) << static_cast<int>(op);
    EXPECT_TRUE(std::isnan(out[2])) << static_cast<int>(op);
  }
  std::vector<float> a = {1.f, nan}, b = {nan, 1.f};
  const void* ptrs[2] = {a.data(), b.data()};
  std::vector<float> sum(2);
  detail::reduceSources(DType::Float32, sum.data(), nullptr, ptrs, 2, 2, ReduceOp::Sum, 2);
  EXPECT_TRUE(std::isnan(sum[0]) && std::isnan(sum[1]));
}

TEST(ReduceKernels, PairwiseAndAccumulateMatchTheReference) {
  // The forms gloo calls: c = a (op) b in place or not, and acc (op)= x with float32 for halves.
  std::mt19937 rng(3);
  for (ReduceOp op : kOps) {
    for (size_t n : kLengths) {
      std::vector<std::vector<int32_t>> s(2, std::vector<int32_t>(n));
      for (auto& v : s)
        for (auto& x : v) x = sample<int32_t>(rng);
      std::vector<int32_t> c(n), inPlace = s[0];
      auto fn = op == ReduceOp::Product ? &detail::combineInto<int32_t, ReduceOp::Product>
                : op == ReduceOp::Min   ? &detail::combineInto<int32_t, ReduceOp::Min>
                : op == ReduceOp::Max   ? &detail::combineInto<int32_t, ReduceOp::Max>
                                        : &detail::combineInto<int32_t, ReduceOp::Sum>;
      fn(c.data(), s[0].data(), s[1].data(), n);
      fn(inPlace.data(), inPlace.data(), s[1].data(), n);
      const ReduceOp refOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(c[i], reference<int32_t>(s, i, refOp)) << i;
        ASSERT_EQ(inPlace[i], reference<int32_t>(s, i, refOp)) << i;
      }

      std::vector<std::vector<BFloat16>> h(3, std::vector<BFloat16>(n));
      for (auto& v : h)
        for (auto& x : v) x = sample<BFloat16>(rng);
      std::vector<float> acc(n);
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(h[0][i]);
      detail::accumulate<float, BFloat16>(acc.data(), h[1].data(), n, op);
      detail::accumulate<float, BFloat16>(acc.data(), h[2].data(), n, op);
      for (size_t i = 0; i < n; ++i)
        ASSERT_TRUE(sameBits(static_cast<BFloat16>(acc[i]), reference<BFloat16>(h, i, refOp))) << i;

      std::vector<uint8_t> accB(n), xB(n);
      for (size_t i = 0; i < n; ++i) {
        accB[i] = sample<bool>(rng);
        xB[i] = sample<bool>(rng);
      }
      std::vector<uint8_t> before = accB;
      detail::accumulate<bool, bool>(reinterpret_cast<bool*>(accB.data()), reinterpret_cast<const bool*>(xB.data()), n,
                                     op);
      const bool isAnd = op == ReduceOp::Product || op == ReduceOp::Min;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(accB[i], isAnd ? (before[i] & xB[i]) : (before[i] | xB[i])) << i;
    }
  }
}

}  // namespace
}  // namespace cohort::dist
