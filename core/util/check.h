/*
 * Invariant and argument checks. COHORT_CHECK(cond, fmt, args...) throws cohort::Error (or the
 * type given to COHORT_CHECK_T) whose message is "<formatted message> [cond; at file:line]".
 * COHORT_CHECK_EQ/NE/LT/LE/GT/GE also print both values: "<message> (a vs. b) [cond; at ...]".
 * Messages use fmt syntax and are only formatted when the check fails.
 */
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include <cohort/core/util/error.h>

namespace cohort::detail {

std::string checkLocation(const char* cond, const char* file, int line);

template <typename E = Error, typename... Args>
[[noreturn]] void throwCheck(const char* cond, const char* file, int line, fmt::format_string<Args...> f,
                             Args&&... args) {
  throw E(fmt::format(f, std::forward<Args>(args)...) + checkLocation(cond, file, line));
}
template <typename E = Error>
[[noreturn]] void throwCheck(const char* cond, const char* file, int line) {
  throw E(std::string("check failed") + checkLocation(cond, file, line));
}

template <typename A, typename B, typename... Args>
[[noreturn]] void throwCheckOp(const char* expr, const A& a, const B& b, const char* file, int line,
                               fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...) + fmt::format(" ({} vs. {})", a, b) +
              checkLocation(expr, file, line));
}
template <typename A, typename B>
[[noreturn]] void throwCheckOp(const char* expr, const A& a, const B& b, const char* file, int line) {
  throw Error(fmt::format("check failed ({} vs. {})", a, b) + checkLocation(expr, file, line));
}

}  // namespace cohort::detail

#define COHORT_CHECK(cond, ...)                                                                            \
  do {                                                                                                     \
    if (!(cond)) [[unlikely]]                                                                              \
      ::cohort::detail::throwCheck<::cohort::Error>(#cond, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// Like COHORT_CHECK but throws the given Error subclass (ValueError, IndexError, ...).
#define COHORT_CHECK_T(type, cond, ...)                                                         \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::cohort::detail::throwCheck<type>(#cond, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

#define COHORT_CHECK_OP_(a, b, op, ...)                                                 \
  do {                                                                                  \
    const auto& cohort_a_ = (a);                                                        \
    const auto& cohort_b_ = (b);                                                        \
    if (!(cohort_a_ op cohort_b_)) [[unlikely]]                                         \
      ::cohort::detail::throwCheckOp(#a " " #op " " #b, cohort_a_, cohort_b_, __FILE__, \
                                     __LINE__ __VA_OPT__(, ) __VA_ARGS__);              \
  } while (0)

#define COHORT_CHECK_EQ(a, b, ...) COHORT_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define COHORT_CHECK_NE(a, b, ...) COHORT_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define COHORT_CHECK_LT(a, b, ...) COHORT_CHECK_OP_(a, b, <, __VA_ARGS__)
#define COHORT_CHECK_LE(a, b, ...) COHORT_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define COHORT_CHECK_GT(a, b, ...) COHORT_CHECK_OP_(a, b, >, __VA_ARGS__)
#define COHORT_CHECK_GE(a, b, ...) COHORT_CHECK_OP_(a, b, >=, __VA_ARGS__)
