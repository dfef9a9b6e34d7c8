// A character-level GPT on the shipped King James Bible slice (data/kjv.txt): prints the loss
// going down, checkpoints atomically, resumes exactly, and samples text at the end.
//
//   build/examples/train_gpt --steps 300                       # small model, a few minutes on one core
//   build/examples/train_gpt --steps 600 --checkpoint run.ckpt # saves every --checkpoint-every steps
//   build/examples/train_gpt --steps 600 --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --ddp --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --fsdp --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --pipeline 2 --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --ddp --amp bf16 --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 4 build/examples/train_gpt --pipeline 2 --schedule zb --micro-batches 8
//   build/examples/train_gpt --steps 10 --profile prof          # prof/trace.json (Perfetto) and prof/memory.html
//   build/examples/train_gpt --device cuda --amp bf16           # on a GPU (--ddp/--fsdp/--pipeline: one per rank)
//
// With --ddp every rank trains on its DistributedSampler shard (global batch = --batch-size ×
// ranks) under DistributedDataParallel; rank 0 prints and writes the checkpoint, every rank
// resumes from it (so a job restarted by cohortrun continues where the last checkpoint was).
// With --fsdp the model is FullyShardedDataParallel instead (FULL_SHARD, each TransformerBlock a
// unit): the optimizer holds only this rank's shards, gradients are clipped by the global norm,
// and --checkpoint names a folder holding one FSDP training checkpoint (fsdp/training_checkpoint.h):
// every rank writes its model and optimizer shard and its training state, and a manifest written
// last commits them together, so a crash while saving leaves the previous checkpoint whole (any
// number of ranks can resume from it); at the end rank 0 evaluates and samples from the gathered
// full state dict.
// With --pipeline N the GPT is cut into N stages (pipeline/split.h: blocks divided evenly,
// embeddings on the first stage, LM head on the last, their tied weight kept in sync) trained by
// a pipeline schedule (--schedule, --micro-batches, --lookahead, --split-tail; "interleaved" and
// "v" cut 2N stages, two per rank).
// A world larger than N holds world / N pipeline replicas, laid out by a DeviceMesh (data x
// pipe), each stage a DistributedDataParallel over the same stage of the other replicas, each
// replica on its DistributedSampler shard. Gradients are clipped by their norm over the whole
// pipeline. --checkpoint names a folder: every pipeline rank of replica 0 writes its stages'
// training state into step-<k>/, and rank 0 then commits it by rewriting `latest` (so a crash
// while saving leaves the previous step whole); --resume continues from the committed step, with
// the same --pipeline and --schedule. At the end rank 0 gathers the stages into the whole GPT to
// evaluate and sample, and prints its parameter checksum.
// With --amp bf16|fp16 forward and loss run under amp::Autocast (float32 weights and optimizer);
// fp16 also scales the loss with an amp::GradScaler (its skip decision agreed over the ranks under
// --ddp and --fsdp), prints the loss scale whenever it changes, and keeps the scaler's state in
// the checkpoint. Not with --pipeline.
// With --tensorboard DIR rank 0 also logs, at every progress line, train/loss, train/lr,
// train/throughput (tokens/s) and, with --amp fp16, train/loss_scale to a TensorBoard event file in
// DIR, and the validation loss (eval/loss) at the end; `tensorboard --logdir DIR` shows them.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/text.h>
#include <cohort/core/io/atomic_file.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/summary_writer.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/optim/optim.h>
#include <cohort/distributed.h>
#include <cohort/distributed/env/environment.h>
#include <cohort/distributed/grad_scaler.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include <cohort/fsdp/sharded_grad_scaler.h>
#include <cohort/fsdp/state_dict.h>
#include <cohort/fsdp/training_checkpoint.h>
#include <cohort/pipeline/pipeline.h>
#include <cohort/pipeline/split.h>

#include "common/checksum.h"
#include "common/progress.h"
#include "common/step_profiler.h"

using namespace cohort;

