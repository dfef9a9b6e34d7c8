/*
 * FSDP memory and step time against DDP on the same model (the goals: model state per rank with
 * FULL_SHARD at most 0.30x DDP's for 4 ranks, step time at most 1.25x DDP's for 2 ranks).
 *
 * Workload: a GPT (default 8 layers, 512 wide, 8 heads, vocabulary 50304, tied embeddings: about
 * 51M parameters Ψ), float32, AdamW, batch 1 × 64 tokens per rank, synthetic tokens, one BLAS
 * thread per rank, each TransformerBlock an FSDP unit. `--warmup` steps, then `--steps` timed
 * steps (zeroGrad, forward, cross-entropy, backward, optimizer step; ranks meet at a barrier
 * before each step, rank 0's wall clock times it).
 *
 * Memory comes from the CPU allocator's accounting (memoryStats), per process, so ranks are
 * processes: the program forks `--world` ranks that meet through a FileStore (the parent kills
 * them past `--timeout-s`). Each rank reads, relative to what was live before the model was built:
 *   state    bytes live right after the optimizer step (parameters, gradients and optimizer state:
 *            the model state, plus small buffers such as the attention masks);
 *   peak     the high-water mark during the step (state plus activations plus FSDP's gathered units);
 * the largest rank's value is printed, in MiB and in bytes per parameter, beside the ZeRO formula
 * for this layout in float32 with Adam (4 bytes parameter + 4 gradient + 8 optimizer state):
 *   ddp, no_shard        16Ψ
 *   shard_grad_op        16Ψ/N at rest (the full parameters, 4Ψ, live from forward to backward)
 *   full_shard           16Ψ/N (plus one gathered unit and the root while it runs)
 * (the mixed-precision forms, 16Ψ → 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N, are ZeRO stages 1-3 with
 * 2-byte parameters and gradients; docs/benchmarks.md lists both).
 *
 *   build-fsdp/bench/fsdp --world 4 --mode ddp,full_shard,shard_grad_op,no_shard
 *   build-fsdp/bench/fsdp --world 2 --mode ddp,full_shard --steps 5
 *
 * Rank 0 prints one JSON line per mode.
 */
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/store/file_store.h>

#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include "forked_ranks.h"

using namespace cohort;

