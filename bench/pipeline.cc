// Pipeline-parallel training of a GPT split in halves over two processes, every schedule, against
// one process training the same model on the same batches, measured alternately in this run.
//
// Each pipeline rank and the single process compute on one thread (two ranks on this 2-core
// machine: one core each), so samples_s / single_samples_s is what the pipeline buys, bounded by
// its bubble (1F1B with m = 8, p = 2: 8/9 of 2x = 1.78x). The interleaved and v schedules split
// the GPT into four stages (two per rank: 0 and 2 | 1 and 3 interleaved, 0 and 3 | 1 and 2 in
// the V). A schedule may carry modifiers: "+ahead<N>" is its
// lookahead (schedule.h: N more forwards run ahead on the ranks that feed a later stage),
// "+split<K>" splits the backwards of the last K micro-batches into input and weight halves
// (schedule.h, splitTail), "+ckpt" recomputes every stage's forward in its backward (activation
// checkpointing: less memory, more compute).
//
// The one-process figure: rank 0 of the pipeline also holds the whole GPT and its optimizer and
// trains it a step after every pipeline step, while rank 1 waits idle, so the two alternate step
// by step and a drift in the machine's speed falls on both.
//
// The kernel places the ranks (--cpu-bind none, the default, as cohortrun's). --cpu-bind cores
// binds each rank, before it starts any thread, to its share of the CPUs, as cohortrun --cpu-bind
// cores does (here one core each; the one-process run is rank 0's, so it runs on one bound core
// too); --cpu-bind cores,none runs each schedule both ways, one after the other.
//
// Per schedule one JSON line:
//   {"schedule", "samples_s", "single_samples_s", "speedup", "bubble_measured", "bubble_simulated",
//    "step_ms", "step_ms_predicted", "peak_activation_mib": [per rank], "peak_activation_mib_simulated", ...}
// samples_s counts whole training steps (zeroGrad, the pipeline's step, the optimizer's step), as
// single_samples_s does; step_ms is the pipeline's step alone (what the simulator predicts).
// bubble_measured = 1 - (time ranks spent in F/B/I/W) / (ranks x step time); the simulator is fed
// this run's measured per-action times, what a send keeps its rank busy (the mean send action), a
// receive's own cost (the shortest receive action: its data was there) and the measured one-way
// transfer time of an activation, and predicts the step time, the bubble and each rank's peak of
// live activations (times the measured bytes of one micro-batch's activations on that rank).
// Peaks are the allocator's high-water mark during a step above what was live before it.
//
//   build/bench/pipeline [--steps 10] [--warmup 2] [--microbatches 8]
//                        [--schedules gpipe,1f1b,1f1b+ahead1,1f1b+split1,interleaved,interleaved+split2,v,
//                                     v+split1,v+split2,zb,zb+ahead1,1f1b+ckpt]
//                        [--transport pg|rpc] [--rpc-shm] [--backend auto|shm|gloo] [--layers 4] [--embd 192]
//                        [--block 64] [--batch 32] [--cpu-bind cores|none|cores,none] [--timeline]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cohort/core/autograd/checkpoint.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/nn/transformer.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/tensor/allocator.h>
#include <cohort/core/util/cpu_affinity.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/pipeline/pipeline.h>
#include <cohort/pipeline/split.h>
#include <cohort/rpc/rpc.h>

#include "harness/ranks.h"

using namespace cohort;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int steps = 10, warmup = 2, microbatches = 8;
  int64_t layers = 4, embd = 192, heads = 4, block = 64, batch = 32;
  std::string transport = "pg";
  std::string backend = "auto";  // the process group's, with --transport pg
  bool rpcShm = false;           // with --transport rpc: RpcOptions::useShm
  std::string cpuBind = "none";  // "cores": each rank (with its threads) on its share of the CPUs
};

nn::GPTConfig config(const Args& a) {
  nn::GPTConfig c;
  c.vocabSize = 65;
  c.blockSize = a.block;
  c.nLayer = a.layers;
  c.nHead = a.heads;
  c.nEmbd = a.embd;
  c.dropout = 0.0;
  return c;
}

