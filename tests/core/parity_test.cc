// Step-for-step parity with PyTorch: the same model, the same initial weights (written
// by cohort as safetensors), the same batches, 20 AdamW steps with gradient clipping and the
// warmup+cosine schedule; per-step losses must agree to 1e-5 relative and the final parameters
// closely. Under bfloat16 autocast (amp::Autocast against torch.autocast("cpu")), a GPT trains
// 50 steps and the losses must agree within 1% per step and 0.5% at the end (the libraries round
// differently in bfloat16, so the runs drift apart slowly), once with each attention kernel against
// PyTorch computing attention alike (see bf16Parity below); COHORT_PARITY_FULL=1 runs that on the
// reference GPT of bench/train_step (6 layers, width 384, 256 tokens, batch 8, its learning rate
// 3e-4: minutes) instead of a small one, learning the next character of the shipped King James
// text (the small one learns a fixed map of each token, whose loss falls towards 0 within the 50
// steps). The PyTorch side is tests/parity/torch_reference.py, run with Debian's python3-torch
// through /usr/bin/python3 (installed by scripts/setup.sh).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/data/text.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/optim/optim.h>

using namespace cohort;
namespace fs = std::filesystem;

namespace {

struct Setup {
  nlohmann::json config;
  std::shared_ptr<nn::Module> model;
  std::vector<Tensor> xs, ys;
  int64_t classes = 0;
  // > 1: also train the PyTorch side on 2..torchThreads threads and print how far PyTorch's runs
  // are from each other next to how far cohort's is from each of them (bfloat16 runs: the
  // libraries' differences beside PyTorch's own, from its GEMMs' blocking alone).
  int torchThreads = 1;
};

fs::path scriptPath() { return fs::path(COHORT_SOURCE_DIR) / "tests" / "parity" / "torch_reference.py"; }

fs::path freshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("cohort_parity_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

nlohmann::json commonConfig() {
  return {{"steps", 20}, {"lr", 3e-3},  {"betas", {0.9, 0.95}}, {"eps", 1e-8},   {"weight_decay", 0.1},
          {"clip", 0.5}, {"warmup", 5}, {"total", 20},          {"min_lr", 3e-4}};
}

Setup mlpSetup() {
  Setup s;
  s.config = commonConfig();
  s.config["model"] = "mlp";
  s.config["sizes"] = {64, 96, 48, 10};
  manualSeed(11);
  s.model = std::make_shared<nn::Sequential>(nn::Linear(64, 96), nn::ReLU(), nn::Linear(96, 48), nn::ReLU(),
                                             nn::Linear(48, 10));
  Generator g(5);
  for (int i = 0; i < 20; ++i) {
    s.xs.push_back(randn({16, 64}, {}, &g));
    s.ys.push_back(randint(0, 10, {16}, {.dtype = DType::Int64}, &g));
  }
  s.classes = 10;
  return s;
}

nn::GPTConfig smallGpt() {
  nn::GPTConfig c;
  c.vocabSize = 29;
  c.blockSize = 16;
  c.nLayer = 2;
  c.nHead = 2;
  c.nEmbd = 32;
  return c;
}

// What the GPT learns: a fixed map of each token (fast to learn: the loss falls towards 0), or
// the next character of the shipped King James text (the task the GPT examples train on).
enum class Task { TokenMap, Text };

Setup gptSetup(nn::GPTConfig c = smallGpt(), int steps = 20, int64_t batch = 4, Task task = Task::TokenMap) {
  Setup s;
  s.config = commonConfig();
  s.config["steps"] = steps;
  s.config["total"] = steps;
  c.dropout = 0.0;
  c.bias = true;
  c.tieWeights = true;
  s.config["model"] = "gpt";
  s.config.update({{"vocab", c.vocabSize},
                   {"block", c.blockSize},
                   {"layers", c.nLayer},
                   {"heads", c.nHead},
                   {"embd", c.nEmbd},
                   {"bias", c.bias},
                   {"tie", c.tieWeights}});
  std::vector<int64_t> text;
  if (task == Task::Text) {
    data::CharVocab vocab(data::kjvText("all"));
    text = vocab.encode(data::kjvText("train"));
    c.vocabSize = vocab.size();
    s.config["vocab"] = c.vocabSize;
  }
  manualSeed(12);
  s.model = std::make_shared<nn::GPT>(c);
  Generator g(6);
  for (int i = 0; task == Task::Text && i < steps; ++i) {
    // `batch` windows of the text at random places; y is x shifted by one character.
    Tensor starts =
        randint(0, static_cast<int64_t>(text.size()) - c.blockSize - 1, {batch}, {.dtype = DType::Int64}, &g);
    std::vector<int64_t> xs, ys;
    for (int64_t b : starts.toVector<int64_t>()) {
      xs.insert(xs.end(), text.begin() + b, text.begin() + b + c.blockSize);
      ys.insert(ys.end(), text.begin() + b + 1, text.begin() + b + 1 + c.blockSize);
    }
    s.xs.push_back(fromVector<int64_t>(xs, {batch, c.blockSize}));
    s.ys.push_back(fromVector<int64_t>(ys, {batch, c.blockSize}));
  }
  for (int i = 0; task == Task::TokenMap && i < steps; ++i) {
    // Targets are a fixed function of the tokens, so the loss can fall (random targets cannot be
    // learned, and a test whose loss stays flat would not show that training works).
    Tensor x = randint(0, c.vocabSize, {batch, c.blockSize}, {.dtype = DType::Int64}, &g);
    s.xs.push_back(x);
    s.ys.push_back(fromVector<int64_t>(
        [&] {
          auto v = x.toVector<int64_t>();
          for (auto& t : v) t = (t * 7 + 3) % c.vocabSize;
          return v;
        }(),
        x.sizes()));
  }
  s.classes = c.vocabSize;
  return s;
}

struct Tolerance {
  double lossRel = 1e-5;       // every step's loss
  double finalLossRel = 1e-5;  // the last step's loss
  double normRel = 1e-4;       // gradient norms (< 0: not compared)
  double paramRel = 1e-5;      // final parameters (< 0: not compared)
};

// The worst per-step and the final relative difference of losses `a` against `b`.
std::pair<double, double> lossDifference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return {worst, std::abs(a.back() - b.back()) / std::abs(b.back())};
}

void printSpread(const fs::path& dir, const std::string& name, const std::vector<double>& mine,
                 const std::vector<double>& torch1, int threads) {
  std::vector<std::vector<double>> runs{torch1};
  for (int t = 2; t <= threads; ++t) {
    std::string cmd = fmt::format("/usr/bin/python3 {} {} {} 2>&1", scriptPath().string(), dir.string(), t);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd;
    nlohmann::json out;
    std::ifstream(dir / fmt::format("torch_out_threads{}.json", t)) >> out;
    runs.push_back(out["losses"].get<std::vector<double>>());
  }
  auto pct = [](double x) { return fmt::format("{:.2f}%", 100 * x); };
  std::vector<std::string> torchWorst, torchFinal, mineWorst, mineFinal;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (size_t j = i + 1; j < runs.size(); ++j) {
      auto [w, f] = lossDifference(runs[i], runs[j]);
      torchWorst.push_back(pct(w));
      torchFinal.push_back(pct(f));
    }
    auto [w, f] = lossDifference(mine, runs[i]);
    mineWorst.push_back(pct(w));
    mineFinal.push_back(pct(f));
  }
  std::printf("%s: PyTorch on 1..%d threads against itself, every pair: worst per-step %s; final %s\n"
              "%s: cohort against PyTorch on 1..%d threads: worst per-step %s; final %s\n",
              name.c_str(), threads, fmt::format("{}", fmt::join(torchWorst, " ")).c_str(),
              fmt::format("{}", fmt::join(torchFinal, " ")).c_str(), name.c_str(), threads,
              fmt::format("{}", fmt::join(mineWorst, " ")).c_str(),
              fmt::format("{}", fmt::join(mineFinal, " ")).c_str());
}

