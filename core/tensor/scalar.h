/*
 * Scalar: a number passed to an op next to tensors. It remembers whether it was written as an
 * integer or a floating value, so `intTensor * 2` stays integer and `intTensor * 0.5` becomes
 * float32, as in PyTorch.
 */
#pragma once

#include <cstdint>
#include <type_traits>

namespace cohort {

class Scalar {
 public:
  Scalar() = default;
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Scalar(T v)
      : i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)), isInt_(true), isBool_(std::is_same_v<T, bool>) {
  }  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)), isInt_(false) {}  // NOLINT

  bool isIntegral() const { return isInt_; }
  bool isBool() const { return isBool_; }
  double toDouble() const { return d_; }
  int64_t toInt() const { return i_; }
  template <typename T>
  T to() const {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(isInt_ ? i_ : static_cast<int64_t>(d_));
    else return static_cast<T>(isInt_ ? static_cast<double>(i_) : d_);
  }

 private:
  int64_t i_ = 0;
  double d_ = 0;
  bool isInt_ = true;
  bool isBool_ = false;
};

}  // namespace cohort
