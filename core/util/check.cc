#include <cohort/core/util/check.h>

#include <cstring>
#include <string_view>

namespace cohort::detail {

std::string checkLocation(const char* cond, const char* file, int line) {
  // Trim the absolute build path down to the repository-relative one. This file's own path tells
  // where the checkout is; files outside it keep the part from the first layer folder on.
  std::string_view self = __FILE__, suffix = "core/util/check.cc", path = file;
  const char* rel = file;
  if (self.size() >= suffix.size() && self.substr(self.size() - suffix.size()) == suffix &&
      path.substr(0, self.size() - suffix.size()) == self.substr(0, self.size() - suffix.size())) {
    rel = file + (self.size() - suffix.size());
  } else {
    for (const char* layer : {"/core/", "/distributed/", "/fsdp/", "/rpc/", "/launcher/", "/tests/"}) {
      if (const char* p = std::strstr(file, layer)) {
        rel = p + 1;
        break;
      }
    }
  }
  return fmt::format(" [{}; at {}:{}]", cond, rel, line);
}

}  // namespace cohort::detail
