// Fused optimizer steps on a GPU against the CPU: SGD (plain, momentum, dampening, Nesterov,
// weight decay, maximize), Adam (coupled weight decay, amsgrad) and AdamW, ten steps on the same
// parameters and gradients, parameters and state bit-identical after every step, for every float
// dtype. Both devices run the arithmetic of core/optim/detail/update_math.h with the same
// roundings. Gradient clipping over GPU gradients against the CPU's. Skips without a GPU, except
// the CPU check at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/detail/update_math.h>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

using testing::expectBitEqual;
using testing::expectClose;

using testing::kFloatTypes;
using testing::values;

// Parameters of several shapes: an odd size, a transposed (non-contiguous) one, a 0-d and an empty one.
std::vector<Tensor> makeParams(DType dt, Device device) {
  std::vector<Tensor> ps = {values({37, 13}, dt, 1, -1, 1), values({9, 4}, dt, 2, -1, 1).transpose(0, 1),
                            values({}, dt, 3, -1, 1), values({0, 5}, dt, 4, -1, 1)};
  for (Tensor& p : ps) {
    if (device.isCuda()) p = p.to(device);
    p.setRequiresGrad();
  }
  return ps;
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

void runSteps(const MakeOpt& make, const std::string& what) {
  for (DType dt : kFloatTypes) {
    std::vector<Tensor> cpu = makeParams(dt, Device::cpu());
    std::vector<Tensor> gpu = makeParams(dt, Device::cuda());
    auto optCpu = make(cpu);
    auto optGpu = make(gpu);
    for (int step = 0; step < 10; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = values(cpu[i].sizes(), dt, 100 + 10 * step + i, -1, 1);
        cpu[i].setGrad(g);
        gpu[i].setGrad(g.to(Device::cuda()));
      }
      optCpu->step();
      optGpu->step();
      for (size_t i = 0; i < cpu.size(); ++i) {
        const std::string at = fmt::format("{} {} step {} param {}", what, dt, step, i);
        expectBitEqual(gpu[i].detach(), cpu[i].detach(), at);
        const optim::ParamState* sc = optCpu->state(cpu[i]);
        const optim::ParamState* sg = optGpu->state(gpu[i]);
        ASSERT_EQ(sc == nullptr, sg == nullptr) << at;
        if (sc == nullptr) continue;
        EXPECT_EQ(sc->step, sg->step) << at;
        for (const auto& [key, t] : sc->tensors) {
          ASSERT_TRUE(sg->tensors.count(key)) << at << " " << key;
          EXPECT_TRUE(sg->tensors.at(key).device().isCuda()) << at << " " << key;
          expectBitEqual(sg->tensors.at(key), t, at + " " + key);
        }
      }
      if (::testing::Test::HasFailure()) return;  // the first differing step is the useful one
    }
  }
}

TEST(CudaOptim, SgdMatchesTheCpuBitForBit) {
  COHORT_REQUIRE_GPU();
  std::vector<std::pair<std::string, optim::SGDOptions>> configs = {
      {"plain", {.lr = 0.1}},
      {"weight decay", {.lr = 0.05, .weightDecay = 0.01}},
      {"momentum", {.lr = 0.05, .momentum = 0.9, .weightDecay = 0.01}},
      {"dampening maximize", {.lr = 0.05, .momentum = 0.8, .dampening = 0.1, .weightDecay = 0.02, .maximize = true}},
      {"nesterov", {.lr = 0.03, .momentum = 0.9, .weightDecay = 0.001, .nesterov = true}},
  };
  for (const auto& config : configs) {
    const optim::SGDOptions o = config.second;  // a lambda may not capture a structured binding (clang)
    runSteps([o](std::vector<Tensor> ps) { return std::make_unique<optim::SGD>(std::move(ps), o); },
             "SGD " + config.first);
  }
}

TEST(CudaOptim, AdamAndAdamWMatchTheCpuBitForBit) {
  COHORT_REQUIRE_GPU();
  runSteps([](std::vector<Tensor> ps) { return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{}); },
           "Adam");
  runSteps(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::Adam>(std::move(ps),
                                             optim::AdamOptions{.lr = 0.01, .weightDecay = 0.01, .amsgrad = true});
      },
      "Adam wd amsgrad");
  runSteps([](std::vector<Tensor> ps) { return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions{}); },
           "AdamW");
  runSteps(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::AdamW>(
            std::move(ps),
            optim::AdamWOptions{.lr = 0.02, .beta2 = 0.99, .weightDecay = 0.1, .amsgrad = true, .maximize = true});
      },
      "AdamW amsgrad maximize");
}

// Half parameters with float32 master weights: the step kernels get the parameters' bfloat16 /
// float16 gradients with the float32 masters (the CPU's read them in place, the GPU's widen them,
// exactly), and both devices end bit-identical.
TEST(CudaOptim, MasterWeightsWithHalfGradientsMatchTheCpuBitForBit) {
  COHORT_REQUIRE_GPU();
  runSteps(
      [](std::vector<Tensor> ps) {
        auto opt = std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions{.lr = 0.01, .weightDecay = 0.1});
        opt->setMasterWeights(true);
        return opt;
      },
      "AdamW master weights");
  runSteps(
      [](std::vector<Tensor> ps) {
        auto opt = std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
        opt->setMasterWeights(true);
        return opt;
      },
      "SGD master weights");
}

