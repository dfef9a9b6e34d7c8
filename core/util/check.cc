#include <cohort/core/util/check.h>

#include <cstring>

namespace cohort::detail {

std::string checkLocation(const char* cond, const char* file, int line) {
  // Trim the absolute build path down to the repository-relative one.
  const char* rel = file;
  for (const char* layer : {"/core/", "/distributed/", "/fsdp/", "/rpc/", "/launcher/", "/tests/"}) {
    if (const char* p = std::strstr(file, layer)) {
      rel = p + 1;
      break;
    }
  }
  return fmt::format(" [{}; at {}:{}]", cond, rel, line);
}

}  // namespace cohort::detail
