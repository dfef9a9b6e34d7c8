#include <cohort/distributed/job_profile.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <cohort/core/profiler/profiler.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>

#include <fmt/ranges.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kProfileDir, "COHORT_PROFILE", "",
                "Profile every rank of the job and write DIR/trace.json (cohortrun --profile DIR sets it)");
COHORT_ENV_KNOB(kProfileSteps, "COHORT_PROFILE_STEPS", "1:3",
                "Job profiling window, SKIP:COUNT: steps before the window opens and steps in it");
COHORT_ENV_KNOB(kProfileMemory, "COHORT_PROFILE_MEMORY", "1", "Job profiling records allocations (0 to turn off)");

namespace {

struct JobState {
  std::mutex mu;
  JobProfileOptions opts;
  ProcessGroupPtr pg;
  int64_t offsetNs = 0;
  int64_t openAt = 0, closeAt = 0;  // step counts
  std::unique_ptr<profiler::Profile> prof;
  bool done = false;
};
JobState& state() {
  static JobState* s = new JobState();  // never destroyed: the exit handler may run after statics go
  return *s;
}

std::string rankFile(const std::string& dir, int rank) { return fmt::format("{}/rank{}.json", dir, rank); }

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) throw Error(fmt::format("job profiling: cannot write '{}'", path));
}

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Stops the window's profile and writes this rank's files; returns the trace (empty when none).
std::string writeRank(JobState& s) {
  if (!s.prof) return {};
  s.prof->stop();
  const int rank = s.pg ? s.pg->rank() : 0;
  profiler::TraceStats stats;
  std::string trace = s.prof->chromeTrace(s.offsetNs, &stats);
  writeFile(rankFile(s.opts.dir, rank), trace);
  if (s.opts.memory) s.prof->exportMemoryTimeline(fmt::format("{}/memory_rank{}.html", s.opts.dir, rank));
  COHORT_LOG(Warning, "profiler: rank {} wrote {} ({} events, {} bytes, {} bytes per step over {} steps)", rank,
             rankFile(s.opts.dir, rank), stats.events, stats.bytes, stats.bytesPerStep, stats.steps);
  s.prof.reset();
  return trace;
}

// Every rank hands its trace to rank 0 through the store; rank 0 merges them into DIR/trace.json.
void gatherAndMerge(JobState& s, const std::string& mine) {
  Store& store = *s.pg->store();
  const int rank = s.pg->rank(), size = s.pg->size();
  store.set(fmt::format("profile/trace/{}", rank), mine);
  if (rank != 0) return;
  std::vector<std::string> traces = {mine};
  std::vector<int> missing;
  for (int r = 1; r < size; ++r) {
    const std::string key = fmt::format("profile/trace/{}", r);
    try {
      store.wait({key}, s.pg->timeout());
      Bytes b = store.get(key);
      traces.emplace_back(b.begin(), b.end());
      store.deleteKey(key);
    } catch (const Error&) {
      missing.push_back(r);
    }
  }
  const std::string path = s.opts.dir + "/trace.json";
  writeFile(path, profiler::mergeTraces(traces));
  if (missing.empty()) COHORT_LOG(Warning, "profiler: merged the traces of {} ranks into {}", size, path);
  else
    COHORT_LOG(Warning, "profiler: merged {} of {} ranks into {}; ranks {} never sent theirs", traces.size(), size,
               path, fmt::join(missing, ", "));
}

void onStep(int64_t step) {
  JobState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.done) return;
  if (step == s.openAt && !s.prof) {
    try {
      s.prof = std::make_unique<profiler::Profile>(
          profiler::ProfileOptions{.memory = s.opts.memory, .shapes = s.opts.shapes, .rank = s.pg ? s.pg->rank() : 0});
    } catch (const ValueError& e) {
      COHORT_LOG(Warning, "job profiling: not started: {}", e.what());
      s.done = true;
    }
    return;
  }
  if (step == s.closeAt && s.prof) {
    s.done = true;
    std::string trace = writeRank(s);
    gatherAndMerge(s, trace);
  }
}

