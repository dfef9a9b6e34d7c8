/*
 * Where the shipped datasets live. The folder is the COHORT_DATA_DIR environment knob when it is
 * set; otherwise the folder the build installs beside the library, found relative to the file
 * libcohort_core was loaded from: <libdir>/../share/cohort/data in an installed tree (wherever the
 * tree was moved), and the same place in the build tree, where a link points to the source
 * tree's data/ folder.
 * Thread-safe (reads the environment on each call, so a test may change it).
 */
#pragma once

#include <string>

namespace cohort::data {

// The data folder (no trailing slash). Does not check that it exists.
std::string dataDir();
// dataDir()/name. A missing folder or file is a ValueError naming the full path, where the folder
// came from (COHORT_DATA_DIR, or the library's own location) and how to point elsewhere.
std::string dataFile(const std::string& name);
// The whole file at `path` as bytes; ValueError naming the path and the OS reason on failure.
std::string readFile(const std::string& path);

}  // namespace cohort::data
