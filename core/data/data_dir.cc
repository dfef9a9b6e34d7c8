#include <cohort/core/data/data_dir.h>

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

#ifndef COHORT_DATA_DIR_FROM_LIBDIR
#error "COHORT_DATA_DIR_FROM_LIBDIR must be defined by the build (core/CMakeLists.txt)"
#endif

namespace cohort::data {
namespace fs = std::filesystem;
namespace {

COHORT_ENV_KNOB(kDataDir, "COHORT_DATA_DIR", "<libdir>/" COHORT_DATA_DIR_FROM_LIBDIR,
                "Folder holding cohort's shipped datasets (digits.csv, kjv.txt); the default is the folder "
                "installed with cohort, found relative to libcohort_core (<libdir>)");

// Any object of this library: dladdr() maps its address to the file the library was loaded from.
const char kAnchor = 0;

// The file libcohort_core was loaded from, with links resolved (a library linked into another
// folder still finds the data installed beside the real one). Computed once.
const std::string& libraryPath() {
  static const std::string kPath = [] {
    Dl_info info{};
    if (dladdr(&kAnchor, &info) == 0 || info.dli_fname == nullptr || info.dli_fname[0] == '\0') {
      throw Error("data: cannot tell which file libcohort_core was loaded from (dladdr failed), so the data folder "
                  "is unknown; set COHORT_DATA_DIR to the folder that holds cohort's datasets");
    }
    std::error_code ec;
    fs::path p = fs::canonical(info.dli_fname, ec);
    if (ec) p = fs::absolute(info.dli_fname);
    return p.string();
  }();
  return kPath;
}

// Where the folder came from, for error messages.
std::string origin(const std::string& dir) {
  if (kDataDir.raw()) return fmt::format("{}='{}', from the environment", kDataDir.name(), dir);
  return fmt::format("the default, {} relative to libcohort_core at '{}', as {} is unset", COHORT_DATA_DIR_FROM_LIBDIR,
                     libraryPath(), kDataDir.name());
}

}  // namespace

std::string dataDir() {
  if (auto set = kDataDir.raw()) {
    std::string d = *set;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d;
  }
  return (fs::path(libraryPath()).parent_path() / COHORT_DATA_DIR_FROM_LIBDIR).lexically_normal().string();
}

std::string dataFile(const std::string& name) {
  std::string dir = dataDir();
  std::string path = dir + "/" + name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ValueError(fmt::format(
        "data: cannot read '{}': the data folder '{}' does not exist (it is {}); set {} to the folder that holds {}",
        path, dir, origin(dir), kDataDir.name(), name));
  }
  if (!fs::is_regular_file(path, ec)) {
    throw ValueError(fmt::format("data: dataset file '{}' does not exist (the data folder is {}; set {} to the folder "
                                 "that holds {})",
                                 path, origin(dir), kDataDir.name(), name));
  }
  return path;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(fmt::format("data: cannot open '{}': {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ValueError(fmt::format("data: error reading '{}': {}", path, std::strerror(errno)));
  return std::move(ss).str();
}

}  // namespace cohort::data
