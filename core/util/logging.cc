#include <cohort/core/util/logging.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include <cohort/core/util/env.h>

namespace cohort::logging {
namespace {

COHORT_ENV_KNOB(kLogLevel, "COHORT_LOG_LEVEL", "warning", "Log level: debug, info, warning, error or off.");

Level parse(const std::string& s) {
  if (s == "debug" || s == "DEBUG") return Level::Debug;
  if (s == "info" || s == "INFO") return Level::Info;
  if (s == "warning" || s == "WARNING" || s == "warn") return Level::Warning;
  if (s == "error" || s == "ERROR") return Level::Error;
  if (s == "off" || s == "OFF") return Level::Off;
  std::fprintf(stderr,
               "[cohort W] COHORT_LOG_LEVEL='%s' is not one of debug, info, warning, error, off; using warning\n",
               s.c_str());
  return Level::Warning;
}

std::atomic<int>& levelRef() {
  static std::atomic<int> l{static_cast<int>(parse(kLogLevel.str()))};
  return l;
}
std::mutex& mu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::string& prefixRef() {
  static std::string* p = new std::string();
  return *p;
}

}  // namespace

Level level() { return static_cast<Level>(levelRef().load(std::memory_order_relaxed)); }
void setLevel(Level l) { levelRef().store(static_cast<int>(l)); }
void setPrefix(std::string prefix) {
  std::lock_guard<std::mutex> lock(mu());
  prefixRef() = std::move(prefix);
}

void write(Level l, const char* file, int line, const std::string& msg) {
  static const char kTag[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  auto t = std::chrono::system_clock::to_time_t(now);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  std::lock_guard<std::mutex> lock(mu());
  const std::string& prefix = prefixRef();
  std::fprintf(stderr, "[cohort %c %02d:%02d:%02d.%06lld %s%s%s:%d] %s\n", kTag[static_cast<int>(l)], tm.tm_hour,
               tm.tm_min, tm.tm_sec, static_cast<long long>(us), prefix.c_str(), prefix.empty() ? "" : " ", base, line,
               msg.c_str());
}

}  // namespace cohort::logging
