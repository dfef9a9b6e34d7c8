// Assertion helpers shared by the core tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::testing {

// Runs fn and returns the message of the exception of type E it throws (fails the test otherwise).
template <typename E, typename F>
std::string messageOf(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every element of t (read as float64) is within tol (relative above 1) of want; NaN must match NaN.
inline void expectNear(const Tensor& t, const std::vector<double>& want, double tol = 1e-9) {
  std::vector<double> got = t.to(DType::Float64).toVector<double>();
  ASSERT_EQ(got.size(), want.size()) << t.toString();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "element " << i;
    }
  }
}

// f throws E and its message contains every one of `parts`.
template <typename E, typename F>
void expectThrowsNaming(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    std::string msg = e.what();
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace cohort::testing
