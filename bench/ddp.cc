/*
 * DistributedDataParallel training step, side by side with PyTorch's DDP
 * (bench/torch_ddp.py runs the same workload; scripts/bench_ddp.sh runs both, interleaved).
 *
 * Workload: MLP 784-1024-1024-10 (1,863,690 parameters), batch 64 per rank, SGD (lr 0.01),
 * cross-entropy, synthetic data generated once per rank, one BLAS thread per rank. `--warmup`
 * steps, then `--steps` timed steps; a step is zeroGrad, forward, loss, backward, optimizer step,
 * timed by the wall clock (steady_clock) on rank 0.
 *
 * Ranks. Without a launcher in the environment the program forks `--world` ranks itself; they
 * meet through a FileStore in a fresh temporary directory (the parent waits for them with a
 * deadline and kills them past it). Under mpirun, cohortrun or torchrun-style variables every
 * process is one rank and joins through dist::initProcessGroup() (`--backend mpi` only there).
 *
 *   build-bench/bench/ddp --backend shm --bucket-cap-mb 1,4,25
 *   build-bench/bench/ddp --world 1                       # one process, no DDP: the compute baseline
 *   build-bench/bench/ddp --backend gloo --no-comm        # 2 ranks, DDP under noSync(): no gradient sync
 *   mpirun -np 2 build-bench/bench/ddp --backend mpi
 *
 * Rank 0 prints one JSON line per configuration:
 *   ms_step       median wall time of a step (rank 0);
 *   samples_s     world × batch / ms_step;
 *   fwd/bwd/opt_ms medians of the step's phases (bwd includes the reducer's wait for the buckets);
 *   cpu_ms        median process CPU time per step (every thread of the rank, comm threads included);
 *   hook_ms       median time backward's thread spent inside the comm hook issuing all-reduces (the
 *                 default hook, timed): with a backend that runs collectives on the caller's thread
 *                 (shm and mpi by default) this is the whole all-reduce, done inside backward;
 *   wait_ms       median of reducer().lastExposedWaitS(): what backward's end waited for buckets;
 *   exposed_ms    median per step of hook + wait: communication time that backward did not hide;
 *   bare_ms       median time of one allreduce (Avg) of all the gradients as one flat float32
 *                 tensor, same group and backend, measured in the same process after the steps;
 *   bwd_nocomm_ms, ms_step_nocomm  the same steps again under noSync() right after (no gradient sync);
 *   exposed_est_ms  bwd − bwd_nocomm, overlap_est = 1 − exposed_est / bare: the estimate that
 *                 bench/torch_ddp.py prints for PyTorch, which does not report its wait;
 *   overlap       1 − exposed / bare, clamped to [0, 1]: the fraction of a bare all-reduce's time
 *                 that backward hid. It is 0 when the exposed time is as long as (or longer than:
 *                 bucketed all-reduces competing with backward for the cores) the bare one.
 * `--label` replaces the backend name in the output (the script runs "shm" twice, once with
 * COHORT_COLLECTIVE_THREAD=worker, and labels that row "shm-worker").
 */
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/env/environment.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/file_store.h>

#include "forked_ranks.h"

namespace {

using namespace cohort;
using dist::ProcessGroup;
using dist::ProcessGroupPtr;

constexpr int64_t kBatch = 64;
constexpr int64_t kIn = 784, kHidden = 1024, kClasses = 10;

struct Config {
  std::string backend = "gloo";
  std::vector<double> bucketCapsMb{25.0};
  double firstBucketCapMb = 1.0;
  int world = 2;
  int warmup = 10;
  int steps = 50;
  int bareIters = 20;
  bool noComm = false;
  std::string zeroGrad = "none";
  std::string label;
  int timeoutS = 600;
};

double wallNow() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::shared_ptr<nn::Sequential> makeModel() {
  manualSeed(0);  // every rank starts alike (DDP would copy rank 0's weights anyway)
  return std::make_shared<nn::Sequential>(nn::Linear(kIn, kHidden), nn::ReLU(), nn::Linear(kHidden, kHidden),
                                          nn::ReLU(), nn::Linear(kHidden, kClasses));
}

struct Samples {
  std::vector<double> step, fwd, bwd, opt, cpu, hook, wait;
};

// The default all-reduce hook, timed: the seconds backward's thread spends inside run() (issuing
// the collective; with a backend that runs collectives on the caller's thread, as shm and mpi do
// by default, that is the whole all-reduce, which then never overlaps backward).
class TimedHook final : public dist::CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  Future<Tensor> run(ProcessGroup& pg, dist::GradBucket& bucket) override {
    double t0 = wallNow();
    Future<Tensor> f = inner_->run(pg, bucket);
    seconds += wallNow() - t0;
    return f;
  }
  double seconds = 0;

 private:
  dist::CommHookPtr inner_ = dist::allreduceHook();
};