void atExit() {
  try {
    finishJobProfiling();
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "job profiling: at exit: {}", e.what());
  }
}

}  // namespace

std::optional<JobProfileOptions> jobProfileOptionsFromEnv() {
  std::optional<std::string> dir = kProfileDir.raw();
  if (!dir) return std::nullopt;
  JobProfileOptions o;
  o.dir = *dir;
  const std::string steps = kProfileSteps.str();
  const size_t colon = steps.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    o.skipSteps = std::stoll(steps.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("skip");
    const std::string count = steps.substr(colon + 1);
    o.steps = std::stoll(count, &used);
    if (used != count.size()) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    throw ValueError(fmt::format("environment variable COHORT_PROFILE_STEPS='{}' must be SKIP:COUNT, e.g. 1:3", steps));
  }
  if (o.skipSteps < 0 || o.steps < 1)
    throw ValueError(
        fmt::format("environment variable COHORT_PROFILE_STEPS='{}': SKIP must be >= 0 and COUNT >= 1", steps));
  o.memory = kProfileMemory.flag();
  return o;
}

void startJobProfiling(const ProcessGroupPtr& pg, const JobProfileOptions& opts) {
  if (opts.dir.empty()) throw ValueError("startJobProfiling: the directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec) throw ValueError(fmt::format("job profiling: cannot create '{}': {}", opts.dir, ec.message()));
  // Clocks: every rank arrives; rank 0 then publishes its clock, and each rank reads its own the
  // moment the store wakes it, less half of a store round trip (the time the news took).
  Store& store = *pg->store();
  const int rank = pg->rank(), size = pg->size();
  store.add("profile/clock/arrived", 1);
  int64_t offset = 0;
  if (rank == 0) {
    const auto deadline = std::chrono::steady_clock::now() + pg->timeout();
    for (int64_t n; (n = store.add("profile/clock/arrived", 0)) < size;) {
      if (std::chrono::steady_clock::now() > deadline)
        throw TimeoutError(fmt::format("job profiling: only {} of {} ranks arrived to align clocks within {} ms", n,
                                       size, pg->timeout().count()));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    store.set("profile/clock/rank0", std::to_string(profiler::detail::nowNs()));
  } else {
    store.wait({"profile/clock/rank0"}, pg->timeout());
    const int64_t woke = profiler::detail::nowNs();
    Bytes b = store.get("profile/clock/rank0");
    const int64_t rank0 = std::stoll(std::string(b.begin(), b.end()));
    std::vector<int64_t> rtts;
    for (int i = 0; i < 5; ++i) {
      const int64_t t = profiler::detail::nowNs();
      store.check({"profile/clock/rank0"});
      rtts.push_back(profiler::detail::nowNs() - t);
    }
    std::sort(rtts.begin(), rtts.end());
    offset = woke - rank0 - rtts[rtts.size() / 2] / 2;
  }
  JobState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.opts = opts;
    s.pg = pg;
    s.offsetNs = offset;
    s.openAt = profiler::stepCount() + opts.skipSteps;
    s.closeAt = s.openAt + opts.steps;
    s.done = false;
  }
  static std::once_flag exitHook;
  std::call_once(exitHook, [] { std::atexit(atExit); });
  profiler::setStepListener(&onStep);
  COHORT_LOG(Info, "job profiling: steps {} to {} into {} (clock offset to rank 0: {} us)", s.openAt + 1, s.closeAt,
             opts.dir, offset / 1000);
  if (opts.skipSteps == 0) onStep(s.openAt);
}

void finishJobProfiling() {
  JobState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  profiler::setStepListener(nullptr);
  if (s.prof) writeRank(s);
  s.done = true;
  s.pg.reset();
}

int64_t jobClockOffsetNs() {
  JobState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.offsetNs;
}

int mergeRankTraceFiles(const std::string& dir) {
  std::vector<std::string> traces;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("rank") && name.ends_with(".json")) traces.push_back(readFile(entry.path().string()));
  }
  if (traces.empty()) return 0;
  writeFile(dir + "/trace.json", profiler::mergeTraces(traces));
  return static_cast<int>(traces.size());
}

}  // namespace cohort::dist
