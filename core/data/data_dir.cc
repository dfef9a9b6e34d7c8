#include <cohort/core/data/data_dir.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

#ifndef COHORT_SOURCE_DATA_DIR
#error "COHORT_SOURCE_DATA_DIR must be defined by the build (core/CMakeLists.txt)"
#endif

namespace cohort::data {
namespace {

COHORT_ENV_KNOB(kDataDir, "COHORT_DATA_DIR", COHORT_SOURCE_DATA_DIR,
                "Folder holding cohort's shipped datasets (digits.csv, kjv.txt)");

}  // namespace

std::string dataDir() {
  std::string d = kDataDir.str();
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string dataFile(const std::string& name) {
  std::string dir = dataDir();
  std::string path = dir + "/" + name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    bool fromEnv = kDataDir.raw().has_value();
    throw ValueError(fmt::format(
        "data: dataset file '{}' does not exist (the data folder is {}='{}'{}; set {} to the folder that holds {})",
        path, kDataDir.name(), dir, fromEnv ? ", from the environment" : ", the built-in default", kDataDir.name(),
        name));
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
