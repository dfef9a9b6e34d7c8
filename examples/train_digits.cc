// Trains a classifier on the 8x8 handwritten digits shipped in data/ (1,437 train / 360 test
// images) and reports test accuracy. An MLP by default; --model cnn uses a small convnet.
//
//   build/examples/train_digits                 # MLP, about 97% test accuracy in a few seconds
//   build/examples/train_digits --model cnn --epochs 15
//   cohortrun --standalone --nproc-per-node 2 build/examples/train_digits --ddp
//   mpirun -np 2 build/examples/train_digits --ddp
//   build/examples/train_digits --tensorboard runs/digits   # then: tensorboard --logdir runs
//
// With --ddp each rank trains on its DistributedSampler shard of every epoch (the global batch is
// --batch-size × ranks) with DistributedDataParallel averaging gradients; rank 0 prints progress
// and every rank prints a checksum of its final parameters (identical on every rank).
// With --tensorboard DIR rank 0 also logs, at every progress line, train/loss, train/lr and
// train/throughput (samples/s) to a TensorBoard event file in DIR, and eval/accuracy at the end.
#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/digits.h>
#include <cohort/core/io/summary_writer.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/optim/optim.h>
#include <cohort/distributed.h>

#include "common/checksum.h"
#include "common/progress.h"

using namespace cohort;

namespace {

std::shared_ptr<nn::Module> makeModel(const std::string& kind, int64_t hidden) {
  if (kind == "mlp")
    return std::make_shared<nn::Sequential>(nn::Linear(64, hidden), nn::ReLU(), nn::Linear(hidden, hidden), nn::ReLU(),
                                            nn::Linear(hidden, 10));
  // [N, 64] -> [N, 1, 8, 8] -> conv 3x3 (16) -> pool -> conv 3x3 (32) -> pool -> [N, 32*2*2] -> 10
  struct Unflatten : nn::Module {
    Unflatten() : nn::Module("Unflatten") {}
    Tensor forward(const Tensor& x) override { return x.reshape({-1, 1, 8, 8}); }
  };
  return std::make_shared<nn::Sequential>(Unflatten(), nn::Conv2d(1, 16, 3, {.padding = {1, 1}}), nn::ReLU(),
                                          nn::MaxPool2d(2), nn::Conv2d(16, 32, 3, {.padding = {1, 1}}), nn::ReLU(),
                                          nn::MaxPool2d(2), nn::Flatten(), nn::Linear(128, hidden), nn::ReLU(),
                                          nn::Linear(hidden, 10));
}

double accuracy(nn::Module& model, data::Dataset& ds) {
  autograd::NoGradGuard ng;
  model.eval();
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&ds, [](const data::Dataset*) {}), {.batchSize = 256});
  int64_t correct = 0, total = 0;
  for (auto& batch : loader) {
    Tensor pred = model(batch.data).argmax(1);
    correct += pred.eq(batch.target).sum().item<int64_t>();
    total += batch.target.numel();
  }
  model.train();
  return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a digits classifier with cohort (8x8 handwritten digits, 10 classes)."};
  std::string model = "mlp";
  int64_t epochs = 20, batchSize = 32, hidden = 128, logInterval = 100;
  double lr = 1e-3;
  uint64_t seed = 0;
  app.add_option("--model", model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batchSize, "examples per step")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed for initialisation and shuffling");
  app.add_option("--log-interval", logInterval, "steps between progress lines")->check(CLI::PositiveNumber);
  bool ddp = false;
  std::string backend;
  app.add_flag("--ddp", ddp, "data-parallel over the job's ranks (under cohortrun, mpirun or srun)");
  app.add_option("--backend", backend, "collective backend with --ddp (default: COHORT_BACKEND, else auto)");
  std::string tensorboard;
  app.add_option("--tensorboard", tensorboard,
                 "log loss, learning rate, throughput and test accuracy to TensorBoard event files in this folder");
  CLI11_PARSE(app, argc, argv);

  try {
    manualSeed(seed);
    dist::ProcessGroupPtr pg;
    if (ddp) pg = dist::initProcessGroup({.backend = backend});
    const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
    auto train = data::digits("train");
    auto test = data::digits("test");
    auto net = makeModel(model, hidden);
    // DDP copies rank 0's initial weights to every rank and averages gradients in backward.
    std::shared_ptr<nn::Module> trained = net;
    if (pg) trained = std::make_shared<dist::DistributedDataParallel>(net, pg);
    optim::AdamW opt(trained->parameters(), {.lr = lr, .weightDecay = 1e-4});
    data::DataLoaderOptions lo{.batchSize = batchSize, .shuffle = true, .seed = seed};
    if (pg) lo.sampler = data::DistributedSampler({.rank = rank, .worldSize = world, .seed = seed});
    data::DataLoader loader(train, lo);
    int64_t total = epochs * loader.numBatches(), step = 0;
    const bool talk = rank == 0;
    std::unique_ptr<io::SummaryWriter> tb;
    if (talk && !tensorboard.empty()) tb = std::make_unique<io::SummaryWriter>(tensorboard);
    if (talk)
      fmt::print(
          "train_digits: {} ({} parameters), {} train / {} test images, {} epochs of {} steps{}\n", model,
          [&] {
            int64_t n = 0;
            for (auto& p : net->parameters()) n += p.numel();
            return n;
          }(),
          train->size(), test->size(), epochs, loader.numBatches(),
          pg ? fmt::format(" on {} ranks ({} backend, global batch {})", world, pg->backend(DeviceType::CPU).name(),
                           batchSize * world)
             : std::string());
    examples::Progress progress(total, "samples");
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      loader.setEpoch(epoch);
      for (auto& batch : loader) {
        Tensor loss = nn::functional::crossEntropy((*trained)(batch.data), batch.target);
        opt.zeroGrad();
        loss.backward();
        opt.step();
        ++step;
        progress.add(batch.target.numel() * world);
        if (talk && (step % logInterval == 0 || step == total)) {
          const double lossValue = loss.item<double>();
          const double samplesPerSecond = progress.log(step, lossValue, fmt::format("epoch {}", epoch + 1));
          if (tb) {
            tb->addScalar("train/loss", lossValue, step);
            tb->addScalar("train/lr", opt.paramGroups()[0].lr(), step);
            tb->addScalar("train/throughput", samplesPerSecond, step);
          }
        }
      }
    }
    double acc = accuracy(*net, *test);
    if (talk)
      fmt::print("test accuracy: {:.2f}% ({} images) after {:.1f} s\n", 100.0 * acc, test->size(), progress.elapsed());
    if (tb) {
      tb->addScalar("eval/accuracy", acc, step);
      tb->close();
    }
    if (pg) fmt::print("rank {} parameter checksum {:016x}\n", rank, examples::parameterChecksum(*net));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_digits: {}\n", e.what());
    return 1;
  }
}
