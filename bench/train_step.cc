// Training-step time of the two reference models, one thread, for a side-by-side ratio
// against PyTorch 1.13 (bench/torch_train_step.py runs the same models and shapes):
//   MLP 784-1024-1024-10, batch 64, SGD;  GPT 6 layers, 6 heads, width 384, block 256, batch 8, AdamW.
// Prints one JSON line per model: {"model": "mlp", "amp": "none", "ms_per_step": ..., "peak_mb": ...,
// "step_peak_mb": ...} (process CPU time per step; the allocator's peak bytes during the last timed step,
// weights and optimizer state included, and the most a step allocated above what was live when it
// began, which is what bench/torch_train_step.py reads from PyTorch's profiler). With --profile, also the time per op
// family (forward, backward, optimizer) for the "where does the time go" question.
// --amp bf16|fp16 runs forward and loss under amp::Autocast (float32 weights; fp16 also scales the
// loss with an amp::GradScaler, as a float16 run needs).
//
// --profiler on runs the timed steps under a profiler::Profile recording memory and shapes (the
// profiler's overhead; "profiler" in the JSON line, with the trace's bytes per step).
// --profiler paired measures that overhead side by side in one process: 2 x steps timed steps
// alternating without and with a profile (off, on, on, off, ...: drift cancels), each "on" step under a
// fresh profile, and prints two lines, "off" and "on", the latter with "overhead_pct", the median
// of the per-pair ratios ("ratios", on / off), and the spans and memory events one step records. Between processes the
// step time of these shared machines varies by 10-15%, far more than the profiler costs.
//
//   build/bench/train_step [--steps N] [--model mlp|gpt|all] [--amp none|bf16|fp16] [--profile]
//                          [--profiler off|on|paired]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <vector>

#include <cohort/cohort.h>

using namespace cohort;
// Process CPU time: on the shared, loaded machines wall-clock time measures the neighbours; with
// one thread, CPU time is the step's own work (docs/benchmarks.md explains the method).
struct Clock {
  using time_point = std::chrono::duration<double>;
  static time_point now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return time_point(static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec));
  }
};

