// --profile DIR for the examples: a profiler::Profile (memory and shapes) over a window of
// training steps after a short warm-up, then DIR/trace.json (Chrome trace: open it in
// https://ui.perfetto.dev or chrome://tracing), DIR/memory.html (live memory by category, the peak
// and what held it) and the op table on stdout. With several ranks each rank writes its own files
// (trace_rank<R>.json, memory_rank<R>.html); `cohortrun --profile DIR` instead profiles every rank
// and merges them into one trace.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <cohort/core/profiler/profiler.h>
#include <fmt/format.h>

namespace examples {

class StepProfiler {
 public:
  // Profiles steps skip+1 .. skip+count (step numbers as the loop counts them after each step).
  StepProfiler(std::string dir, int rank, int world, int64_t skip = 2, int64_t count = 3)
      : dir_(std::move(dir)), rank_(rank), world_(world), open_(skip), close_(skip + count) {
    if (dir_.empty()) return;
    std::filesystem::create_directories(dir_);
    if (open_ == 0) start();
  }
  ~StepProfiler() {
    try {
      finish();
    } catch (const std::exception& e) {
      fmt::print(stderr, "--profile: {}\n", e.what());
    }
  }

  // After training step `step` (1-based) ended.
  void afterStep(int64_t step) {
    if (dir_.empty()) return;
    if (step == open_ && !prof_ && !done_) start();
    if (step == close_) finish();
  }

  // Stops (if still profiling) and writes the files; a run shorter than the window writes what it has.
  void finish() {
    if (!prof_) return;
    prof_->stop();
    const std::string suffix = world_ > 1 ? fmt::format("_rank{}", rank_) : "";
    const std::string trace = fmt::format("{}/trace{}.json", dir_, suffix);
    const std::string memory = fmt::format("{}/memory{}.html", dir_, suffix);
    cohort::profiler::TraceStats stats = prof_->exportChromeTrace(trace);
    prof_->exportMemoryTimeline(memory);
    if (rank_ == 0) {
      fmt::print("{}", prof_->table({.sortBy = cohort::profiler::SortBy::SelfCpuTime, .rowLimit = 15}));
      fmt::print("--profile: {} steps in {} ({} bytes, {} per step; open in https://ui.perfetto.dev), memory in {}\n",
                 stats.steps, trace, stats.bytes, stats.bytesPerStep, memory);
    }
    prof_.reset();
    done_ = true;
  }

 private:
  void start() {
    prof_ = std::make_unique<cohort::profiler::Profile>(
        cohort::profiler::ProfileOptions{.memory = true, .shapes = true, .rank = rank_});
  }

  std::string dir_;
  int rank_, world_;
  int64_t open_, close_;
  std::unique_ptr<cohort::profiler::Profile> prof_;
  bool done_ = false;
};

}  // namespace examples
