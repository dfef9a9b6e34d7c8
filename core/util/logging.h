/*
 * Levelled logging to stderr: COHORT_LOG(Info, "fmt {}", x), with the levels Debug, Info, Warning
 * and Error. The level comes from COHORT_LOG_LEVEL (debug, info, warning, error, off; default
 * warning) or logging::setLevel(); a disabled level costs one comparison and its arguments are not
 * evaluated. Lines are written whole under a lock, as "[cohort <D|I|W|E> <local time with µs>
 * <prefix> <file>:<line>] <message>", so output of several threads does not interleave mid-line.
 * The prefix is whatever setPrefix() set (dist::initProcessGroup sets "rank N"). Any thread may log.
 */
#pragma once

#include <fmt/format.h>

#include <string>

namespace cohort::logging {

enum class Level { Debug = 0, Info = 1, Warning = 2, Error = 3, Off = 4 };

Level level();
void setLevel(Level l);
// A prefix such as "rank 3" added to every line (set by the process group at init).
void setPrefix(std::string prefix);
void write(Level l, const char* file, int line, const std::string& msg);
inline bool enabled(Level l) { return l >= level(); }

}  // namespace cohort::logging

#define COHORT_LOG(lvl, ...)                                                                                 \
  do {                                                                                                       \
    if (::cohort::logging::enabled(::cohort::logging::Level::lvl))                                           \
      ::cohort::logging::write(::cohort::logging::Level::lvl, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