namespace {

struct Config {
  int world = 4;
  std::vector<std::string> modes = {"ddp", "full_shard", "shard_grad_op", "no_shard"};
  int layers = 8, embd = 512, heads = 8, vocab = 50304, seq = 64, batch = 1;
  int warmup = 1, steps = 3;
  std::string backend = "auto";
  bool forwardPrefetch = false;
  bool backwardPrefetch = true;
  int timeoutS = 1800;
};

double wallNow() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double formulaBytesPerParam(const std::string& mode, int n) {
  if (mode == "ddp" || mode == "no_shard") return 16.0;
  return 16.0 / n;
}

void runMode(const Config& c, const std::string& mode, const dist::ProcessGroupPtr& pg) {
  const int rank = pg->rank(), world = pg->size();
  Generator data(1234 + static_cast<uint64_t>(rank));
  Tensor x = randint(0, c.vocab, {c.batch, c.seq}, {.dtype = DType::Int64}, &data);
  Tensor y = randint(0, c.vocab, {c.batch, c.seq}, {.dtype = DType::Int64}, &data);
  pg->barrier()->wait();
  const int64_t base = memoryStats().bytesLive;

  nn::GPTConfig cfg{.vocabSize = c.vocab, .blockSize = c.seq, .nLayer = c.layers, .nHead = c.heads, .nEmbd = c.embd};
  Generator init(42);
  auto gpt = std::make_shared<nn::GPT>(cfg, &init);
  const int64_t psi = gpt->numParameters();
  nn::ModulePtr model;
  if (mode == "ddp") {
    model = std::make_shared<dist::DistributedDataParallel>(gpt, pg);
  } else {
    fsdp::FSDPOptions o;
    o.strategy = mode == "full_shard"      ? fsdp::ShardingStrategy::FullShard
                 : mode == "shard_grad_op" ? fsdp::ShardingStrategy::ShardGradOp
                 : mode == "no_shard"      ? fsdp::ShardingStrategy::NoShard
                                           : throw ValueError(fmt::format("unknown mode '{}'", mode));
    o.autoWrapPolicy = fsdp::wrapModuleTypes({"TransformerBlock"});
    o.forwardPrefetch = c.forwardPrefetch;
    o.backwardPrefetch = c.backwardPrefetch ? fsdp::BackwardPrefetch::BackwardPre : fsdp::BackwardPrefetch::None;
    model = std::make_shared<fsdp::FullyShardedDataParallel>(gpt, pg, o);
  }
  gpt.reset();
  optim::AdamW opt(model->parameters(), {.lr = 1e-4});

  std::vector<double> times;
  int64_t state = 0, peak = 0;
  for (int step = 0; step < c.warmup + c.steps; ++step) {
    pg->barrier()->wait();
    resetPeakMemory();
    const double t0 = wallNow();
    opt.zeroGrad();
    Tensor logits = (*model)(x);
    Tensor loss = nn::functional::crossEntropy(logits.view({-1, c.vocab}), y.view({-1}));
    logits = Tensor();
    loss.backward();
    opt.step();
    const double t1 = wallNow();
    loss = Tensor();
    if (step >= c.warmup) {
      times.push_back(t1 - t0);
      state = std::max(state, memoryStats().bytesLive - base);
      peak = std::max(peak, memoryStats().peakBytes - base);
    }
  }
  // The largest rank's figures.
  Tensor m = fromVector(std::vector<int64_t>{state, peak}, {2});
  pg->allreduce(m, {.op = dist::ReduceOp::Max})->wait();
  const int64_t* mv = m.data<int64_t>();
  if (rank == 0) {
    const double mib = 1024.0 * 1024.0;
    fmt::print("{{\"mode\": \"{}\", \"world\": {}, \"backend\": \"{}\", \"params\": {}, \"state_mib\": {:.1f}, "
               "\"state_bytes_per_param\": {:.2f}, \"formula_bytes_per_param\": {:.2f}, \"peak_mib\": {:.1f}, "
               "\"peak_bytes_per_param\": {:.2f}, \"ms_step\": {:.1f}, \"forward_prefetch\": {}, "
               "\"backward_prefetch\": {}}}\n",
               mode, world, pg->backend(DeviceType::CPU).name(), psi, mv[0] / mib, double(mv[0]) / psi,
               formulaBytesPerParam(mode, world), mv[1] / mib, double(mv[1]) / psi, median(times) * 1e3,
               c.forwardPrefetch, c.backwardPrefetch);
    std::fflush(stdout);
  }
  pg->barrier()->wait();
}

int runForked(const Config& c) {
  return bench::runForkedRanks("fsdp", c.world, c.timeoutS, dist::Millis(120'000),
                               [&](int r, const dist::StorePtr& store) {
                                 blas::setNumThreads(1);
                                 dist::ProcessGroupOptions o;
                                 o.backend = c.backend;
                                 o.timeout = dist::Millis(c.timeoutS * 1000);
                                 auto pg = dist::ProcessGroup::create(store, r, c.world, o);
                                 for (const auto& mode : c.modes) runMode(c, mode, pg);
                               });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FSDP memory per rank and step time against DDP on a GPT"};
  Config c;
  app.add_option("--world", c.world, "ranks (processes) to fork")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--mode", c.modes, "ddp, full_shard, shard_grad_op, no_shard (a list)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--layers", c.layers, "GPT layers")->capture_default_str();
  app.add_option("--embd", c.embd, "GPT width")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--vocab", c.vocab, "vocabulary")->capture_default_str();
  app.add_option("--seq", c.seq, "tokens per sample")->capture_default_str();
  app.add_option("--batch", c.batch, "samples per rank")->capture_default_str();
  app.add_option("--warmup", c.warmup, "untimed steps")->capture_default_str();
  app.add_option("--steps", c.steps, "timed steps")->capture_default_str();
  app.add_option("--backend", c.backend, "gloo, shm, auto")->capture_default_str();
  app.add_flag("--forward-prefetch,!--no-forward-prefetch", c.forwardPrefetch, "FSDP forward prefetch");
  app.add_flag("--backward-prefetch,!--no-backward-prefetch", c.backwardPrefetch, "FSDP backward prefetch");
  app.add_option("--timeout-s", c.timeoutS, "ranks are killed after this")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return runForked(c);
}