void runParity(Setup s, const std::string& name, Tolerance tol = {}) {
  const bool bf16 = s.config.value("amp", std::string()) == "bf16";
  fs::path dir = freshDir(name);
  { std::ofstream(dir / "config.json") << s.config.dump(); }
  io::saveSafetensors((dir / "init.safetensors").string(), s.model->stateDict());
  io::TensorDict batches;
  for (size_t i = 0; i < s.xs.size(); ++i) {
    batches.insert(fmt::format("x{}", i), s.xs[i]);
    batches.insert(fmt::format("y{}", i), s.ys[i]);
  }
  io::saveSafetensors((dir / "batches.safetensors").string(), batches);

  std::string cmd = fmt::format("/usr/bin/python3 {} {} 2>&1", scriptPath().string(), dir.string());
  int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "the PyTorch reference failed: " << cmd;

  auto& cfg = s.config;
  optim::AdamW opt(s.model->parameters(), {.lr = cfg["lr"].get<double>(),
                                           .beta1 = cfg["betas"][0].get<double>(),
                                           .beta2 = cfg["betas"][1].get<double>(),
                                           .eps = cfg["eps"].get<double>(),
                                           .weightDecay = cfg["weight_decay"].get<double>()});
  optim::CosineWithWarmup sched(opt, {.warmupSteps = cfg["warmup"].get<int64_t>(),
                                      .totalSteps = cfg["total"].get<int64_t>(),
                                      .minLr = cfg["min_lr"].get<double>()});
  std::vector<double> losses, norms;
  for (size_t step = 0; step < s.xs.size(); ++step) {
    Tensor loss;
    {
      amp::Autocast autocast(DeviceType::CPU, DType::BFloat16, {.enabled = bf16});
      Tensor logits = (*s.model)(s.xs[step]);
      loss = nn::functional::crossEntropy(logits.reshape({-1, s.classes}), s.ys[step].reshape({-1}));
    }
    opt.zeroGrad();
    loss.backward();
    norms.push_back(optim::clipGradNorm(s.model->parameters(), cfg["clip"].get<double>()));
    opt.step();
    sched.step();
    losses.push_back(loss.item<double>());
  }

  nlohmann::json ref;
  std::ifstream(dir / "torch_out.json") >> ref;
  auto refLosses = ref["losses"].get<std::vector<double>>();
  auto refNorms = ref["grad_norms"].get<std::vector<double>>();
  ASSERT_EQ(refLosses.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    double rel = std::abs(losses[i] - refLosses[i]) / std::abs(refLosses[i]);
    EXPECT_LE(rel, tol.lossRel) << name << " step " << i << ": cohort " << losses[i] << " vs torch " << refLosses[i];
    if (tol.normRel >= 0) {
      EXPECT_LE(std::abs(norms[i] - refNorms[i]), tol.normRel * std::abs(refNorms[i]) + 1e-6)
          << name << " step " << i << " grad norm: cohort " << norms[i] << " vs torch " << refNorms[i];
    }
  }
  const auto [worst, finalRel] = lossDifference(losses, refLosses);
  EXPECT_LE(finalRel, tol.finalLossRel) << name << " final loss: cohort " << losses.back() << " vs torch "
                                        << refLosses.back();
  // The figures for the record (the AMP tests' closing numbers).
  std::printf("%s: %zu steps, loss %.5f -> %.5f (torch %.5f -> %.5f); worst per-step relative difference %.3g, "
              "final %.3g\n",
              name.c_str(), losses.size(), losses.front(), losses.back(), refLosses.front(), refLosses.back(), worst,
              finalRel);
  // The losses must actually move: a frozen model would "agree" trivially.
  EXPECT_LT(losses.back(), losses.front());
  if (s.torchThreads > 1) printSpread(dir, name, losses, refLosses, s.torchThreads);
  // cohort's side next to torch_out.json; a failed run keeps the directory to look into.
  { std::ofstream(dir / "cohort_out.json") << nlohmann::json{{"losses", losses}, {"grad_norms", norms}}.dump(); }
  auto cleanUp = [&] {
    if (::testing::Test::HasFailure())
      std::printf("%s: inputs and both sides' losses kept in %s\n", name.c_str(), dir.c_str());
    else fs::remove_all(dir);
  };

  if (tol.paramRel < 0) {
    cleanUp();
    return;
  }
  auto final = io::loadSafetensors((dir / "torch_final.safetensors").string()).tensors;
  auto mine = s.model->stateDict();
  for (auto& [k, v] : mine) {
    ASSERT_TRUE(final.contains(k)) << "torch has no " << k;
    Tensor ref = final.at(k).to(DType::Float64);
    double diff = (v.to(DType::Float64) - ref).abs().max().item<double>();
    double scale = ref.abs().max().item<double>();
    EXPECT_LE(diff, tol.paramRel * std::max(1.0, scale)) << name << " final " << k << " differs by " << diff;
  }
  cleanUp();
}

}  // namespace

