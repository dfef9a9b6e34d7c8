// A GPT training step on one GPU: forward and loss under amp::Autocast(CUDA, bf16) (float32 weights),
// backward, AdamW. bench/torch_cuda_train_step.py runs the same model, shapes and optimizer in
// PyTorch on the same machine. Prints one JSON line:
//   {"impl": "cohort", "amp": "bf16", "ms_per_step": ..., "tokens_per_s": ..., "model_tflops": ...,
//    "fraction_of_peak": ..., "peak_gb": ...}
// Time: wall clock over --steps steps after --warmup, the device synchronised at both ends (no
// host-device synchronisation inside the timed steps; the loss is read once at the end). FLOPs per
// token as nanoGPT and PaLM count them: 6 N (N = parameters without the position embedding) plus
// 12 L T d for attention scores and values; model_tflops is that over the step time, so recomputation or
// padding is not counted as useful work.
//
//   build/bench/cuda_train_step [--layers 12] [--heads 12] [--embd 768] [--block 1024] [--vocab 50304]
//                               [--batch 8] [--steps 20] [--warmup 3] [--amp bf16|none] [--peak-tflops 989]
//                               [--phases]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>

using namespace cohort;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT training step on a GPU (cohort side; bench/torch_cuda_train_step.py is PyTorch's)"};
  nn::GPTConfig cfg{.vocabSize = 50304,
                    .blockSize = 1024,
                    .nLayer = 12,
                    .nHead = 12,
                    .nEmbd = 768,
                    .dropout = 0.0,
                    .bias = true,
                    .tieWeights = true};
  int64_t batch = 8;
  int steps = 20, warmup = 3;
  std::string ampName = "bf16";
  double peak = 989;
  app.add_option("--layers", cfg.nLayer)->check(CLI::PositiveNumber);
  app.add_option("--heads", cfg.nHead)->check(CLI::PositiveNumber);
  app.add_option("--embd", cfg.nEmbd)->check(CLI::PositiveNumber);
  app.add_option("--block", cfg.blockSize, "sequence length (the batch fills the whole block)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", cfg.vocabSize)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--amp", ampName, "bf16 (autocast) or none (float32)")->check(CLI::IsMember({"bf16", "none"}));
  app.add_option("--peak-tflops", peak, "the GPU's dense bf16 peak (H100/H200 SXM: 989)");
  bool phases = false;
  app.add_flag("--phases", phases,
               "also time forward, backward and optimizer apart, and the attention alone (extra JSON lines)");
  CLI11_PARSE(app, argc, argv);
  if (!cuda::isAvailable()) {
    std::printf("{\"bench\": \"cuda_train_step\", \"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  const Device dev = Device::cuda();
  manualSeed(0);
  nn::GPT model(cfg);
  model.to(dev);
  optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weightDecay = 0.1});
  int64_t n = 0;
  for (const auto& [name, p] : model.namedParameters())
    if (name != "transformer.wpe.weight") n += p.numel();
  Tensor x = randint(0, cfg.vocabSize, {batch, cfg.blockSize}, {.dtype = DType::Int64}).to(dev);
  Tensor y = randint(0, cfg.vocabSize, {batch, cfg.blockSize}, {.dtype = DType::Int64}).to(dev);
  const bool amp = ampName == "bf16";
  Tensor loss;
  auto forward = [&] {
    amp::Autocast autocast(DeviceType::CUDA, DType::BFloat16, {.enabled = amp});
    Tensor logits = model(x);
    loss = nn::functional::crossEntropy(logits.reshape({-1, cfg.vocabSize}), y.reshape({-1}));
  };
  auto backward = [&] {
    opt.zeroGrad();
    loss.backward();
  };
  auto step = [&] {
    forward();
    backward();
    opt.step();
  };
  for (int i = 0; i < warmup; ++i) step();
  cuda::synchronize();
  if (phases) {
    // The same steps with the device synchronised between forward+loss, backward and the
    // optimizer: where the time goes (the synchronisation costs a little overlap).
    std::vector<double> f, bw, o;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      forward();
      cuda::synchronize();
      auto t1 = std::chrono::steady_clock::now();
      backward();
      cuda::synchronize();
      auto t2 = std::chrono::steady_clock::now();
      opt.step();
      cuda::synchronize();
      auto t3 = std::chrono::steady_clock::now();
      f.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      bw.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      o.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    }
    std::printf(
        "{\"bench\": \"cuda_train_step_phases\", \"impl\": \"cohort\", \"forward_ms\": %.2f, \"backward_ms\": %.2f, "
        "\"optimizer_ms\": %.2f}\n",
        median(f), median(bw), median(o));
    // The attention alone, forward and backward, on the model's shapes (bf16, causal).
    const int64_t e = cfg.nEmbd / cfg.nHead;
    Tensor q = randn({batch, cfg.nHead, cfg.blockSize, e}).to(DType::BFloat16).to(dev).setRequiresGrad(true);
    Tensor k = randn({batch, cfg.nHead, cfg.blockSize, e}).to(DType::BFloat16).to(dev).setRequiresGrad(true);
    Tensor v = randn({batch, cfg.nHead, cfg.blockSize, e}).to(DType::BFloat16).to(dev).setRequiresGrad(true);
    Tensor go = randn({batch, cfg.nHead, cfg.blockSize, e}).to(DType::BFloat16).to(dev);
    auto attn = [&](bool back) {
      Tensor out = nn::functional::scaledDotProductAttention(q, k, v, {.causal = true});
      if (back) out.backward(go);
    };
    std::vector<double> af, ab;
    for (int i = 0; i < 3; ++i) attn(true);
    for (int i = 0; i < 10; ++i) {
      cuda::synchronize();
      auto t0 = std::chrono::steady_clock::now();
      attn(false);
      cuda::synchronize();
      auto t1 = std::chrono::steady_clock::now();
      attn(true);
      cuda::synchronize();
      auto t2 = std::chrono::steady_clock::now();
      af.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      ab.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::printf("{\"bench\": \"cuda_attention\", \"impl\": \"cohort\", \"shape\": [%lld, %lld, %lld, %lld], "
                "\"forward_ms\": %.3f, \"forward_backward_ms\": %.3f}\n",
                static_cast<long long>(batch), static_cast<long long>(cfg.nHead), static_cast<long long>(cfg.blockSize),
                static_cast<long long>(e), median(af), median(ab));
  }
  resetPeakMemory(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  cuda::synchronize();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double lossValue = loss.item<double>();
  const double tokens = static_cast<double>(batch * cfg.blockSize);
  const double flopPerToken =
      6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(cfg.nLayer * cfg.blockSize * cfg.nEmbd);
  const double tflops = flopPerToken * tokens / sec / 1e12;
  std::printf(
      "{\"bench\": \"cuda_train_step\", \"impl\": \"cohort\", \"amp\": \"%s\", \"layers\": %lld, \"embd\": %lld, "
      "\"block\": %lld, \"batch\": %lld, \"params_m\": %.1f, \"ms_per_step\": %.2f, \"tokens_per_s\": %.0f, "
      "\"model_tflops\": %.1f, \"fraction_of_peak\": %.3f, \"peak_gb\": %.2f, \"last_loss\": %.4f}\n",
      ampName.c_str(), static_cast<long long>(cfg.nLayer), static_cast<long long>(cfg.nEmbd),
      static_cast<long long>(cfg.blockSize), static_cast<long long>(batch), static_cast<double>(n) / 1e6, sec * 1e3,
      tokens / sec, tflops, tflops / peak, static_cast<double>(memoryStats(dev).peakBytes) / (1 << 30), lossValue);
  return 0;
}
