// Assertion helpers shared by the core tests, and running this test binary as a child.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>

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
template <typename E = Error, typename F>
void expectError(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// Same dtype, shape and bits (the memory of both made contiguous).
inline bool sameBits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.dataPtr(), y.dataPtr(), static_cast<size_t>(x.nbytes())) == 0;
}

// Runs a shell command; returns its exit status (as pclose gives it) and its stdout.
inline std::pair<int, std::string> runCommand(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  return {pclose(p), out};
}

// Runs this test binary again as a child with `env` (shell assignments, "A=1 B=2") in front and
// only the disabled test `childTest` ("Suite.DISABLED_Name"); returns its exit status (as
// pclose gives it) and everything it printed, stderr included.
inline std::pair<int, std::string> runChild(const std::string& env, const std::string& childTest) {
  char self[4096] = {0};
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return {-1, "cannot find this test binary"};
  return runCommand(env + " '" + std::string(self, static_cast<size_t>(len)) +
                    "' --gtest_also_run_disabled_tests --gtest_filter=" + childTest + " 2>&1");
}

}  // namespace cohort::testing
