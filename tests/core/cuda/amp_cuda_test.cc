// Mixed precision on a GPU: amp::Autocast(CUDA) casts by the CUDA column of the policy and leaves
// CPU tensors alone; a GPT trained under bf16 autocast on the GPU follows its float32 run and the
// CPU's bf16 run within bf16 rounding; float16 with a GradScaler on CUDA follows float32 and skips
// a step whose gradients overflow. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

TEST(CudaAutocast, CastsByTheCudaPolicyAndLeavesCpuTensorsAlone) {
  COHORT_REQUIRE_GPU();
  const Device dev = Device::cuda();
  Tensor a = testing::values({8, 16}, DType::Float32, 1).to(dev);
  Tensor b = testing::values({16, 4}, DType::Float32, 2).to(dev);
  Tensor ca = testing::values({8, 16}, DType::Float32, 1), cb = testing::values({16, 4}, DType::Float32, 2);
  {
    amp::Autocast autocast(DeviceType::CUDA, DType::BFloat16);
    Tensor m = matmul(a, b);
    EXPECT_EQ(m.dtype(), DType::BFloat16) << "matmul runs in the autocast dtype";
    EXPECT_EQ(m.device(), dev);
    testing::expectClose(m.to(DType::Float32), matmul(ca, cb), 0.1, 2e-2, "bf16 matmul on the GPU");
    EXPECT_EQ(nn::functional::softmax(m, -1).dtype(), DType::Float32) << "CUDA's policy runs softmax in float32";
    EXPECT_EQ(matmul(ca, cb).dtype(), DType::Float32) << "CUDA autocast leaves CPU tensors alone";
  }
  EXPECT_EQ(matmul(a, b).dtype(), DType::Float32) << "outside the scope: float32 again";
}

struct Losses {
  std::vector<double> losses;
};

// A small GPT, 30 steps of AdamW from one initialisation, the forward and loss under autocast of
// `amp` (nullopt: float32) on `device`.
Losses trainGpt(Device device, std::optional<DType> amp, int steps = 30) {
  nn::GPTConfig cfg{.vocabSize = 61,
                    .blockSize = 32,
                    .nLayer = 2,
                    .nHead = 2,
                    .nEmbd = 64,
                    .dropout = 0.0,
                    .bias = true,
                    .tieWeights = true};
  Generator g(11);
  auto model = std::make_shared<nn::GPT>(cfg, &g);
  model->to(device);
  optim::AdamW opt(model->parameters(), {.lr = 3e-3, .weightDecay = 0.1});
  Losses run;
  for (int s = 0; s < steps; ++s) {
    Generator bg(500 + static_cast<uint64_t>(s % 4));  // four batches, cycled: the loss must fall
    Tensor seq = randint(0, 61, {4, 33}, {.dtype = DType::Int64}, &bg);
    Tensor x = seq.slice(1, 0, 32).contiguous().to(device), y = seq.slice(1, 1, 33).contiguous().to(device);
    Tensor loss;
    {
      amp::Autocast autocast(device.type(), amp.value_or(DType::BFloat16), {.enabled = amp.has_value()});
      Tensor logits = (*model)(x);
      loss = nn::functional::crossEntropy(logits.reshape({-1, 61}), y.reshape({-1}));
    }
    EXPECT_EQ(loss.dtype(), DType::Float32) << "the loss is float32 under autocast";
    opt.zeroGrad();
    loss.backward();
    for (const Tensor& p : model->parameters()) {
      EXPECT_EQ(p.grad().dtype(), DType::Float32) << "gradients come back in the weights' dtype";
      break;
    }
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

TEST(CudaAutocast, Bf16GptFollowsFloat32AndTheCpusBf16Run) {
  COHORT_REQUIRE_GPU();
  Losses bf16 = trainGpt(Device::cuda(), DType::BFloat16);
  Losses f32 = trainGpt(Device::cuda(), std::nullopt);
  Losses cpu = trainGpt(Device::cpu(), DType::BFloat16);
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  // bf16 keeps 8 bits of mantissa: the step-0 losses (same weights) agree to a few parts in a
  // thousand; the runs then drift by rounding, and must stay within a few percent.
  EXPECT_NEAR(bf16.losses[0], f32.losses[0], 1e-2 * f32.losses[0]);
  EXPECT_NEAR(bf16.losses[0], cpu.losses[0], 1e-2 * cpu.losses[0]);
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 5e-2 * f32.losses[i]) << "step " << i << " against float32";
    EXPECT_NEAR(bf16.losses[i], cpu.losses[i], 5e-2 * cpu.losses[i]) << "step " << i << " against the CPU";
  }
  EXPECT_LT(bf16.losses.back(), 0.8 * bf16.losses.front()) << "bf16 training on the GPU learns";
  std::printf("loss at step 0 / %zu: gpu bf16 %.5f / %.5f, gpu f32 %.5f / %.5f, cpu bf16 %.5f / %.5f\n",
              bf16.losses.size() - 1, bf16.losses.front(), bf16.losses.back(), f32.losses.front(), f32.losses.back(),
              cpu.losses.front(), cpu.losses.back());
}

