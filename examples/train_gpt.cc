// A character-level GPT on the shipped King James Bible slice (data/kjv.txt): prints the loss
// going down, checkpoints atomically, resumes exactly, and samples text at the end.
//
//   build/examples/train_gpt --steps 300                       # small model, a few minutes on one core
//   build/examples/train_gpt --steps 600 --checkpoint run.ckpt # saves every --checkpoint-every steps
//   build/examples/train_gpt --steps 600 --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --ddp --checkpoint run.ckpt --resume
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_gpt --fsdp --checkpoint run.ckpt --resume
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
#include <CLI/CLI.hpp>

#include <filesystem>

#include <cohort/cohort.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/text.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/optim/optim.h>
#include <cohort/distributed.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include <cohort/fsdp/state_dict.h>
#include <cohort/fsdp/training_checkpoint.h>

#include "common/checksum.h"
#include "common/progress.h"

using namespace cohort;

namespace {

double evalLoss(nn::GPT& model, data::DataLoader& loader, int64_t batches, int64_t vocab) {
  autograd::NoGradGuard ng;
  model.eval();
  double sum = 0;
  int64_t n = 0;
  for (auto& b : loader) {
    Tensor logits = model(b.data);
    sum += nn::functional::crossEntropy(logits.reshape({-1, vocab}), b.target.reshape({-1})).item<double>();
    if (++n == batches) break;
  }
  model.train();
  return n ? sum / static_cast<double>(n) : 0.0;
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
  bool ddp = false;
  std::string backend;
  app.add_flag("--ddp", ddp, "data-parallel over the job's ranks (under cohortrun, mpirun or srun)");
  app.add_option("--backend", backend, "collective backend with --ddp (default: COHORT_BACKEND, else auto)");
  bool useFsdp = false;
  app.add_flag("--fsdp", useFsdp, "fully sharded data-parallel over the job's ranks (FULL_SHARD)")->excludes("--ddp");
  CLI11_PARSE(app, argc, argv);
  if (resume && checkpoint.empty()) {
    fmt::print(stderr, "train_gpt: --resume needs --checkpoint\n");
    return 2;
  }

  try {
    manualSeed(seed);
    dist::ProcessGroupPtr pg;
    if (ddp || useFsdp) pg = dist::initProcessGroup({.backend = backend});
    const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
    const bool talk = rank == 0;
    std::string text = data::kjvText("all");
    data::CharVocab vocab(text);
    cfg.vocabSize = vocab.size();
    size_t split = text.size() * 9 / 10;
    auto train = std::make_shared<data::CharDataset>(vocab, std::string_view(text).substr(0, split), cfg.blockSize);
    auto val =
        std::make_shared<data::CharDataset>(vocab, std::string_view(text).substr(split), cfg.blockSize, cfg.blockSize);
    auto gpt = std::make_shared<nn::GPT>(cfg);
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
    optim::CosineWithWarmup sched(opt, {.warmupSteps = warmup, .totalSteps = steps, .minLr = minLr});
    data::DataLoaderOptions lo{.batchSize = batchSize, .shuffle = true, .seed = seed, .dropLast = true};
    if (pg) lo.sampler = data::DistributedSampler({.rank = rank, .worldSize = world, .seed = seed, .dropLast = true});
    data::DataLoader loader(train, lo);
    data::DataLoader valLoader(val, {.batchSize = batchSize});

    int64_t step = 0;
    if (resume && (sharded ? fsdp::hasTrainingCheckpoint(checkpoint) : std::filesystem::exists(checkpoint))) {
      io::TrainingState st =
          sharded ? fsdp::loadTrainingCheckpoint(
                        *sharded, checkpoint,
                        {.optimizer = &opt, .scheduler = &sched, .loader = &loader, .generator = &defaultGenerator()})
                  : io::restoreCheckpoint(checkpoint, {.model = &model,
                                                       .optimizer = &opt,
                                                       .scheduler = &sched,
                                                       .loader = &loader,
                                                       .generator = &defaultGenerator()});
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
    examples::Progress progress(stopAt, "tokens");
    progress.setStartStep(step);
    while (step < stopAt) {
      for (auto& b : loader) {
        Tensor logits = (*trained)(b.data);
        Tensor loss = nn::functional::crossEntropy(logits.reshape({-1, cfg.vocabSize}), b.target.reshape({-1}));
        opt.zeroGrad();
        loss.backward();
        if (sharded) sharded->clipGradNorm(clip);
        else optim::clipGradNorm(model.parameters(), clip);
        opt.step();
        sched.step();
        ++step;
        progress.add(b.data.numel() * world);
        if (talk && (step % logInterval == 0 || step == stopAt))
          progress.log(step, loss.item<double>(), fmt::format("lr {:.2e}", opt.paramGroups()[0].lr()));
        if (!checkpoint.empty() && (step % ckptEvery == 0 || step == stopAt) && (sharded || talk)) {
          io::TrainingState st;
          st.scheduler = sched.state();
          st.step = step;
          st.dataPosition = loader.position();
          st.generators["cpu"] = defaultGenerator().state();
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
    if (!talk) return 0;
    nn::GPT& finalModel = *gpt;
    fmt::print("validation loss: {:.4f}\n", evalLoss(finalModel, valLoader, 20, cfg.vocabSize));
    if (sampleTokens > 0) {
      finalModel.eval();
      Tensor idx = vocab.encodeTensor(prompt).unsqueeze(0);
      Generator g(seed + 1);
      Tensor out = finalModel.generate(idx, sampleTokens, 0.8, 0, &g);
      fmt::print("--- sample ---\n{}\n--------------\n", vocab.decode(out.select(0, 0)));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
