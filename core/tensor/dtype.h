/*
 * Element types and the compile-time dispatch from a runtime DType to a C++ type.
 * COHORT_DISPATCH(dtype, "opname", [&]<typename T>() { ... }) calls the lambda with T set to the
 * storage type (float, double, Half, BFloat16, int64_t, int32_t, uint8_t, bool); narrower forms
 * restrict the set and throw ValueError naming the op for other dtypes.
 * Acc<T> is the type kernels compute in: float for Half/BFloat16, T otherwise.
 */
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include <cohort/core/tensor/half.h>
#include <cohort/core/util/check.h>

namespace cohort {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int64, Int32, UInt8, Bool };
inline constexpr int kNumDTypes = 8;

constexpr size_t elementSize(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int64: return 8;
    case DType::Int32: return 4;
    case DType::UInt8: return 1;
    case DType::Bool: return 1;
  }
  return 0;
}
constexpr bool isFloating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}
constexpr bool isIntegral(DType t, bool includeBool = false) {
  return t == DType::Int64 || t == DType::Int32 || t == DType::UInt8 || (includeBool && t == DType::Bool);
}
const char* dtypeName(DType t);                // "float32", "bfloat16", ...
DType dtypeFromName(const std::string& name);  // throws ValueError for unknown names
// The type two operands are computed in (float beats int, wider beats narrower; f16+bf16 -> f32).
DType promoteTypes(DType a, DType b);

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::Bool;
};

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
inline constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

}  // namespace cohort

template <>
struct fmt::formatter<cohort::DType> : fmt::formatter<std::string_view> {
  auto format(cohort::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(cohort::dtypeName(t), ctx);
  }
};

#define COHORT_DISPATCH_CASE_(D, T, fn) \
  case ::cohort::DType::D: return fn.template operator()<T>();

// All eight dtypes.
#define COHORT_DISPATCH(dtype, opname, ...)                               \
  [&] {                                                                   \
    auto&& cohort_fn_ = __VA_ARGS__;                                      \
    switch (dtype) {                                                      \
      COHORT_DISPATCH_CASE_(Float32, float, cohort_fn_)                   \
      COHORT_DISPATCH_CASE_(Float64, double, cohort_fn_)                  \
      COHORT_DISPATCH_CASE_(Float16, ::cohort::Half, cohort_fn_)          \
      COHORT_DISPATCH_CASE_(BFloat16, ::cohort::BFloat16, cohort_fn_)     \
      COHORT_DISPATCH_CASE_(Int64, int64_t, cohort_fn_)                   \
      COHORT_DISPATCH_CASE_(Int32, int32_t, cohort_fn_)                   \
      COHORT_DISPATCH_CASE_(UInt8, uint8_t, cohort_fn_)                   \
      COHORT_DISPATCH_CASE_(Bool, bool, cohort_fn_)                       \
    }                                                                     \
    throw ::cohort::ValueError(fmt::format("{}: unknown dtype", opname)); \
  }()

// Floating dtypes only (float32, float64, float16, bfloat16).
#define COHORT_DISPATCH_FLOAT(dtype, opname, ...)                                                           \
  [&] {                                                                                                     \
    auto&& cohort_fn_ = __VA_ARGS__;                                                                        \
    switch (dtype) {                                                                                        \
      COHORT_DISPATCH_CASE_(Float32, float, cohort_fn_)                                                     \
      COHORT_DISPATCH_CASE_(Float64, double, cohort_fn_)                                                    \
      COHORT_DISPATCH_CASE_(Float16, ::cohort::Half, cohort_fn_)                                            \
      COHORT_DISPATCH_CASE_(BFloat16, ::cohort::BFloat16, cohort_fn_)                                       \
      default: break;                                                                                       \
    }                                                                                                       \
    throw ::cohort::ValueError(fmt::format("{}: expected a floating-point tensor, got {}", opname, dtype)); \
  }()

// Numeric dtypes (all but bool).
#define COHORT_DISPATCH_NUMERIC(dtype, opname, ...)                                           \
  [&] {                                                                                       \
    auto&& cohort_fn_ = __VA_ARGS__;                                                          \
    switch (dtype) {                                                                          \
      COHORT_DISPATCH_CASE_(Float32, float, cohort_fn_)                                       \
      COHORT_DISPATCH_CASE_(Float64, double, cohort_fn_)                                      \
      COHORT_DISPATCH_CASE_(Float16, ::cohort::Half, cohort_fn_)                              \
      COHORT_DISPATCH_CASE_(BFloat16, ::cohort::BFloat16, cohort_fn_)                         \
      COHORT_DISPATCH_CASE_(Int64, int64_t, cohort_fn_)                                       \
      COHORT_DISPATCH_CASE_(Int32, int32_t, cohort_fn_)                                       \
      COHORT_DISPATCH_CASE_(UInt8, uint8_t, cohort_fn_)                                       \
      default: break;                                                                         \
    }                                                                                         \
    throw ::cohort::ValueError(fmt::format("{}: not supported for dtype {}", opname, dtype)); \
  }()

// Integer index dtypes (int64, int32).
#define COHORT_DISPATCH_INDEX(dtype, opname, ...)                                                         \
  [&] {                                                                                                   \
    auto&& cohort_fn_ = __VA_ARGS__;                                                                      \
    switch (dtype) {                                                                                      \
      COHORT_DISPATCH_CASE_(Int64, int64_t, cohort_fn_)                                                   \
      COHORT_DISPATCH_CASE_(Int32, int32_t, cohort_fn_)                                                   \
      default: break;                                                                                     \
    }                                                                                                     \
    throw ::cohort::ValueError(fmt::format("{}: indices must be int64 or int32, got {}", opname, dtype)); \
  }()