// 40 AdamW steps of an MLP on the GPU, the forward under float16 autocast with a GradScaler
// (fp16) or in float32 without one; at step 20 one gradient is overwritten with inf. Returns the
// losses of the steps taken.
std::vector<double> trainMlpWithOverflowAtStep20(bool fp16) {
  const Device dev = Device::cuda();
  Generator g(7);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(32, 64, true, &g), nn::GELU(), nn::Linear(64, 10, true, &g));
  model->to(dev);
  optim::AdamW opt(model->parameters(), {.lr = 3e-3});
  amp::GradScaler scaler({.initScale = 1024.0, .growthInterval = 1000, .enabled = fp16});
  std::vector<double> losses;
  for (int s = 0; s < 40; ++s) {
    auto [x, y] = testing::learnableBatch(
        {.n = 48, .features = 32, .classes = 10, .weightSeed = 99, .batchSeed = 100, .distinct = 4}, s, dev);
    Tensor loss;
    {
      amp::Autocast autocast(DeviceType::CUDA, DType::Float16, {.enabled = fp16});
      Tensor h = (*model)(x);
      EXPECT_EQ(h.dtype(), fp16 ? DType::Float16 : DType::Float32);
      loss = nn::functional::crossEntropy(h, y);
    }
    opt.zeroGrad();
    scaler.scale(loss).backward();
    if (s == 20) {
      Tensor w = model->parameters()[0];
      Tensor gw = w.grad();
      {
        autograd::NoGradGuard noGrad;
        gw.fill_(std::numeric_limits<double>::infinity());
      }
      if (!fp16) continue;  // the float32 reference simply does not step
      // An overflow in one gradient: the scaler must skip this step and halve its scale.
      Tensor before = w.detach().to(Device::cpu());
      EXPECT_FALSE(scaler.step(opt)) << "a step with an inf gradient is skipped";
      testing::expectBitEqual(w.detach(), before, "weights after the skipped step");
      const double s0 = scaler.getScale();
      scaler.update();
      EXPECT_EQ(scaler.getScale(), s0 * 0.5) << "the scale backs off";
      continue;
    }
    EXPECT_TRUE(scaler.step(opt)) << "step " << s;
    scaler.update();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(CudaAutocast, Float16WithAGradScalerFollowsFloat32AndSkipsAnOverflowingStep) {
  COHORT_REQUIRE_GPU();
  std::vector<double> fp16 = trainMlpWithOverflowAtStep20(true);
  std::vector<double> f32 = trainMlpWithOverflowAtStep20(false);
  ASSERT_EQ(fp16.size(), f32.size());
  for (size_t i = 0; i < f32.size(); ++i)
    EXPECT_NEAR(fp16[i], f32[i], 2e-2 * f32[i] + 1e-3) << "step " << i << " (the skipped step 20 not counted)";
  EXPECT_LT(fp16.back(), 0.6 * fp16.front()) << "float16 training with a GradScaler on the GPU learns";
  std::printf("loss first / last: fp16 %.5f / %.5f, f32 %.5f / %.5f\n", fp16.front(), fp16.back(), f32.front(),
              f32.back());
}

}  // namespace
}  // namespace cohort