namespace {

// What --tensorboard logs at each progress line, in every mode.
void logTraining(io::SummaryWriter& tb, int64_t step, double loss, double lr, double tokensPerSecond) {
  tb.addScalar("train/loss", loss, step);
  tb.addScalar("train/lr", lr, step);
  tb.addScalar("train/throughput", tokensPerSecond, step);
}

// Where a module's parameters are (the CPU for one without any).
Device deviceOf(nn::Module& model) {
  auto params = model.parameters();
  return params.empty() ? Device::cpu() : params[0].device();
}

// --device: "cpu", "cuda:N", or "cuda": under a launcher the GPU of this process's local rank, else
// the first. Makes it the current device. NotSupportedError without a GPU.
Device resolveDevice(const std::string& spec) {
  const Device d = Device::parse(spec);  // ValueError for anything else
  if (d.isCpu()) return d;
  if (!cuda::isAvailable())
    throw NotSupportedError(
        fmt::format("--device {}: no CUDA device is visible (or this build of cohort has no CUDA)", spec));
  const int count = cuda::deviceCount();
  int index = d.index();
  if (spec == "cuda" && dist::env::launchEnvironmentPresent()) index = dist::env::detectEnvironment().localRank % count;
  if (index >= count)
    throw ValueError(
        fmt::format("--device {}: this machine has {} CUDA device(s), cuda:0..cuda:{}", spec, count, count - 1));
  cuda::setDevice(index);
  return Device::cuda(index);
}

double evalLoss(nn::GPT& model, data::DataLoader& loader, int64_t batches, int64_t vocab) {
  autograd::NoGradGuard ng;
  model.eval();
  const Device device = deviceOf(model);
  double sum = 0;
  int64_t n = 0;
  for (auto& b : loader) {
    Tensor logits = model(b.data.to(device));
    sum += nn::functional::crossEntropy(logits.reshape({-1, vocab}), b.target.to(device).reshape({-1})).item<double>();
    if (++n == batches) break;
  }
  model.train();
  return n ? sum / static_cast<double>(n) : 0.0;
}

// The shipped text: its vocabulary, and training / validation datasets (the last tenth).
struct Corpus {
  std::string text = data::kjvText("all");
  data::CharVocab vocab{text};
  size_t split = text.size() * 9 / 10;
  std::shared_ptr<data::CharDataset> train, val;
  explicit Corpus(int64_t blockSize)
      : train(std::make_shared<data::CharDataset>(vocab, std::string_view(text).substr(0, split), blockSize)),
        val(std::make_shared<data::CharDataset>(vocab, std::string_view(text).substr(split), blockSize, blockSize)) {}
};

struct PipelineRun {
  int stages = 0;
  std::string schedule = "1f1b";
  int microbatches = 4;
  int lookahead = 0;
  int splitTail = 0;
};

// The committed step of a pipeline checkpoint folder (-1: none).
int64_t committedStep(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  int64_t step = -1;
  if (!(in >> step)) return -1;
  return step;
}

// This pipeline rank's stages as one module (for its checkpoint file).
class LocalStages : public nn::Module {
 public:
  LocalStages(const std::vector<nn::ModulePtr>& stages, const std::vector<int>& ids) : Module("LocalStages") {
    for (size_t i = 0; i < stages.size(); ++i) registerModule(fmt::format("stage{}", ids[i]), stages[i]);
  }
};

int trainPipelined(const PipelineRun& run, nn::GPTConfig cfg, const std::string& backend, Device device, int64_t steps,
                   int64_t stopAfter, int64_t batchSize, int64_t warmup, int64_t logInterval, int64_t ckptEvery,
                   double lr, double minLr, double weightDecay, double clip, uint64_t seed,
                   const std::string& checkpoint, bool resume, int64_t sampleTokens, const std::string& prompt,
                   const std::string& tensorboard) {
  namespace fs = std::filesystem;
  auto world = dist::initProcessGroup({.backend = backend});
  const int N = run.stages, W = world->size();
  if (W % N != 0)
    throw ValueError(fmt::format("--pipeline {}: the world's {} ranks do not divide into pipelines of {}", N, W, N));
  dist::DeviceMesh mesh(world, {{"data", W / N}, {"pipe", N}});
  const int replica = mesh.coordinate("data"), pipeRank = mesh.coordinate("pipe"), replicas = W / N;
  const bool talk = world->rank() == 0;
  std::unique_ptr<io::SummaryWriter> tb;
  if (talk && !tensorboard.empty()) tb = std::make_unique<io::SummaryWriter>(tensorboard);

  Corpus corpus(cfg.blockSize);
  const data::CharVocab& vocab = corpus.vocab;
  cfg.vocabSize = vocab.size();
  // Every rank builds the whole GPT from one seed and keeps its stages (the tied embedding and LM
  // head start equal on the first and last stage).
  auto gpt = std::make_shared<nn::GPT>(cfg);
  pipeline::Schedule schedule = pipeline::makeSchedule(run.schedule, N, run.microbatches, 0, run.lookahead);
  pipeline::StageSplit parts = pipeline::splitGPT(gpt, schedule.stages);
  std::vector<nn::ModulePtr> mine, plain;
  const std::vector<int> ids = schedule.stagesOf(pipeRank);
  for (int s : ids) {
    nn::ModulePtr stage = parts.stages[static_cast<size_t>(s)];
    stage->to(device);
    plain.push_back(stage);
    mine.push_back(replicas > 1 ? std::make_shared<dist::DistributedDataParallel>(stage, mesh.group("data")) : stage);
  }
  pipeline::Pipeline pipe(
      mine, pipeline::processGroupTransport(mesh.group("pipe"), device),
      [&](const Tensor& logits, const Tensor& target) {
        return nn::functional::crossEntropy(logits.reshape({-1, cfg.vocabSize}), target.reshape({-1}));
      },
      schedule, {.splitTail = run.splitTail, .tied = parts.tied});
  LocalStages local(plain, ids);
  optim::AdamW opt(pipe.parameters(), {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .weightDecay = weightDecay});
  optim::CosineWithWarmup sched(opt, {.warmupSteps = warmup, .totalSteps = steps, .minLr = minLr});
  data::DataLoaderOptions lo{.batchSize = batchSize, .shuffle = true, .seed = seed, .dropLast = true};
  lo.sampler = data::DistributedSampler({.rank = replica, .worldSize = replicas, .seed = seed, .dropLast = true});
  data::DataLoader loader(corpus.train, lo);
  data::DataLoader valLoader(corpus.val, {.batchSize = batchSize});

  int64_t step = 0;
  const std::string mineFile = fmt::format("pipe-rank{}.ckpt", pipeRank);
  if (resume && committedStep(checkpoint) >= 0) {
    const int64_t at = committedStep(checkpoint);
    const std::string file = fmt::format("{}/step-{}/{}", checkpoint, at, mineFile);
    io::TrainingState st = io::restoreCheckpoint(
        file,
        {.model = &local, .optimizer = &opt, .scheduler = &sched, .loader = &loader, .generator = &defaultGenerator()});
    step = st.step;
    if (talk)
      fmt::print("resumed from {} at step {} (epoch {}, batch {})\n", checkpoint, step, st.dataPosition.epoch,
                 st.dataPosition.batch);
  }
  if (talk)
    fmt::print("train_gpt: {} parameters, vocab {}, {} steps, pipeline of {} ranks x {} replica(s) ({} schedule, {} "
               "stages, {} micro-batches, {} backend)\n",
               gpt->numParameters(), vocab.size(), steps, N, replicas, schedule.name, schedule.stages,
               schedule.microbatches, world->backend(DeviceType::CPU).name());

  const int64_t stopAt = stopAfter > 0 ? std::min(stopAfter, steps) : steps;
  examples::Progress progress(stopAt, "tokens");
  progress.setStartStep(step);
  while (step < stopAt) {
    for (auto& b : loader) {
      opt.zeroGrad();
      Tensor loss = pipe.step(b.data, b.target);  // this replica's batch loss, on every rank
      pipe.clipGradNorm(clip);
      opt.step();
      sched.step();
      ++step;
      progress.add(b.data.numel() * replicas);
      if (replicas > 1) {
        mesh.group("data")->allreduce(loss)->wait();
        loss = loss / static_cast<double>(replicas);
      }
      if (talk && (step % logInterval == 0 || step == stopAt)) {
        const double lossValue = loss.item<double>(), lr = opt.paramGroups()[0].lr();
        const double tokensPerSecond = progress.log(step, lossValue, fmt::format("lr {:.2e}", lr));
        if (tb) logTraining(*tb, step, lossValue, lr, tokensPerSecond);
      }
      if (!checkpoint.empty() && (step % ckptEvery == 0 || step == stopAt)) {
        // Replica 0's pipeline ranks write step-<k>/, then rank 0 commits it.
        const std::string dir = fmt::format("{}/step-{}", checkpoint, step);
        if (replica == 0) {
          fs::create_directories(dir);
          io::TrainingState st;
          st.model = local.stateDict();
          st.optimizer = opt.stateDict();
          st.scheduler = sched.state();
          st.step = step;
          st.dataPosition = loader.position();
          st.generators["cpu"] = defaultGenerator().state();
          io::saveCheckpoint(dir + "/" + mineFile, st);
        }
        world->barrier()->wait();
        if (talk) {
          const int64_t previous = committedStep(checkpoint);
          io::writeFileAtomically(checkpoint + "/latest", [&](io::AtomicWriter& w) {
            const std::string line = fmt::format("{}\n", step);
            w.write(line.data(), line.size());
          });
          if (previous >= 0 && previous != step) fs::remove_all(fmt::format("{}/step-{}", checkpoint, previous));
        }
      }
      if (step >= stopAt) break;
    }
  }
  // Rank 0 gathers the trained stages of replica 0 into its whole GPT (the stages' state dicts
  // carry the GPT's names), evaluates and samples.
  for (int s = 0; s < schedule.stages; ++s) {
    const int owner = mesh.rankAt({0, schedule.rankOf(s)});
    if (owner == 0) continue;
    for (auto& [name, t] : parts.stages[static_cast<size_t>(s)]->stateDict()) {
      // Through the host: the group's CPU backend, wherever the stages run.
      if (world->rank() == owner) world->send(t.to(Device::cpu()).contiguous(), 0)->wait();
      if (talk) {
        Tensor into = empty(t.sizes(), {.dtype = t.dtype()});
        world->recv(into, owner)->wait();
        autograd::NoGradGuard ng;
        t.copy_(into);
      }
    }
  }
  world->barrier()->wait();
  // The last collective is behind us: the default group goes with this function's references,
  // while the CUDA runtime is still up (a global released after main would outlive it).
  dist::destroyProcessGroup();
  if (!talk) return 0;
  fmt::print("parameter checksum {:016x}\n", examples::parameterChecksum(*gpt));
  const double valLoss = evalLoss(*gpt, valLoader, 20, cfg.vocabSize);
  fmt::print("validation loss: {:.4f}\n", valLoss);
  if (tb) {
    tb->addScalar("eval/loss", valLoss, step);
    tb->close();
  }
  if (sampleTokens > 0) {
    gpt->eval();
    Tensor idx = vocab.encodeTensor(prompt).unsqueeze(0).to(deviceOf(*gpt));
    Generator g(seed + 1);
    Tensor out = gpt->generate(idx, sampleTokens, 0.8, 0, &g);
    fmt::print("--- sample ---\n{}\n--------------\n", vocab.decode(out.select(0, 0).to(Device::cpu())));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a character-level GPT on the shipped King James Bible text with cohort."};
  nn::GPTConfig cfg;
  cfg.blockSize = 64;
  cfg.nLayer = 2;
  cfg.nHead = 4;
  cfg.nEmbd = 64;
  cfg.dropout = 0.0;
  int64_t stopAfter = 0;
  int64_t steps = 300, batchSize = 16, warmup = 30, logInterval = 25, ckptEvery = 100, sampleTokens = 300;
  double lr = 3e-3, minLr = 3e-4, weightDecay = 0.1, clip = 1.0;
  uint64_t seed = 0;
  std::string checkpoint, prompt = "And God said";
  bool resume = false;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--stop-after", stopAfter,
                 "stop (with a checkpoint) after this many steps; the schedule still spans --steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", batchSize, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--block-size", cfg.blockSize, "context length")->check(CLI::PositiveNumber);
  app.add_option("--layers", cfg.nLayer, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", cfg.nHead, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--embd", cfg.nEmbd, "width")->check(CLI::PositiveNumber);
  app.add_option("--dropout", cfg.dropout, "dropout probability")->check(CLI::Range(0.0, 1.0));
  app.add_option("--lr", lr, "peak learning rate (AdamW)")->check(CLI::PositiveNumber);
  app.add_option("--min-lr", minLr, "learning rate at the end of the cosine decay");
  app.add_option("--warmup", warmup, "linear warmup steps");
  app.add_option("--clip", clip, "gradient norm clip")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed for initialisation, batches and sampling");
  app.add_option("--log-interval", logInterval, "steps between progress lines")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint file, or folder with --fsdp (written atomically every --checkpoint-every steps)");
  app.add_option("--checkpoint-every", ckptEvery, "steps between checkpoints")->check(CLI::PositiveNumber);
  app.add_flag("--resume", resume, "continue from --checkpoint if it exists");
  app.add_option("--sample-tokens", sampleTokens, "characters to sample at the end (0 = none)");
  app.add_option("--prompt", prompt, "text the sample starts from");
  std::string ampName = "none";
  app.add_option("--amp", ampName,
                 "mixed precision: bf16 or fp16 autocast (float32 weights; fp16 scales the loss with a GradScaler)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  bool ddp = false;
  std::string backend;
  app.add_flag("--ddp", ddp, "data-parallel over the job's ranks (under cohortrun, mpirun or srun)");
  app.add_option("--backend", backend, "collective backend with --ddp (default: COHORT_BACKEND, else auto)");
  bool useFsdp = false;
  auto* fsdpFlag = app.add_flag("--fsdp", useFsdp, "fully sharded data-parallel over the job's ranks (FULL_SHARD)")
                       ->excludes("--ddp");
  PipelineRun pipelined;
  app.add_option("--pipeline", pipelined.stages,
                 "pipeline-parallel over this many ranks (data-parallel replicas of it when the world is larger)")
      ->check(CLI::PositiveNumber)
      ->excludes("--ddp")
      ->excludes(fsdpFlag);
  app.add_option("--schedule", pipelined.schedule, "pipeline schedule with --pipeline")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "v", "zb"}));
  app.add_option("--micro-batches", pipelined.microbatches, "micro-batches per step with --pipeline")
      ->check(CLI::PositiveNumber);
  app.add_option("--lookahead", pipelined.lookahead,
                 "with --pipeline: forwards each rank runs ahead beyond the schedule's own (1f1b, interleaved, v, zb; "
                 "more activations held, fewer stalls)")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--split-tail", pipelined.splitTail,
         "with --pipeline: the backwards of the last K micro-batches split into input and weight halves, the "
         "weight halves filling the waits at the end of each step (good K: the ranks - 1 with 1f1b, the ranks with "
         "interleaved)")
      ->check(CLI::NonNegativeNumber);
  std::string deviceName = "cpu";
  app.add_option("--device", deviceName,
                 "cpu, cuda (under a launcher: the GPU of the local rank) or cuda:N; with --ddp/--fsdp/--pipeline "
                 "the group's nccl backend carries the GPU tensors when this build has it");
  std::string profileDir;
  app.add_option("--profile", profileDir,
                 "profile steps 3-5 (memory and shapes): DIR/trace.json for Perfetto, DIR/memory.html, the op table");
  std::string tensorboard;
  app.add_option("--tensorboard", tensorboard,
                 "log loss, learning rate, throughput (and the loss scale) to TensorBoard event files in this folder");
  CLI11_PARSE(app, argc, argv);
  if (resume && checkpoint.empty()) {
    fmt::print(stderr, "train_gpt: --resume needs --checkpoint\n");
    return 2;
  }
  if (pipelined.stages > 0 && !profileDir.empty()) {
    fmt::print(stderr,
               "train_gpt: --profile is not supported with --pipeline; profile the job with cohortrun --profile DIR\n");
    return 2;
  }
  if (pipelined.stages > 0 && ampName != "none") {
    fmt::print(stderr, "train_gpt: --amp is not supported with --pipeline (single process, --ddp or --fsdp)\n");
    return 2;
  }

  try {
    manualSeed(seed);
    const Device device = resolveDevice(deviceName);
    if (pipelined.stages > 0)
      return trainPipelined(pipelined, cfg, backend, device, steps, stopAfter, batchSize, warmup, logInterval,
                            ckptEvery, lr, minLr, weightDecay, clip, seed, checkpoint, resume, sampleTokens, prompt,
                            tensorboard);
    dist::ProcessGroupPtr pg;
    if (ddp || useFsdp) pg = dist::initProcessGroup({.backend = backend});
    const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
    const bool talk = rank == 0;
    std::unique_ptr<io::SummaryWriter> tb;
    if (talk && !tensorboard.empty()) tb = std::make_unique<io::SummaryWriter>(tensorboard);
    Corpus corpus(cfg.blockSize);
    const data::CharVocab& vocab = corpus.vocab;
    const std::string& text = corpus.text;
    const size_t split = corpus.split;
    cfg.vocabSize = vocab.size();
    auto gpt = std::make_shared<nn::GPT>(cfg);
    gpt->to(device);  // before DDP or FSDP wraps it: their buffers follow the parameters
    nn::GPT& model = *gpt;
    std::shared_ptr<nn::Module> trained = gpt;
    std::shared_ptr<fsdp::FullyShardedDataParallel> sharded;
    if (useFsdp) {
      sharded = std::make_shared<fsdp::FullyShardedDataParallel>(
          gpt, pg, fsdp::FSDPOptions{.autoWrapPolicy = fsdp::wrapModuleTypes({"TransformerBlock"})});
      trained = sharded;
    } else if (pg) {
      trained = std::make_shared<dist::DistributedDataParallel>(gpt, pg);
    }
    optim::AdamW opt(trained->parameters(), {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .weightDecay = weightDecay});
    // Mixed precision: forward and loss under autocast; float16 also needs loss scaling, with the
    // skip decision agreed over the ranks (ShardedGradScaler for FSDP's shards). A disabled scaler
    // is a plain backward and optimizer step.
    const bool amp = ampName != "none", fp16 = ampName == "fp16";
    const DType ampDType = fp16 ? DType::Float16 : DType::BFloat16;
    std::unique_ptr<amp::GradScaler> scaler;
    if (sharded) scaler = std::make_unique<fsdp::ShardedGradScaler>(*sharded, amp::GradScalerOptions{.enabled = fp16});
    else if (pg)
      scaler = std::make_unique<amp::GradScaler>(amp::GradScalerOptions{.enabled = fp16}, dist::foundInfAllReduce(pg));
    else scaler = std::make_unique<amp::GradScaler>(amp::GradScalerOptions{.enabled = fp16});
    optim::CosineWithWarmup sched(opt, {.warmupSteps = warmup, .totalSteps = steps, .minLr = minLr});
    data::DataLoaderOptions lo{.batchSize = batchSize, .shuffle = true, .seed = seed, .dropLast = true};
    if (pg) lo.sampler = data::DistributedSampler({.rank = rank, .worldSize = world, .seed = seed, .dropLast = true});
    data::DataLoader loader(corpus.train, lo);
    data::DataLoader valLoader(corpus.val, {.batchSize = batchSize});

    int64_t step = 0;
    if (resume && (sharded ? fsdp::hasTrainingCheckpoint(checkpoint) : std::filesystem::exists(checkpoint))) {
      io::TrainingState st = sharded ? fsdp::loadTrainingCheckpoint(*sharded, checkpoint,
                                                                    {.optimizer = &opt,
                                                                     .scheduler = &sched,
                                                                     .loader = &loader,
                                                                     .generator = &defaultGenerator(),
                                                                     .gradScaler = fp16 ? scaler.get() : nullptr})
                                     : io::restoreCheckpoint(checkpoint, {.model = &model,
                                                                          .optimizer = &opt,
                                                                          .scheduler = &sched,
                                                                          .loader = &loader,
                                                                          .generator = &defaultGenerator(),
                                                                          .gradScaler = fp16 ? scaler.get() : nullptr});
      step = st.step;
      if (talk)
        fmt::print("resumed from {} at step {} (epoch {}, batch {})\n", checkpoint, step, st.dataPosition.epoch,
                   st.dataPosition.batch);
    }
    int64_t params = 0;
    for (auto& p : model.parameters()) params += p.numel();
    if (sharded) params = model.numParameters();
    if (talk)
      fmt::print("train_gpt: {} parameters, vocab {}, {} train / {} validation characters, {} steps{}\n", params,
                 vocab.size(), split, text.size() - split, steps,
                 pg ? fmt::format(" on {} ranks ({} backend{})", world, pg->backend(DeviceType::CPU).name(),
                                  sharded ? ", FSDP FULL_SHARD" : "")
                    : "");

    int64_t stopAt = stopAfter > 0 ? std::min(stopAfter, steps) : steps;
    examples::StepProfiler stepProfiler(profileDir, rank, world, step + 2);
    examples::Progress progress(stopAt, "tokens");
    progress.setStartStep(step);
    while (step < stopAt) {
      for (auto& b : loader) {
        Tensor loss;
        {
          amp::Autocast autocast(device.type(), ampDType, {.enabled = amp});
          Tensor logits = (*trained)(b.data.to(device));
          loss = nn::functional::crossEntropy(logits.reshape({-1, cfg.vocabSize}), b.target.to(device).reshape({-1}));
        }
        opt.zeroGrad();
        scaler->scale(loss).backward();
        scaler->unscale(opt);  // clip the true gradients
        if (sharded) sharded->clipGradNorm(clip);
        else optim::clipGradNorm(model.parameters(), clip);
        const double scaleBefore = scaler->getScale();
        const bool stepped = scaler->step(opt);
        scaler->update();
        if (talk && fp16 && scaler->getScale() != scaleBefore)
          fmt::print("step {}: loss scale {} -> {}{}\n", step + 1, scaleBefore, scaler->getScale(),
                     stepped ? "" : " (inf/NaN gradient: step skipped)");
        sched.step();
        ++step;
        stepProfiler.afterStep(step);
        progress.add(b.data.numel() * world);
        if (talk && (step % logInterval == 0 || step == stopAt)) {
          const double lossValue = loss.item<double>(), lr = opt.paramGroups()[0].lr();
          const double tokensPerSecond = progress.log(step, lossValue, fmt::format("lr {:.2e}", lr));
          if (tb) {
            logTraining(*tb, step, lossValue, lr, tokensPerSecond);
            if (fp16) tb->addScalar("train/loss_scale", scaler->getScale(), step);
          }
        }
        if (!checkpoint.empty() && (step % ckptEvery == 0 || step == stopAt) && (sharded || talk)) {
          io::TrainingState st;
          st.scheduler = sched.state();
          st.step = step;
          st.dataPosition = loader.position();
          st.generators["cpu"] = defaultGenerator().state();
          if (fp16) st.gradScaler = scaler->stateDict();
          if (sharded) {
            fsdp::saveTrainingCheckpoint(*sharded, checkpoint, &opt, st);  // every rank: one commit
          } else {
            st.model = model.stateDict();
            st.optimizer = opt.stateDict();
            io::saveCheckpoint(checkpoint, st);
          }
        }
        if (step >= stopAt) break;
      }
    }
    if (pg) pg->barrier()->wait();  // rank 0's last checkpoint is on disk before anyone exits
    if (ddp) fmt::print("rank {} parameter checksum {:016x}\n", rank, examples::parameterChecksum(*gpt));
    if (sharded) {
      // The trained weights, gathered for rank 0 into the plain model (collective).
      nn::StateDict full = fsdp::fullStateDict(*sharded, {.rank0Only = true});
      sharded.reset();
      trained.reset();
      if (talk) {
        gpt = std::make_shared<nn::GPT>(cfg);
        gpt->loadStateDict(full);
      }
    }
    if (pg) dist::destroyProcessGroup();  // as in trainPipelined: released with pg, in this scope
    if (!talk) return 0;
    nn::GPT& finalModel = *gpt;
    const double valLoss = evalLoss(finalModel, valLoader, 20, cfg.vocabSize);
    fmt::print("validation loss: {:.4f}\n", valLoss);
    if (tb) {
      tb->addScalar("eval/loss", valLoss, step);
      tb->close();
    }
    if (sampleTokens > 0) {
      finalModel.eval();
      Tensor idx = vocab.encodeTensor(prompt).unsqueeze(0).to(deviceOf(finalModel));
      Generator g(seed + 1);
      Tensor out = finalModel.generate(idx, sampleTokens, 0.8, 0, &g);
      fmt::print("--- sample ---\n{}\n--------------\n", vocab.decode(out.select(0, 0).to(Device::cpu())));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
