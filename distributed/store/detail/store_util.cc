#include <cohort/distributed/store/detail/store_util.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include <cohort/core/util/error.h>

namespace cohort::dist::detail {

Clock::time_point deadlineAfter(Millis timeout) {
  auto now = Clock::now();
  if (timeout.count() <= 0) return now;
  // Keep well inside the clock's range: a "forever" timeout becomes a deadline centuries away.
  auto room = std::chrono::duration_cast<Millis>(Clock::time_point::max() - now) / 2;
  if (timeout >= room) return now + room;
  return now + timeout;
}

int64_t parseStoredInt(const Bytes& value, const std::string& what) {
  std::string s(value.begin(), value.end());
  if (!s.empty()) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == 0 && end == s.c_str() + s.size() && s.find('\0') == std::string::npos) return v;
  }
  std::string shown = s.size() > 40 ? s.substr(0, 40) + "..." : s;
  throw ValueError(fmt::format("{}: add() needs the key to hold a decimal integer, but it holds \"{}\" ({} bytes)",
                               what, shown, value.size()));
}

Bytes formatStoredInt(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

std::string formatKeys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 16;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i) out += ", ";
    out += '"';
    out += keys[i];
    out += '"';
  }
  if (keys.size() > kShown) out += fmt::format(" ... and {} more", keys.size() - kShown);
  return out;
}

void throwWaitTimeout(const std::string& store, Millis timeout, const std::vector<std::string>& missing, size_t total) {
  throw TimeoutError(fmt::format("{}: wait timed out after {} ms; still missing {} of {} keys: {}", store,
                                 timeout.count(), missing.size(), total, formatKeys(missing)));
}

void throwGetTimeout(const std::string& store, Millis timeout, const std::string& key) {
  throw TimeoutError(
      fmt::format("{}: get(\"{}\") timed out after {} ms waiting for the key to be set", store, key, timeout.count()));
}

}  // namespace cohort::dist::detail
