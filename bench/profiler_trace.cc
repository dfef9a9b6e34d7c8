// The profiler's trace at scale: 1,000 steps of train_digits' model (MLP 64-128-128-10, batch 32,
// AdamW, the digits training set) recorded with memory and shapes, then the Chrome trace written
// to a file. Prints one JSON line: steps, events, bytes, bytes per step, the time to write the
// trace (wall clock, the file included) and the time the profiled steps took against the same
// steps unprofiled (process CPU time).
//
//   build/bench/profiler_trace [--steps 1000] [--out /tmp/cohort_trace.json]
#include <CLI/CLI.hpp>

#include <chrono>
#include <ctime>
#include <filesystem>

#include <cohort/cohort.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/digits.h>

using namespace cohort;

namespace {

double cpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// `steps` training steps over the digits set (epochs as needed); returns CPU seconds.
double train(int64_t steps) {
  manualSeed(0);
  auto net = std::make_shared<nn::Sequential>(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 128), nn::ReLU(),
                                              nn::Linear(128, 10));
  optim::AdamW opt(net->parameters(), {.lr = 1e-3, .weightDecay = 1e-4});
  data::DataLoader loader(data::digits("train"), {.batchSize = 32, .shuffle = true, .seed = 0});
  const double t0 = cpuSeconds();
  int64_t done = 0;
  for (int64_t epoch = 0; done < steps; ++epoch) {
    loader.setEpoch(epoch);
    for (auto& batch : loader) {
      if (done == steps) break;
      Tensor loss = nn::functional::crossEntropy((*net)(batch.data), batch.target);
      opt.zeroGrad();
      loss.backward();
      opt.step();
      ++done;
    }
  }
  return cpuSeconds() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writing a profiler trace of train_digits' steps."};
  int64_t steps = 1000;
  std::string out = (std::filesystem::temp_directory_path() / "cohort_profiler_trace.json").string();
  app.add_option("--steps", steps, "training steps to record")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "where the trace goes (removed after)");
  CLI11_PARSE(app, argc, argv);
  blas::setNumThreads(1);

  const double plain = train(steps);
  profiler::Profile prof({.memory = true, .shapes = true});
  const double profiled = train(steps);
  prof.stop();
  const auto w0 = std::chrono::steady_clock::now();
  const profiler::TraceStats stats = prof.exportChromeTrace(out);
  const double writeMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
  std::filesystem::remove(out);
  fmt::print("{{\"steps\": {}, \"events\": {}, \"trace_bytes\": {}, \"bytes_per_step\": {}, \"write_ms\": {:.1f}, "
             "\"train_ms_per_step\": {:.4f}, \"train_profiled_ms_per_step\": {:.4f}}}\n",
             stats.steps, stats.events, stats.bytes, stats.bytesPerStep, writeMs,
             plain * 1e3 / static_cast<double>(steps), profiled * 1e3 / static_cast<double>(steps));
  return 0;
}