// Runs warmup + timed steps of `model` (a plain module or the DDP wrapper).
Samples runSteps(const Config& c, nn::Module& model, optim::SGD& opt, const Tensor& x, const Tensor& y,
                 dist::DistributedDataParallel* ddp, TimedHook* hook, ProcessGroup* pg) {
  Samples s;
  const bool setToNone = c.zeroGrad == "none";
  auto step = [&](bool record) {
    if (hook != nullptr) hook->seconds = 0;
    double c0 = cpuNow(), t0 = wallNow();
    opt.zeroGrad(setToNone);
    Tensor loss = nn::functional::crossEntropy(model(x), y);
    double t1 = wallNow();
    loss.backward();
    double t2 = wallNow();
    opt.step();
    double t3 = wallNow(), c1 = cpuNow();
    if (!record) return;
    s.step.push_back(t3 - t0);
    s.fwd.push_back(t1 - t0);
    s.bwd.push_back(t2 - t1);
    s.opt.push_back(t3 - t2);
    s.cpu.push_back(c1 - c0);
    if (ddp != nullptr && !c.noComm) {
      s.hook.push_back(hook->seconds);
      s.wait.push_back(ddp->reducer().lastExposedWaitS());
    }
  };
  auto run = [&](int n, bool record) {
    if (ddp != nullptr && c.noComm) {
      auto guard = ddp->noSync();
      for (int i = 0; i < n; ++i) step(record);
    } else {
      for (int i = 0; i < n; ++i) step(record);
    }
  };
  run(c.warmup, false);
  if (pg != nullptr) pg->barrier()->wait();  // start the timed steps together
  run(c.steps, true);
  return s;
}

// One allreduce (Avg) of `numel` floats, the way the reducer issues it; median seconds.
double bareAllreduce(ProcessGroup& pg, int64_t numel, int iters) {
  Tensor t = randn({numel});
  for (int i = 0; i < 3; ++i) pg.allreduce(t, {.op = dist::ReduceOp::Avg})->wait();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    pg.barrier()->wait();
    double t0 = wallNow();
    pg.allreduce(t, {.op = dist::ReduceOp::Avg})->wait();
    times.push_back(wallNow() - t0);
  }
  return median(times);
}

void printRow(const Config& c, const std::string& backend, int world, double capMb, size_t buckets, const Samples& s,
              double bareS, const Samples& quiet = {}) {
  const double stepS = median(s.step);
  std::string fields = fmt::format(
      "{{\"impl\": \"cohort\", \"backend\": \"{}\", \"world\": {}, \"mode\": \"{}\", \"bucket_mb\": {}, \"buckets\": "
      "{}, "
      "\"ms_step\": {:.3f}, \"samples_s\": {:.1f}, \"fwd_ms\": {:.3f}, \"bwd_ms\": {:.3f}, \"opt_ms\": {:.3f}, "
      "\"cpu_ms\": {:.3f}",
      backend, world, world == 1 ? "single" : (c.noComm ? "no_comm" : "ddp"),
      capMb < 0 ? "null" : fmt::format("{}", capMb), buckets, stepS * 1e3, static_cast<double>(world * kBatch) / stepS,
      median(s.fwd) * 1e3, median(s.bwd) * 1e3, median(s.opt) * 1e3, median(s.cpu) * 1e3);
  if (!s.wait.empty() && bareS > 0) {
    std::vector<double> exposedS(s.wait.size());
    for (size_t i = 0; i < s.wait.size(); ++i) exposedS[i] = s.hook[i] + s.wait[i];
    const double exposed = median(exposedS);
    const double overlap = std::clamp(1.0 - exposed / bareS, 0.0, 1.0);
    fields += fmt::format(
        ", \"hook_ms\": {:.3f}, \"wait_ms\": {:.3f}, \"exposed_ms\": {:.3f}, \"bare_ms\": {:.3f}, \"overlap\": {:.3f}",
        median(s.hook) * 1e3, median(s.wait) * 1e3, exposed * 1e3, bareS * 1e3, overlap);
    if (!quiet.bwd.empty()) {
      const double est = median(s.bwd) - median(quiet.bwd);
      fields += fmt::format(", \"bwd_nocomm_ms\": {:.3f}, \"ms_step_nocomm\": {:.3f}, \"exposed_est_ms\": {:.3f}, "
                            "\"overlap_est\": {:.3f}",
                            median(quiet.bwd) * 1e3, median(quiet.step) * 1e3, est * 1e3,
                            std::clamp(1.0 - est / bareS, 0.0, 1.0));
    }
  } else if (bareS > 0) {
    fields += fmt::format(", \"bare_ms\": {:.3f}", bareS * 1e3);
  }
  fmt::print("{}}}\n", fields);
  std::fflush(stdout);
}

