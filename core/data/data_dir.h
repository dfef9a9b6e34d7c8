/*
 * Where the shipped datasets live. The folder is the COHORT_DATA_DIR environment knob, which
 * defaults to the source tree's data/ folder (compiled in), so tests and examples run from a
 * build tree without setup; an installed or moved build sets COHORT_DATA_DIR.
 * Thread-safe (reads the environment on each call, so a test may change it).
 */
#pragma once

#include <string>

namespace cohort::data {

// The data folder (no trailing slash). Does not check that it exists.
std::string dataDir();
// dataDir()/name; a missing file is a ValueError naming the full path, the knob and its value.
std::string dataFile(const std::string& name);
// The whole file at `path` as bytes; ValueError naming the path and the OS reason on failure.
std::string readFile(const std::string& path);

}  // namespace cohort::data
