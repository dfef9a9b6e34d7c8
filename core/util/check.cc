#include <cohort/core/util/check.h>

#include <string_view>

namespace cohort::detail {

std::string checkLocation(const char* cond, const char* file, int line) {
  // cohort's own files arrive repository-relative ("core/tensor/tensor.cc"): the build maps its
  // source and include folders away in __FILE__ (-fmacro-prefix-map, top CMakeLists.txt). A check
  // inside an installed cohort header compiled by a user's project arrives as that project's
  // compiler found it, "<prefix>/include/cohort/core/tensor/tensor.h": it is shortened to the
  // same repository-relative form. Any other path (a user's own COHORT_CHECK) is kept as it is.
  std::string_view path = file;
  constexpr std::string_view kInstalled = "/include/cohort/";
  if (auto at = path.rfind(kInstalled); at != std::string_view::npos) path.remove_prefix(at + kInstalled.size());
  return fmt::format(" [{}; at {}:{}]", cond, path, line);
}

}  // namespace cohort::detail
