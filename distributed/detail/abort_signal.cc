#include <cohort/distributed/detail/abort_signal.h>

#include <sstream>

#include <fmt/format.h>

#include <cohort/core/util/logging.h>

namespace cohort::dist::detail {

namespace {
const std::string kSignalKey = "abort";
}

void raiseAbortSignal(Store& store, const std::string& group, int rank, bool timeout, const std::string& message) {
  try {
    const std::string value = fmt::format("{} {}\n{}", timeout ? "timeout" : "error", rank, message);
    store.compareSet(kSignalKey, Bytes{}, Bytes(value.begin(), value.end()));
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "group '{}': could not signal the other ranks through the store: {}", group, e.what());
  }
}

std::optional<AbortSignal> readAbortSignal(Store& store, const std::string& group) {
  std::string value;
  try {
    if (!store.check({kSignalKey})) return std::nullopt;
    value = store.getString(kSignalKey);
  } catch (const std::exception& e) {
    COHORT_LOG(Debug, "group '{}': could not read the abort signal: {}", group, e.what());
    return std::nullopt;
  }
  AbortSignal s;
  std::istringstream in(value);
  std::string kind;
  in >> kind >> s.from;
  s.timeout = kind == "timeout";
  const size_t nl = value.find('\n');
  s.message = nl == std::string::npos ? value : value.substr(nl + 1);
  return s;
}

}  // namespace cohort::dist::detail
