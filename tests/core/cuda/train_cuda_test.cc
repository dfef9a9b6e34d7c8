// Whole models on a GPU: an MLP and a small GPT train for 50 steps on CUDA and on the CPU from the
// same initialisation and data; the losses and the final parameters must agree within tolerance
// (the GPU sums in another order, so the runs drift apart by rounding, not by more). Also
// Module::to(Device) keeps parameter handles. Skips without a GPU.
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

template <typename MakeModel, typename Batch>
TrainingRun train(MakeModel&& make, Batch&& batch, Device device, int steps) {
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
  TrainingRun cpu = train(make, batch, Device::cpu(), 50);
  TrainingRun gpu = train(make, batch, Device::cuda(), 50);
  expectSameTraining(gpu, cpu, 2e-4, 2e-3);
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
