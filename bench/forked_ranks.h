// Ranks as forked processes for the training benches (bench/ddp, bench/fsdp), on the process
// harness the tests use (tests/harness/ranks.h, through the cohort_test_harness target): each
// child meets the others through a FileStore in a fresh temporary directory and runs
// body(rank, store); a failed rank or the deadline ends the others (a hang is a bug, even in a
// benchmark). Returns 0 when every rank exited 0.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include <cohort/distributed/store/file_store.h>

#include "harness/ranks.h"

namespace cohort::bench {

inline int runForkedRanks(const char* tag, int world, int timeoutS, dist::Millis storeTimeout,
                          const std::function<void(int rank, const dist::StorePtr& store)>& body) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / (std::string("cohort_bench_") + tag + "_XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "%s: cannot create a temporary directory under %s\n", tag, fs::temp_directory_path().c_str());
    return 1;
  }
  const fs::path dir(tmpl);
  testing::RankOptions o;
  o.limit = std::chrono::seconds(timeoutS);
  o.stopOnFailure = true;
  o.tag = tag;
  auto results = testing::runRanks(
      world,
      [&](int rank, std::ostream&) {
        dist::StorePtr store = std::make_shared<dist::FileStore>((dir / "store").string(), storeTimeout);
        body(rank, store);
        return 0;
      },
      o);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return testing::failedRanks(results).empty() ? 0 : 1;
}

}  // namespace cohort::bench