// One rank's whole run over every bucket size. `pg` null: one process without DDP.
void runRank(const Config& c, const ProcessGroupPtr& pg) {
  blas::setNumThreads(1);
  const int rank = pg ? pg->rank() : 0;
  const int world = pg ? pg->size() : 1;
  // Synthetic data, generated once; each rank its own slice.
  Generator g(1234 + static_cast<uint64_t>(rank));
  Tensor x = randn({kBatch, kIn}, {}, &g);
  Tensor y = randint(0, kClasses, {kBatch}, {.dtype = DType::Int64}, &g);

  if (!pg) {
    auto model = makeModel();
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    Samples s = runSteps(c, *model, opt, x, y, nullptr, nullptr, nullptr);
    printRow(c, "none", 1, -1, 0, s, 0);
    return;
  }
  const std::string backend = c.label.empty() ? pg->backend(DeviceType::CPU).name() : c.label;
  for (double cap : c.bucketCapsMb) {
    auto model = makeModel();
    dist::DDPOptions o;
    o.bucketCapMb = cap;
    o.firstBucketCapMb = std::min(c.firstBucketCapMb, cap);
    auto ddp = std::make_shared<dist::DistributedDataParallel>(model, pg, o);
    auto hook = std::make_shared<TimedHook>();
    ddp->registerCommHook(hook);
    optim::SGD opt(ddp->parameters(), {.lr = 0.01});
    Samples s = runSteps(c, *ddp, opt, x, y, ddp.get(), hook.get(), pg.get());
    // The same steps under noSync(): what backward costs without communication, for the exposed
    // estimate bench/torch_ddp.py has to use (PyTorch does not report its wait).
    Samples quiet;
    if (!c.noComm) {
      Config q = c;
      q.noComm = true;
      q.warmup = std::max(2, c.warmup / 2);
      quiet = runSteps(q, *ddp, opt, x, y, ddp.get(), nullptr, pg.get());
    }
    int64_t numel = 0;
    for (const Tensor& p : ddp->parameters()) numel += p.numel();
    double bare = bareAllreduce(*pg, numel, c.bareIters);
    if (rank == 0) printRow(c, backend, world, cap, ddp->reducer().numBuckets(), s, bare, quiet);
    if (c.noComm) break;  // the bucket size does not matter without communication
  }
  pg->barrier()->wait();
}

// Forks c.world ranks meeting through a FileStore; returns the exit code (0: all ranks ok).
int runForked(const Config& c) {
  return bench::runForkedRanks("ddp", c.world, c.timeoutS, dist::Millis(60'000),
                               [&](int r, const dist::StorePtr& store) {
                                 dist::ProcessGroupOptions o;
                                 o.backend = c.backend;
                                 auto pg = ProcessGroup::create(store, r, c.world, o);
                                 runRank(c, pg);
                               });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DDP training step of an MLP 784-1024-1024-10 (compare with bench/torch_ddp.py)"};
  Config c;
  app.add_option("--backend", c.backend, "gloo, shm, mpi (under mpirun only), auto")->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucketCapsMb, "bucket cap(s) in MiB; repeat or give a list")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-cap-mb", c.firstBucketCapMb, "DDPOptions::firstBucketCapMb (capped at the bucket cap)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--world", c.world, "ranks to fork (1: one process, no DDP); ignored under a launcher")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--warmup", c.warmup)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--steps", c.steps, "timed steps (medians reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bare-iters", c.bareIters, "timed bare all-reduces")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-comm", c.noComm, "DDP under noSync(): the ranks compute side by side without gradient sync");
  app.add_option("--zero-grad", c.zeroGrad, "zeroGrad(setToNone): none (the default, as PyTorch's set_to_none) or zero")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "zero"}));
  app.add_option("--label", c.label, "name of the backend in the output (default: the backend's own name)");
  bool listBackends = false;
  app.add_flag("--list-backends", listBackends, "print the backends this build registered, one per line, and exit");
  app.add_option("--timeout-s", c.timeoutS, "forked ranks are killed after this")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (listBackends) {
    for (const auto& name : dist::availableBackends()) std::printf("%s\n", name.c_str());
    return 0;
  }

  try {
    if (dist::env::launchEnvironmentPresent()) {
      auto where = dist::env::detectEnvironment();
      if (where.worldSize == 1) {
        runRank(c, nullptr);
        return 0;
      }
      dist::InitOptions init;
      init.backend = c.backend;
      init.environment = where;
      auto pg = dist::initProcessGroup(init);
      runRank(c, pg);
      pg.reset();
      dist::destroyProcessGroup();
      return 0;
    }
    if (c.backend == "mpi") {
      std::fprintf(stderr, "ddp: --backend mpi needs mpirun (mpirun -np 2 %s --backend mpi)\n", argv[0]);
      return 2;
    }
    if (c.world == 1) {
      runRank(c, nullptr);
      return 0;
    }
    return runForked(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: %s\n", e.what());
    return 1;
  }
}