TEST(CudaOptim, StateLoadedOnTheCpuMovesToTheParameterDevice) {
  COHORT_REQUIRE_GPU();
  std::vector<Tensor> cpu = makeParams(DType::Float32, Device::cpu());
  std::vector<Tensor> gpu = makeParams(DType::Float32, Device::cuda());
  optim::AdamW a(cpu), b(gpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    cpu[i].setGrad(onesLike(cpu[i].detach()));
    gpu[i].setGrad(onesLike(cpu[i].detach()).to(Device::cuda()));
  }
  a.step();
  b.step();
  b.loadStateDict(a.stateDict());  // the same values, but state tensors on the CPU and parameters on the GPU
  a.step();
  b.step();
  for (size_t i = 0; i < cpu.size(); ++i) {
    expectBitEqual(gpu[i].detach(), cpu[i].detach(), "after load");
    if (const optim::ParamState* st = b.state(gpu[i])) {
      for (const auto& [key, t] : st->tensors) EXPECT_TRUE(t.device().isCuda()) << key << " stayed on the CPU";
    }
  }
}

// Gradient clipping with the gradients on the GPU: every norm order gives the CPU's total (the
// device's per-tensor norms are float32 or float64 sums, the host's double: they agree to float32
// precision), the gradients are scaled by the same factor (within one rounding of their dtype),
// a list spread over both devices gives the same total, and a NaN total with errorIfNonfinite is
// a ValueError that scales nothing.
TEST(CudaOptim, ClipGradNormMatchesTheCpu) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    const bool half = dt == DType::BFloat16 || dt == DType::Float16;
    const double rounding = dt == DType::BFloat16 ? 0x1p-8 : dt == DType::Float16 ? 0x1p-11 : 1e-6;
    for (double p : {2.0, 1.0, 3.0, optim::kInfNorm, 0.0}) {
      const std::string at = fmt::format("{} p={}", dt, p);
      std::vector<Tensor> cpu = makeParams(dt, Device::cpu());
      std::vector<Tensor> gpu = makeParams(dt, Device::cuda());
      for (size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = values(cpu[i].sizes(), dt, 40 + i, -3, 3);
        cpu[i].setGrad(g);
        gpu[i].setGrad(g.to(Device::cuda()));
      }
      const double normCpu = optim::gradNorm(cpu, p);
      EXPECT_NEAR(optim::gradNorm(gpu, p), normCpu, 2e-6 * normCpu) << at;
      std::vector<Tensor> mixed = {cpu[0], gpu[1], cpu[2], gpu[3]};
      EXPECT_NEAR(optim::gradNorm(mixed, p), normCpu, 2e-6 * normCpu) << at << " (CPU and GPU gradients in one list)";

      const double maxNorm = 0.25 * normCpu;  // every order clips
      const double totalCpu = optim::clipGradNorm(cpu, maxNorm, p);
      const double totalGpu = optim::clipGradNorm(gpu, maxNorm, p);
      EXPECT_NEAR(totalGpu, totalCpu, 2e-6 * totalCpu) << at;
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_TRUE(gpu[i].grad().device().isCuda()) << at;
        expectClose(gpu[i].grad(), cpu[i].grad(), 0, half ? rounding : 1e-5, at + fmt::format(" grad {}", i));
      }
      if (p == 2.0) {  // after clipping, the 2-norm is maxNorm
        EXPECT_NEAR(optim::gradNorm(gpu, p), maxNorm, (half ? 4 * rounding : 1e-5) * maxNorm) << at;
      }
    }
  }
  std::vector<Tensor> gpu = makeParams(DType::Float32, Device::cuda());
  Tensor g = values(gpu[0].sizes(), DType::Float32, 9);
  g.select(0, 3).select(0, 0).fill_(NAN);
  gpu[0].setGrad(g.to(Device::cuda()));
  const Tensor before = gpu[0].grad().to(Device::cpu());
  EXPECT_THROW(optim::clipGradNorm(gpu, 1.0, 2.0, /*errorIfNonfinite=*/true), ValueError);
  expectBitEqual(gpu[0].grad(), before, "a refused clip scales nothing");
}

// The shared arithmetic on the CPU, by hand: each product that meets a sum is one FMA.
TEST(CudaOptimNoGpu, UpdateMathRoundsOncePerFma) {
  using optim::detail::HostMath;
  // (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24: an FMA keeps the 2^-24 term, a separate product rounds it away.
  const float x = 1.0f + 0x1p-12f, minusOne = -1.0f;
  EXPECT_EQ(optim::detail::sgdApply<HostMath>(minusOne, x, x), std::fma(x, x, minusOne));
  volatile float product = x * x;                           // rounded on its own: no contraction across a volatile
  EXPECT_NE(std::fma(x, x, minusOne), product + minusOne);  // so the test above tells the two apart
  const double d = optim::detail::adamDenom<HostMath>(4.0, 2.0, 0.5);
  EXPECT_EQ(d, 1.5);
}

}  // namespace
}  // namespace cohort