TEST(PyTorchParity, MlpAdamWClipWarmupCosine) { runParity(mlpSetup(), "mlp"); }
TEST(PyTorchParity, GptAdamWClipWarmupCosine) { runParity(gptSetup(), "gpt"); }

// Under bfloat16 autocast the two libraries are compared with attention computed alike: cohort's
// fused attention (scores and weights in float32) against PyTorch computing its attention in
// float32, and cohort's op-by-op formula (GPTConfig::fusedAttention = false, scores and weights
// rounded to bfloat16) against PyTorch 1.13's own ops under autocast.
namespace {
void bf16Parity(bool fusedAttention) {
  const char* full = std::getenv("COHORT_PARITY_FULL");
  nn::GPTConfig c = smallGpt();
  int64_t batch = 4;
  Task task = Task::TokenMap;
  const bool reference = full && std::string(full) == "1";
  if (reference) {
    task = Task::Text;
    c.vocabSize = 65;
    c.blockSize = 256;
    c.nLayer = 6;
    c.nHead = 6;
    c.nEmbd = 384;
    batch = 8;
  } else {  // still big enough that every matrix product runs in bfloat16 with real rounding
    c.vocabSize = 65;
    c.blockSize = 32;
    c.nEmbd = 64;
    c.nHead = 4;
  }
  c.fusedAttention = fusedAttention;
  auto s = gptSetup(c, 50, batch, task);
  // The full run prints, beside its figures, how far PyTorch's own runs drift apart when only its
  // thread count changes (its GEMMs' summation order).
  if (reference) s.torchThreads = 4;
  s.config["amp"] = "bf16";
  s.config["attention"] = fusedAttention ? "fused" : "math";
  if (reference) {
    // The reference GPT's learning rate (bench/train_step's AdamW, 3e-4), decaying to a tenth. At
    // the small model's 3e-3 this model trains unstably (its loss rises at steps 19-20 and ends at
    // 2.58, against 2.26 at 3e-4), which turns any difference in rounding into a different run:
    // there PyTorch's own runs on 1 and 4 threads differ by 1.27% at one step.
    s.config["lr"] = 3e-4;
    s.config["min_lr"] = 3e-5;
  }
  runParity(s, fusedAttention ? "gpt_bf16" : "gpt_bf16_math_attention",
            {.lossRel = 0.01, .finalLossRel = 0.005, .normRel = -1, .paramRel = -1});
}
}  // namespace

TEST(PyTorchParity, GptBFloat16Autocast50Steps) { bf16Parity(true); }
TEST(PyTorchParity, GptBFloat16Autocast50StepsMathAttention) { bf16Parity(false); }
