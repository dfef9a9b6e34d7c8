// Step-for-step parity with PyTorch: the same model, the same initial weights (written
// by cohort as safetensors), the same batches, 20 AdamW steps with gradient clipping and the
// warmup+cosine schedule; per-step losses must agree to 1e-5 relative and the final parameters
// closely. The PyTorch side is tests/parity/torch_reference.py, run with Debian's python3-torch
// through /usr/bin/python3 (installed by scripts/setup.sh).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <cohort/cohort.h>
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

Setup gptSetup() {
  Setup s;
  s.config = commonConfig();
  nn::GPTConfig c;
  c.vocabSize = 29;
  c.blockSize = 16;
  c.nLayer = 2;
  c.nHead = 2;
  c.nEmbd = 32;
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
  manualSeed(12);
  s.model = std::make_shared<nn::GPT>(c);
  Generator g(6);
  for (int i = 0; i < 20; ++i) {
    // Targets are a fixed function of the tokens, so the loss can fall (random targets cannot be
    // learned, and a test whose loss stays flat would not show that training works).
    Tensor x = randint(0, c.vocabSize, {4, c.blockSize}, {.dtype = DType::Int64}, &g);
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

void runParity(Setup s, const std::string& name) {
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
    Tensor logits = (*s.model)(s.xs[step]);
    Tensor loss = nn::functional::crossEntropy(logits.reshape({-1, s.classes}), s.ys[step].reshape({-1}));
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
    EXPECT_LE(std::abs(losses[i] - refLosses[i]), 1e-5 * std::abs(refLosses[i]))
        << name << " step " << i << ": cohort " << losses[i] << " vs torch " << refLosses[i];
    EXPECT_LE(std::abs(norms[i] - refNorms[i]), 1e-4 * std::abs(refNorms[i]) + 1e-6)
        << name << " step " << i << " grad norm: cohort " << norms[i] << " vs torch " << refNorms[i];
  }
  // The losses must actually move: a frozen model would "agree" trivially.
  EXPECT_LT(losses.back(), losses.front());

  auto final = io::loadSafetensors((dir / "torch_final.safetensors").string()).tensors;
  auto mine = s.model->stateDict();
  for (auto& [k, v] : mine) {
    ASSERT_TRUE(final.contains(k)) << "torch has no " << k;
    Tensor ref = final.at(k).to(DType::Float64);
    double diff = (v.to(DType::Float64) - ref).abs().max().item<double>();
    double scale = ref.abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * std::max(1.0, scale)) << name << " final " << k << " differs by " << diff;
  }
  fs::remove_all(dir);
}

}  // namespace

TEST(PyTorchParity, MlpAdamWClipWarmupCosine) { runParity(mlpSetup(), "mlp"); }
TEST(PyTorchParity, GptAdamWClipWarmupCosine) { runParity(gptSetup(), "gpt"); }