std::pair<Tensor, Tensor> batchFor(const Args& a, int step) {
  Generator g(1000 + static_cast<uint64_t>(step));
  Tensor x = randint(0, 65, {a.batch, a.block}, {.dtype = DType::Int64}, &g);
  Tensor y = randint(0, 65, {a.batch, a.block}, {.dtype = DType::Int64}, &g);
  return {x, y};
}

Tensor gptLoss(const Tensor& logits, const Tensor& target) {
  return nn::functional::crossEntropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

// The one-process baseline: the whole GPT and its optimizer, trained a step at a time.
struct Single {
  explicit Single(const Args& a)
      : gpt([&] {
          manualSeed(0);
          return std::make_shared<nn::GPT>(config(a));
        }()),
        opt(gpt->parameters(), {.lr = 1e-4}) {}
  // Seconds of one whole training step on the batch of `step`.
  double step(const Args& a, int step) {
    auto [x, y] = batchFor(a, step);
    const auto t0 = Clock::now();
    opt.zeroGrad();
    gptLoss((*gpt)(x), y).backward();
    opt.step();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::shared_ptr<nn::GPT> gpt;
  optim::AdamW opt;
};

// A --schedules entry: a built-in name, then any of "+ckpt" (every stage's forward recomputed in
// its backward), "+ahead<N>" (the schedule's lookahead) and "+split<K>" (splitTail, schedule.h),
// e.g. "1f1b+ahead1+ckpt".
struct Variant {
  std::string base;
  bool ckpt = false;
  int lookahead = 0;
  int split = 0;
  pipeline::Schedule schedule(int ranks, int microbatches) const {
    pipeline::Schedule s = pipeline::makeSchedule(base, ranks, microbatches, 0, lookahead);
    return split > 0 ? pipeline::splitTail(s, split) : s;
  }
};

// The N of "<prefix>N" (digits only), or -1.
int modifierNumber(const std::string& mod, const std::string& prefix) {
  if (!mod.starts_with(prefix) || mod.size() == prefix.size() ||
      mod.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
    return -1;
  return std::stoi(mod.substr(prefix.size()));
}

Variant parseVariant(const std::string& name) {
  Variant v;
  std::stringstream in(name);
  std::getline(in, v.base, '+');
  for (std::string mod; std::getline(in, mod, '+');) {
    if (mod == "ckpt") v.ckpt = true;
    else if (int n = modifierNumber(mod, "ahead"); n >= 0) v.lookahead = n;
    else if (int k = modifierNumber(mod, "split"); k >= 0) v.split = k;
    else throw ValueError(fmt::format("'{}' is none of +ckpt, +ahead<N> and +split<K>", mod));
  }
  return v;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// One pipeline rank: trains, and reports "key value..." lines.
int runRank(const Args& a, const std::string& schedule, const std::string& dir, int rank, std::ostream& report) {
  const int p = 2;
  // Before any thread starts, so the transport's progress thread stays on this rank's core too.
  if (a.cpuBind == "cores") util::bindToCpus(util::cpuSlice(util::allowedCpus(), rank, p));
  blas::setNumThreads(1);
  auto store = std::make_shared<dist::FileStore>(dir + "/store", std::chrono::milliseconds(60'000));
  pipeline::TransportPtr transport;
  dist::ProcessGroupPtr pg;
  if (a.transport == "rpc") {
    rpc::RpcOptions o;
    o.store = store;
    o.useShm = a.rpcShm;
    rpc::init(fmt::format("stage{}", rank), rank, p, o);
    transport = pipeline::rpcTransport({"stage0", "stage1"});
  } else {
    pg = dist::ProcessGroup::create(store, rank, p, {.backend = a.backend});
    transport = pipeline::processGroupTransport(pg);
  }
  const Variant variant = parseVariant(schedule);
  const bool ckpt = variant.ckpt;
  pipeline::Schedule sched = variant.schedule(p, a.microbatches);
  manualSeed(0);
  auto gpt = std::make_shared<nn::GPT>(config(a));
  pipeline::StageSplit split = pipeline::splitGPT(gpt, sched.stages);
  std::vector<nn::ModulePtr> mine;
  for (int s : sched.stagesOf(rank)) mine.push_back(split.stages[static_cast<size_t>(s)]);
  pipeline::PipelineOptions po{.tied = split.tied};
  if (ckpt)
    for (int st = 0; st < sched.stages; ++st) po.checkpointStages.push_back(st);
  pipeline::Pipeline pipe(mine, transport, gptLoss, sched, po);
  optim::AdamW opt(pipe.parameters(), {.lr = 1e-4});

  // One-way time of an activation-sized transfer (ping-pong), and the bytes one micro-batch's
  // forward keeps alive on each of this rank's stages.
  const int64_t mb = (a.batch + a.microbatches - 1) / a.microbatches;
  Tensor act = randn({mb, a.block, a.embd});
  double oneWay = 0;
  for (int i = 0; i < 12; ++i) {
    const auto t0 = Clock::now();
    if (rank == 0) {
      transport->send(act, 1, 16300 + i);
      (void)transport->recv(1, 16300 + i, std::chrono::milliseconds(30'000));
    } else {
      (void)transport->recv(0, 16300 + i, std::chrono::milliseconds(30'000));
      transport->send(act, 0, 16300 + i);
    }
    transport->flush(std::chrono::milliseconds(30'000));
    if (i >= 2) oneWay += std::chrono::duration<double>(Clock::now() - t0).count() / 2 / 10;
  }
  std::map<int, double> actBytes;
  {
    auto [x, y] = batchFor(a, 0);
    Tensor h = x.slice(0, 0, mb);
    for (int s = 0; s < sched.stages; ++s) {
      const int64_t before = memoryStats().bytesLive;
      nn::Module& stage = *split.stages[static_cast<size_t>(s)];
      Tensor out = ckpt ? autograd::checkpoint([&](const Tensor& in) { return stage(in); }, h) : stage(h);
      if (sched.rankOf(s) == rank) actBytes[s] = static_cast<double>(memoryStats().bytesLive - before);
      h = out.detach();
    }
  }

  // Rank 0 also trains the whole model in this process, a step after each pipeline step while
  // rank 1 waits idle, so the two are measured step by step alternating: the machine's speed
  // drifts by 10% and more over seconds here, and a baseline measured once before every schedule
  // would carry that drift into every ratio.
  std::unique_ptr<Single> one = rank == 0 ? std::make_unique<Single>(a) : nullptr;
  const int64_t idleTag = 16000, goTag = 16001;  // + 2 (step % 100): below the ping-pong's, above the pipeline's
  double stepTotal = 0, trainTotal = 0, busyTotal = 0, singleTotal = 0;
  int64_t peak = 0;
  std::map<std::pair<int, int>, std::pair<double, int>> kindTimes;  // (kind, stage) -> (sum, count)
  // What a send keeps its rank busy (copying into the backend's buffer), and a receive's own cost:
  // its shortest run, one whose data was there already (the others include the wait).
  double sendTime = 0, recvMin = std::numeric_limits<double>::infinity();
  int64_t sends = 0;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    auto [x, y] = batchFor(a, s);
    const auto t0 = Clock::now();
    opt.zeroGrad();
    const int64_t live = memoryStats().bytesLive;
    resetPeakMemory();
    const auto t1 = Clock::now();
    (void)pipe.step(x, y);
    const auto t2 = Clock::now();
    peak = std::max(peak, memoryStats().peakBytes - live);
    opt.step();
    const auto t3 = Clock::now();
    Tensor token = zeros({1});
    if (rank == 0) {
      (void)transport->recv(1, idleTag + 2 * (s % 100), std::chrono::milliseconds(60'000));  // rank 1 is done
      const double t = one->step(a, s);
      if (s >= a.warmup) singleTotal += t;
      transport->send(token, 1, goTag + 2 * (s % 100));
    } else {
      transport->send(token, 0, idleTag + 2 * (s % 100));
      (void)transport->recv(0, goTag + 2 * (s % 100), std::chrono::milliseconds(60'000));
    }
    transport->flush(std::chrono::milliseconds(60'000));
    if (s < a.warmup) continue;
    stepTotal += std::chrono::duration<double>(t2 - t1).count();
    trainTotal += std::chrono::duration<double>(t3 - t0).count();
    busyTotal += pipe.lastStepTiming().busy;
    for (const auto& t : pipe.lastStepTiming().actions) {
      const pipeline::ActionKind k = t.action.kind;
      if (k == pipeline::ActionKind::SendActivation || k == pipeline::ActionKind::SendGradient) {
        sendTime += t.end - t.start;
        ++sends;
      } else if (k == pipeline::ActionKind::RecvActivation || k == pipeline::ActionKind::RecvGradient) {
        recvMin = std::min(recvMin, t.end - t.start);
      } else {
        auto& e = kindTimes[{static_cast<int>(k), t.action.stage}];
        e.first += t.end - t.start;
        ++e.second;
      }
    }
  }
  report << fmt::format("step {}\ntrain {}\nbusy {}\npeak {}\noneway {}\n", stepTotal / a.steps, trainTotal / a.steps,
                        busyTotal / a.steps, peak, oneWay);
  if (one) report << fmt::format("single {}\n", singleTotal / a.steps);
  if (sends > 0) report << fmt::format("sendcost {} {}\n", sendTime, sends);
  if (std::isfinite(recvMin)) report << fmt::format("recvcost {}\n", recvMin);
  for (const auto& [k, v] : kindTimes) report << fmt::format("cost {} {} {}\n", k.first, k.second, v.first / v.second);
  for (const auto& [s, b] : actBytes) report << fmt::format("actbytes {} {}\n", s, b);
  for (const auto& t : pipe.lastStepTiming().actions)  // the last step, as it ran
    report << fmt::format("ran {} {} {} {} {}\n", static_cast<int>(t.action.kind), t.action.stage, t.action.microbatch,
                          t.start, t.end);
  report << fmt::format("transport {}\n",
                        a.transport == "rpc" ? fmt::format("rpc ({})", a.rpcShm ? "shm" : "tcp") : transport->name());
  transport.reset();
  if (a.transport == "rpc") rpc::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Pipeline-parallel GPT training, every schedule, against one process"};
  Args a;
  std::string schedules =
      "gpipe,1f1b,1f1b+ahead1,1f1b+split1,interleaved,interleaved+split2,v,v+split1,v+split2,zb,zb+ahead1,1f1b+ckpt";
  bool showTimeline = false;
  app.add_flag("--timeline", showTimeline, "print each schedule's measured and simulated timelines (stderr)");
  app.add_option("--steps", a.steps)->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--microbatches", a.microbatches)->check(CLI::PositiveNumber);
  app.add_option("--schedules", schedules);
  app.add_option("--transport", a.transport)->check(CLI::IsMember({"pg", "rpc"}));
  app.add_flag("--rpc-shm", a.rpcShm,
               "with --transport rpc: TensorPipe's shared-memory transport between the ranks (RpcOptions::useShm; "
               "it keeps a core busy in each rank, so off by default here, where the ranks use every core)");
  app.add_option("--backend", a.backend, "the process group's backend with --transport pg (auto: shm on one host)")
      ->check(CLI::IsMember({"auto", "shm", "gloo"}));
  std::string cpuBinds = "none";
  app.add_option("--cpu-bind", cpuBinds,
                 "cores: each rank and its threads bound to its share of the CPUs, as cohortrun --cpu-bind cores "
                 "(the one-process run is rank 0's); none (default): wherever the kernel puts them; cores,none: each "
                 "schedule both ways, one after the other");
  app.add_option("--layers", a.layers)->check(CLI::PositiveNumber);
  app.add_option("--embd", a.embd)->check(CLI::PositiveNumber);
  app.add_option("--heads", a.heads)->check(CLI::PositiveNumber);
  app.add_option("--block", a.block)->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  blas::setNumThreads(1);
  std::vector<std::string> binds;
  {
    std::stringstream in(cpuBinds);
    for (std::string b; std::getline(in, b, ',');) {
      if (b != "cores" && b != "none") {
        fmt::print(stderr, "pipeline bench: --cpu-bind '{}': each entry is cores or none\n", b);
        return 2;
      }
      binds.push_back(b);
    }
  }
  std::stringstream list(schedules);
  std::vector<std::string> names;
  for (std::string name; std::getline(list, name, ',');) {
    try {  // every entry known before anything runs
      (void)parseVariant(name).schedule(2, a.microbatches);
    } catch (const std::exception& e) {
      fmt::print(stderr, "pipeline bench: --schedules '{}': {}\n", name, e.what());
      return 2;
    }
    names.push_back(name);
  }
  for (const std::string& name : names) {
    for (const std::string& bind : binds) {
      a.cpuBind = bind;
      char tmpl[] = "/tmp/cohort_bench_pipeline_XXXXXX";
      if (!mkdtemp(tmpl)) return 1;
      const std::string dir = tmpl;
      testing::RankOptions o;
      o.limit = std::chrono::seconds(600);
      o.reportDir = dir;
      o.stopOnFailure = true;
      auto results = testing::runRanks(
          2, [&](int r, std::ostream& rep) { return runRank(a, name, dir, r, rep); }, o);
      std::filesystem::remove_all(dir);
      for (const auto& r : results)
        if (!r.ok()) {
          fmt::print(stderr, "pipeline bench: schedule {} failed: {} {}\n", name, r.describe(), r.report);
          return 1;
        }
      // Gather what the ranks measured.
      double step = 0, train = 0, busy = 0, oneWay = 0, singleStep = 0, sendSum = 0;
      int64_t sendCount = 0;
      std::vector<double> peakMib, actMib(8, 0.0);
      pipeline::ActionCosts costs;
      const Variant variant = parseVariant(name);
      const pipeline::Schedule sched = variant.schedule(2, a.microbatches);
      const int S = sched.stages;
      costs.forward.assign(S, 0.0);
      costs.backward.assign(S, 0.0);
      costs.backwardInput.assign(S, 0.0);
      costs.backwardWeight.assign(S, 0.0);
      std::vector<double> actBytes(S, 0.0);
      std::string transportName;
      pipeline::Simulation measured;  // the last step as it ran, drawn as a simulation is
      measured.timeline.resize(2);
      for (size_t rank = 0; rank < results.size(); ++rank) {
        std::istringstream in(results[rank].report);
        for (std::string key; in >> key;) {
          if (key == "ran") {
            int kind, stage, mbi;
            double t0, t1;
            in >> kind >> stage >> mbi >> t0 >> t1;
            measured.timeline[rank].push_back({{static_cast<pipeline::ActionKind>(kind), stage, mbi}, t0, t1});
            measured.makespan = std::max(measured.makespan, t1);
            continue;
          }
          if (key == "step") {
            double v;
            in >> v;
            step = std::max(step, v);
          } else if (key == "train") {
            double v;
            in >> v;
            train = std::max(train, v);
          } else if (key == "busy") {
            double v;
            in >> v;
            busy += v;
          } else if (key == "peak") {
            double v;
            in >> v;
            peakMib.push_back(mib(static_cast<int64_t>(v)));
          } else if (key == "single") {
            in >> singleStep;
          } else if (key == "sendcost") {
            double v;
            int64_t n;
            in >> v >> n;
            sendSum += v;
            sendCount += n;
          } else if (key == "recvcost") {
            double v;
            in >> v;
            costs.recv = costs.recv > 0 ? std::min(costs.recv, v) : v;
          } else if (key == "oneway") {
            double v;
            in >> v;
            oneWay = std::max(oneWay, v);
          } else if (key == "cost") {
            int kind, stage;
            double v;
            in >> kind >> stage >> v;
            auto k = static_cast<pipeline::ActionKind>(kind);
            auto& vec = k == pipeline::ActionKind::Forward         ? costs.forward
                        : k == pipeline::ActionKind::Backward      ? costs.backward
                        : k == pipeline::ActionKind::BackwardInput ? costs.backwardInput
                                                                   : costs.backwardWeight;
            vec[static_cast<size_t>(stage)] = v;
          } else if (key == "actbytes") {
            int stage;
            double v;
            in >> stage >> v;
            actBytes[static_cast<size_t>(stage)] = v;
          } else if (key == "transport") {
            std::getline(in, transportName);
            transportName.erase(0, transportName.find_first_not_of(' '));
          }
        }
      }
      costs.latency = oneWay;
      costs.send = sendCount > 0 ? sendSum / static_cast<double>(sendCount) : 0.0;
      if (a.batch % a.microbatches != 0)  // unequal micro-batches: each one's rows over the mean
        for (int64_t rows : pipeline::microbatchSizes(a.batch, a.microbatches))
          costs.microbatchScale.push_back(static_cast<double>(rows) * a.microbatches / static_cast<double>(a.batch));
      pipeline::Simulation sim = pipeline::simulate(sched, costs);
      // Simulated peak bytes per rank: live micro-batches of each stage x that stage's bytes.
      std::vector<double> simPeak(2, 0.0);
      for (int r = 0; r < 2; ++r) {
        double liveBytes = 0, best = 0;
        for (const auto& t : sim.timeline[static_cast<size_t>(r)]) {
          const double b = actBytes[static_cast<size_t>(t.action.stage)];
          if (t.action.kind == pipeline::ActionKind::Forward) liveBytes += b;
          if (t.action.kind == pipeline::ActionKind::Backward || t.action.kind == pipeline::ActionKind::BackwardWeight)
            liveBytes -= b;
          best = std::max(best, liveBytes);
        }
        simPeak[static_cast<size_t>(r)] = mib(static_cast<int64_t>(best));
      }
      const double samples = static_cast<double>(a.batch) / train;  // with the optimizer, as single's
      const double singleSamples = static_cast<double>(a.batch) / singleStep;
      if (showTimeline) {
        const double unit = sim.makespan / 120;
        auto ms = [](std::vector<double> v) {
          for (double& x : v) x *= 1e3;
          return v;
        };
        fmt::print(
            stderr,
            "{} ms per action by stage: F [{:.2f}] B [{:.2f}] I [{:.2f}] W [{:.2f}]; one-way {:.3f}, send {:.3f}, "
            "receive {:.3f}\n",
            name, fmt::join(ms(costs.forward), ", "), fmt::join(ms(costs.backward), ", "),
            fmt::join(ms(costs.backwardInput), ", "), fmt::join(ms(costs.backwardWeight), ", "), oneWay * 1e3,
            costs.send * 1e3, costs.recv * 1e3);
        for (size_t r = 0; r < measured.timeline.size(); ++r) {  // where each rank's last step went
          std::map<std::string, double> by;
          double covered = 0;
          for (const auto& t : measured.timeline[r]) {
            by[pipeline::shortName(t.action.kind)] += (t.end - t.start) * 1e3;
            covered += t.end - t.start;
          }
          std::string kinds;
          for (const auto& [k, ms] : by) kinds += fmt::format("{} {:.1f}, ", k, ms);
          fmt::print(stderr, "{} rank {} ms by action kind: {}not in an action {:.2f}\n", name, r, kinds,
                     (measured.makespan - covered) * 1e3);
        }
        fmt::print(stderr, "{} measured (last step):\n{}{} simulated:\n{}", name,
                   pipeline::formatTimeline(measured, unit), name, pipeline::formatTimeline(sim, unit));
      }
      fmt::print(
          "{{\"schedule\": \"{}\", \"samples_s\": {:.2f}, \"single_samples_s\": {:.2f}, \"speedup\": {:.3f}, "
          "\"bubble_measured\": {:.4f}, \"bubble_simulated\": {:.4f}, \"step_ms\": {:.2f}, \"step_ms_predicted\": "
          "{:.2f}, "
          "\"peak_activation_mib\": [{:.2f}], \"peak_activation_mib_simulated\": [{:.2f}], \"microbatches\": {}, "
          "\"stages\": {}, \"lookahead\": {}, \"split\": {}, \"transport\": \"{}\", \"cpu_bind\": \"{}\"}}\n",
          name, samples, singleSamples, samples / singleSamples, 1.0 - busy / (2.0 * step), sim.bubble, step * 1e3,
          sim.makespan * 1e3, fmt::join(peakMib, ", "), fmt::join(simPeak, ", "), a.microbatches, S, variant.lookahead,
          variant.split, transportName, a.cpuBind);
      std::fflush(stdout);
    }
  }
  return 0;
}
