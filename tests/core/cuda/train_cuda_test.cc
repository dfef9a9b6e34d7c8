// Whole models on a GPU: an MLP, a CNN and a small GPT train for 50 steps on CUDA and on the CPU from the
// same initialisation and data; the losses and the final parameters must agree within tolerance
// (the GPU sums in another order, so the runs drift apart by rounding, not by more); the GPT's
// gradients are clipped on the device, and it samples the CPU's tokens. Also Module::to(Device)
// keeps parameter handles. Skips without a GPU.
#include <gtest/gtest.h>

#include <map>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

using testing::expectClose;

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;  // on the CPU
};

// clip > 0: the gradients are clipped to that 2-norm before every step, as training scripts do.
template <typename MakeModel, typename Batch>
TrainingRun train(MakeModel&& make, Batch&& batch, Device device, int steps, double clip = 0) {
  std::shared_ptr<nn::Module> model = make();
  model->to(device);
  optim::AdamW opt(model->parameters(), {.lr = 3e-3, .weightDecay = 0.1});
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    Tensor logits = (*model)(x.to(device));
    Tensor loss = nn::functional::crossEntropy(logits.reshape({-1, logits.size(-1)}), y.to(device).reshape({-1}));
    opt.zeroGrad();
    loss.backward();
    if (clip > 0) optim::clipGradNorm(model->parameters(), clip);
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  for (auto& [name, p] : model->namedParameters()) run.params[name] = p.detach().to(Device::cpu());
  return run;
}

void expectSameTraining(const TrainingRun& gpu, const TrainingRun& cpu, double lossTol, double paramTol) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], lossTol * std::max(1.0, std::abs(cpu.losses[i]))) << "step " << i;
  EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << "the model learns";
  for (auto& [name, p] : cpu.params) expectClose(gpu.params.at(name), p, paramTol, paramTol, name);
  std::printf("loss: step 0 %.6f (cpu) %.6f (gpu), step %zu %.6f (cpu) %.6f (gpu)\n", cpu.losses.front(),
              gpu.losses.front(), cpu.losses.size() - 1, cpu.losses.back(), gpu.losses.back());
}

TEST(CudaTraining, MlpMatchesCpuFor50Steps) {
  COHORT_REQUIRE_GPU();
  auto make = [] {
    Generator g(7);
    return std::make_shared<nn::Sequential>(nn::Linear(32, 64, true, &g), nn::ReLU(), nn::Linear(64, 64, true, &g),
                                            nn::GELU(), nn::Linear(64, 10, true, &g));
  };
  auto batch = [](int step) {
    Generator g(100 + static_cast<uint64_t>(step % 4));  // four batches, cycled: the loss must fall
    Tensor x = randn({48, 32}, {}, &g);
    Tensor y = randint(0, 10, {48}, {.dtype = DType::Int64}, &g);
    return std::pair{x, y};
  };
  TrainingRun cpu = train(make, batch, Device::cpu(), 50);
  TrainingRun gpu = train(make, batch, Device::cuda(), 50);
  expectSameTraining(gpu, cpu, 1e-4, 1e-3);
}

TEST(CudaTraining, CnnMatchesCpuFor50Steps) {
  COHORT_REQUIRE_GPU();
  auto make = [] {
    Generator g(5);
    return std::make_shared<nn::Sequential>(nn::Conv2d(1, 8, 3, {.padding = {1, 1}}, true, &g), nn::ReLU(),
                                            nn::MaxPool2d(2),
                                            nn::Conv2d(8, 16, 3, {.stride = {2, 2}, .padding = {1, 1}}, true, &g),
                                            nn::ReLU(), nn::AvgPool2d(2), nn::Flatten(),
                                            nn::Linear(16 * 2 * 2, 10, true, &g));
  };
  auto batch = [](int step) {
    Generator g(700 + static_cast<uint64_t>(step % 4));  // four batches, cycled: the loss must fall
    Tensor x = randn({16, 1, 16, 16}, {}, &g);
    Tensor y = randint(0, 10, {16}, {.dtype = DType::Int64}, &g);
    return std::pair{x, y};
  };
  TrainingRun cpu = train(make, batch, Device::cpu(), 50);
  TrainingRun gpu = train(make, batch, Device::cuda(), 50);
  expectSameTraining(gpu, cpu, 1e-4, 1e-3);
}

TEST(CudaTraining, GptMatchesCpuFor50Steps) {
  COHORT_REQUIRE_GPU();
  nn::GPTConfig cfg{.vocabSize = 61,
                    .blockSize = 16,
                    .nLayer = 2,
                    .nHead = 2,
                    .nEmbd = 32,
                    .dropout = 0.0,
                    .bias = true,
                    .tieWeights = true};
  auto make = [cfg] {
    Generator g(11);
    return std::make_shared<nn::GPT>(cfg, &g);
  };
  auto batch = [](int step) {
    Generator g(500 + static_cast<uint64_t>(step % 4));  // four batches, cycled: the loss must fall
    Tensor seq = randint(0, 61, {4, 17}, {.dtype = DType::Int64}, &g);
    return std::pair{seq.slice(1, 0, 16).contiguous(), seq.slice(1, 1, 17).contiguous()};
  };
  // Clipped to a 2-norm of 0.5, under the first steps' gradient norms: the clip acts on the device.
  TrainingRun cpu = train(make, batch, Device::cpu(), 50, 0.5);
  TrainingRun gpu = train(make, batch, Device::cuda(), 50, 0.5);
  expectSameTraining(gpu, cpu, 2e-4, 2e-3);
}

// Sampling from a GPT on the GPU (the last logits come to the host, where the sampling runs, and
// the tokens go back): greedy decoding and top-k sampling with one seed give the CPU's tokens from
// the same weights, on the model's device.
TEST(CudaTraining, GptGeneratesTheCpuTokens) {
  COHORT_REQUIRE_GPU();
  nn::GPTConfig cfg{.vocabSize = 61, .blockSize = 16, .nLayer = 2, .nHead = 2, .nEmbd = 32, .dropout = 0.0};
  Generator ga(11), gb(11);
  nn::GPT cpu(cfg, &ga), gpu(cfg, &gb);
  gpu.to(Device::cuda());
  Generator gp(3);
  const Tensor prompt = randint(0, 61, {2, 5}, {.dtype = DType::Int64}, &gp);
  for (double temperature : {0.0, 0.8}) {
    Generator sa(5), sb(5);
    const Tensor want = cpu.generate(prompt, 20, temperature, 10, &sa);  // past the block: the context slides
    const Tensor got = gpu.generate(prompt.to(Device::cuda()), 20, temperature, 10, &sb);
    EXPECT_TRUE(got.device().isCuda());
    testing::expectBitEqual(got, want, fmt::format("tokens at temperature {}", temperature));
  }
}

TEST(CudaTraining, ModuleToDeviceKeepsParameterHandles) {
  COHORT_REQUIRE_GPU();
  Generator g(3);
  nn::Linear lin(4, 3, true, &g);
  Tensor w = lin.parameters()[0];
  Tensor before = w.detach().clone();
  lin.to(Device::cuda());
  EXPECT_EQ(w.device(), Device::cuda(0)) << "the handle sees the moved parameter";
  testing::expectBitEqual(w.detach(), before, "moved weight");
  lin.to(Device::cpu());
  EXPECT_TRUE(w.device().isCpu());
}

}  // namespace
}  // namespace cohort