namespace {

double ms(Clock::time_point a, Clock::time_point b) { return (b - a).count() * 1e3; }

struct Phases {
  std::vector<double> fwd, bwd, opt, total;
  int64_t stepPeakBytes = 0;  // the most any timed step allocated above what was live when it began
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
};

enum class ProfilerMode { Off, On, Paired };
ProfilerMode gProfiler = ProfilerMode::Off;
int64_t gTraceBytesPerStep = 0;

// --profiler paired: the "off" steps, the "on" steps, and what one "on" step recorded.
struct Paired {
  Phases off, on;
  std::vector<double> ratios;  // on / off, per pair
  int64_t spans = 0, memoryEvents = 0;
};
Paired gPaired;

profiler::ProfileOptions benchProfile() { return {.memory = true, .shapes = true}; }

template <typename Step>
Phases timeSteps(int warmup, int steps, Step&& step) {
  Phases p;
  for (int i = 0; i < warmup; ++i) step(nullptr);
  if (gProfiler == ProfilerMode::Paired) {
    gPaired = {};
    for (int i = 0; i < steps; ++i) {
      double off = 0, on = 0;
      for (int half = 0; half < 2; ++half) {
        if ((half == 0) == (i % 2 == 0)) {
          step(&gPaired.off);
          off = gPaired.off.total.back();
          continue;
        }
        profiler::Profile prof(benchProfile());
        step(&gPaired.on);
        on = gPaired.on.total.back();
        prof.stop();
        gPaired.spans = static_cast<int64_t>(prof.events().size());
        gPaired.memoryEvents = static_cast<int64_t>(prof.memoryEvents().size());
        profiler::TraceStats stats;
        (void)prof.chromeTrace(0, &stats);
        gTraceBytesPerStep = stats.bytes;
      }
      gPaired.ratios.push_back(on / off);
    }
    return gPaired.off;
  }
  std::unique_ptr<profiler::Profile> prof;
  if (gProfiler == ProfilerMode::On) prof = std::make_unique<profiler::Profile>(benchProfile());
  resetPeakMemory();
  for (int i = 0; i < steps; ++i) {
    const int64_t liveBefore = memoryStats().bytesLive;
    resetPeakMemory();
    step(&p);
    p.stepPeakBytes = std::max(p.stepPeakBytes, memoryStats().peakBytes - liveBefore);
  }
  if (prof) {
    profiler::TraceStats stats;
    (void)prof->chromeTrace(0, &stats);
    gTraceBytesPerStep = stats.bytesPerStep;
  }
  return p;
}

// The autocast dtype for --amp, if any.
std::optional<DType> ampDType(const std::string& amp) {
  if (amp == "bf16") return DType::BFloat16;
  if (amp == "fp16") return DType::Float16;
  return std::nullopt;
}

void reportLine(const char* model, const std::string& amp, const Phases& p, bool profile, bool on,
                const std::string& extra) {
  const double mb = 1 << 20;
  fmt::print(
      "{{\"model\": \"{}\", \"amp\": \"{}\", \"ms_per_step\": {:.3f}, \"peak_mb\": {:.1f}, \"step_peak_mb\": {:.1f}",
      model, amp, Phases::median(p.total), static_cast<double>(memoryStats().peakBytes) / mb,
      static_cast<double>(p.stepPeakBytes) / mb);
  fmt::print(", \"profiler\": \"{}\"", on ? "on" : "off");
  if (on) fmt::print(", \"trace_bytes_per_step\": {}", gTraceBytesPerStep);
  fmt::print("{}", extra);
  if (profile)
    fmt::print(", \"forward_ms\": {:.3f}, \"backward_ms\": {:.3f}, \"optimizer_ms\": {:.3f}", Phases::median(p.fwd),
               Phases::median(p.bwd), Phases::median(p.opt));
  fmt::print("}}\n");
  std::fflush(stdout);
}

void report(const char* model, const std::string& amp, const Phases& p, bool profile) {
  if (gProfiler != ProfilerMode::Paired) {
    reportLine(model, amp, p, profile, gProfiler == ProfilerMode::On, "");
    return;
  }
  const std::string paired = fmt::format(", \"paired\": true, \"pairs\": {}", gPaired.ratios.size());
  reportLine(model, amp, gPaired.off, profile, false, paired);
  reportLine(model, amp, gPaired.on, profile, true,
             paired + fmt::format(", \"overhead_pct\": {:.2f}, \"ratios\": [{:.4f}], \"spans_per_step\": {}, "
                                  "\"memory_events_per_step\": {}",
                                  100 * (Phases::median(gPaired.ratios) - 1), fmt::join(gPaired.ratios, ", "),
                                  gPaired.spans, gPaired.memoryEvents));
}

template <typename Model, typename Opt>
auto makeStep(Model& model, Opt& opt, const Tensor& x, const Tensor& y, int64_t classes, std::optional<DType> amp,
              amp::GradScaler& scaler) {
  return [&, classes, amp](Phases* p) {
    auto t0 = Clock::now();
    Tensor loss;
    {
      amp::Autocast autocast(DeviceType::CPU, amp.value_or(DType::BFloat16), {.enabled = amp.has_value()});
      Tensor logits = model(x);
      loss = nn::functional::crossEntropy(logits.reshape({-1, classes}), y.reshape({-1}));
    }
    auto t1 = Clock::now();
    opt.zeroGrad();
    scaler.scale(loss).backward();
    auto t2 = Clock::now();
    scaler.step(opt);
    scaler.update();
    auto t3 = Clock::now();
    if (p) {
      p->fwd.push_back(ms(t0, t1));
      p->bwd.push_back(ms(t1, t2));
      p->opt.push_back(ms(t2, t3));
      p->total.push_back(ms(t0, t3));
    }
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training-step time of cohort's reference models (compare with bench/torch_train_step.py)."};
  int steps = 30;
  std::string which = "all";
  bool profile = false;
  std::string ampName = "none";
  app.add_option("--steps", steps, "timed steps (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--model", which, "mlp, gpt or all")->check(CLI::IsMember({"mlp", "gpt", "all"}));
  app.add_option("--amp", ampName, "none, bf16 or fp16 (autocast; fp16 with a GradScaler)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_flag("--profile", profile, "also report forward/backward/optimizer time");
  std::string profilerMode = "off";
  app.add_option("--profiler", profilerMode,
                 "on: time the steps under the profiler (memory and shapes recorded); paired: steps without and "
                 "with it alternating in one process")
      ->check(CLI::IsMember({"off", "on", "paired"}));
  CLI11_PARSE(app, argc, argv);
  gProfiler = profilerMode == "on"       ? ProfilerMode::On
              : profilerMode == "paired" ? ProfilerMode::Paired
                                         : ProfilerMode::Off;
  blas::setNumThreads(1);
  const std::optional<DType> amp = ampDType(ampName);
  // Loss scaling only where float16 needs it; a disabled scaler is a plain backward and step.
  amp::GradScaler scaler({.enabled = ampName == "fp16"});

  if (which == "mlp" || which == "all") {
    manualSeed(0);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                                                  nn::Linear(1024, 10));
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    Tensor x = randn({64, 784});
    Tensor y = randint(0, 10, {64});
    report("mlp", ampName, timeSteps(5, steps, makeStep(*model, opt, x, y, 10, amp, scaler)), profile);
  }
  if (which == "gpt" || which == "all") {
    manualSeed(0);
    nn::GPTConfig c;
    c.vocabSize = 65;
    c.blockSize = 256;
    c.nLayer = 6;
    c.nHead = 6;
    c.nEmbd = 384;
    c.dropout = 0.0;
    nn::GPT model(c);
    optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weightDecay = 0.1});
    Tensor x = randint(0, 65, {8, 256});
    Tensor y = randint(0, 65, {8, 256});
    report("gpt", ampName, timeSteps(2, std::max(3, steps / 3), makeStep(model, opt, x, y, 65, amp, scaler)), profile);
  }
  return 0;
}
