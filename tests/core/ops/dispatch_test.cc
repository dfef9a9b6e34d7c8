// Op dispatch by device (core/ops/dispatch.h): kernels register under an op name and a signature;
// a lookup with another signature or device finds nothing; an op with no kernel for a device is a
// NotSupportedError naming both. Runs on every machine (the device type is only a key here).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>

#include <cohort/cohort.h>
#include <cohort/config.h>
#include <cohort/core/cuda/cuda.h>
#include <cohort/core/ops/detail/elementwise_dispatch.h>
#include <cohort/core/ops/detail/reduce_dispatch.h>
#include <cohort/core/ops/dispatch.h>

#include "core/test_util.h"

namespace cohort {
namespace {

int gCalls = 0;
void fakeUnary(Tensor&, const Tensor&) { ++gCalls; }
void fakeBinary(Tensor&, const Tensor&, const Tensor&) { gCalls += 10; }

TEST(Dispatch, FindsTheKernelRegisteredForOpSignatureAndDevice) {
  static const dispatch::Register<dispatch::UnaryKernel> kUnary{"test.op", DeviceType::CUDA, &fakeUnary};
  static const dispatch::Register<dispatch::BinaryKernel> kBinary{"test.op", DeviceType::CUDA, &fakeBinary};
  Tensor t;
  gCalls = 0;
  dispatch::kernel<dispatch::UnaryKernel>("test.op", Device::cuda(3))(t, t);
  EXPECT_EQ(gCalls, 1);
  dispatch::kernel<dispatch::BinaryKernel>("test.op", Device::cuda(0))(t, t, t);
  EXPECT_EQ(gCalls, 11);
  EXPECT_EQ(dispatch::find<dispatch::ScalarKernel>("test.op", Device::cuda(0)), nullptr)
      << "another signature under the same name is another kernel";
  EXPECT_EQ(dispatch::find<dispatch::UnaryKernel>("test.op", Device::cpu()), nullptr);
  auto ops = dispatch::opsWithKernels(DeviceType::CUDA);
  EXPECT_NE(std::find(ops.begin(), ops.end(), "test.op"), ops.end());
}

TEST(Dispatch, RegisteringTwiceIsAnError) {
  static const dispatch::Register<dispatch::UnaryKernel> kOnce{"test.twice", DeviceType::CUDA, &fakeUnary};
  EXPECT_THROW(dispatch::registerRaw(std::type_index(typeid(dispatch::UnaryKernel)), "test.twice", DeviceType::CUDA,
                                     reinterpret_cast<void*>(&fakeUnary)),
               Error);
}

TEST(Dispatch, MissingKernelNamesOpAndDevice) {
  try {
    dispatch::kernel<dispatch::UnaryKernel>("test.nothing", Device::cuda(1));
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("test.nothing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:1"), std::string::npos) << msg;
  }
  // On the CPU too, without advice to move the tensors to the CPU.
  try {
    dispatch::kernel<dispatch::UnaryKernel>("test.nothing", Device::cpu());
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("test.nothing: no kernel for CPU tensors"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("to(Device::cpu())"), std::string::npos) << msg;
  }
}

TEST(Dispatch, CudaBuildRegistersMatrixProducts) {
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA";
  EXPECT_NE(dispatch::find<dispatch::GemmKernel>("matmul", Device::cuda(0)), nullptr);
  EXPECT_NE(dispatch::find<dispatch::BatchedGemmKernel>("bmm", Device::cuda(0)), nullptr);
}

// The CPU's kernels are in the table like any device's, under the same names and signatures.
TEST(Dispatch, CpuKernelsRegisterThemselves) {
  const std::vector<std::string> cpu = dispatch::opsWithKernels(DeviceType::CPU);
  for (const char* op : {"add",
                         "mul",
                         "exp",
                         "gelu backward",
                         "where",
                         "copy_",
                         "fill_",
                         "matmul",
                         "bmm",
                         "sum",
                         "mean",
                         "norm",
                         "max",
                         "softmax",
                         "logSoftmax backward",
                         "nllLoss",
                         "layerNorm",
                         "embedding",
                         "dropout",
                         "indexSelect",
                         "scatterAdd",
                         "maskedFill",
                         "conv2d",
                         "maxPool2d backward",
                         "scaledDotProductAttention",
                         "SGD.step",
                         "AdamW.step"})
    EXPECT_NE(std::find(cpu.begin(), cpu.end(), op), cpu.end()) << op << " has no CPU kernel";
  Tensor a = fromVector<float>({1, 2, 3}), b = fromVector<float>({10, 20, 30}), out = empty({3});
  dispatch::kernel<dispatch::BinaryKernel>("add", Device::cpu())(out, a, b);
  testing::expectNear(out, {11, 22, 33}, 0);
}

std::atomic<int> gWrapped{0};
dispatch::BinaryKernel* gAdd = nullptr;
dispatch::GemmKernel* gMatmul = nullptr;
detail::PlannedReduceKernel* gSum = nullptr;
dispatch::FillKernel* gFill = nullptr;

// Ops reach their CPU kernels through the table: a wrapper put in place of a kernel sees the calls
// of every op built on it, and once the original is back it sees none.
TEST(Dispatch, CpuOpsReachTheirKernelsThroughTheTable) {
  using dispatch::replace;
  constexpr DeviceType kCpu = DeviceType::CPU;
  gAdd = replace<dispatch::BinaryKernel>("add", kCpu, [](Tensor& o, const Tensor& x, const Tensor& y) {
    ++gWrapped;
    gAdd(o, x, y);
  });
  gMatmul = replace<dispatch::GemmKernel>("matmul", kCpu,
                                          [](const Tensor& x, const Tensor& y, Tensor& c, double al, double be) {
                                            ++gWrapped;
                                            gMatmul(x, y, c, al, be);
                                          });
  gSum = replace<detail::PlannedReduceKernel>("sum", kCpu,
                                              [](Tensor& o, const Tensor& src, int64_t n, int64_t r, int64_t i,
                                                 double param) {
                                                ++gWrapped;
                                                gSum(o, src, n, r, i, param);
                                              });
  gFill = replace<dispatch::FillKernel>("fill_", kCpu, [](Tensor& o, Scalar v) {
    ++gWrapped;
    gFill(o, v);
  });
  ASSERT_NE(gAdd, nullptr);
  ASSERT_NE(gMatmul, nullptr);
  ASSERT_NE(gSum, nullptr);
  ASSERT_NE(gFill, nullptr);
  gWrapped = 0;
  Tensor a = fromVector<float>({1, 2, 3, 4}).reshape({2, 2}), b = fromVector<float>({1, 0, 0, 1}).reshape({2, 2});
  Tensor c = a + b;
  EXPECT_EQ(gWrapped.load(), 1) << "add";
  c.add_(b);
  EXPECT_EQ(gWrapped.load(), 2) << "add_ runs add's kernel";
  Tensor m = mm(a, b);
  EXPECT_EQ(gWrapped.load(), 3) << "mm";
  Tensor s = c.sum();
  EXPECT_EQ(gWrapped.load(), 4) << "sum";
  c.fill_(7);
  EXPECT_EQ(gWrapped.load(), 5) << "fill_";
  testing::expectNear(m, {1, 2, 3, 4}, 0);
  EXPECT_DOUBLE_EQ(s.itemDouble(), 1 + 2 + 3 + 4 + 2 * (1 + 1));
  // The originals back: the wrappers are what they replace.
  EXPECT_NE(replace<dispatch::BinaryKernel>("add", kCpu, gAdd), nullptr);
  EXPECT_NE(replace<dispatch::GemmKernel>("matmul", kCpu, gMatmul), nullptr);
  EXPECT_NE(replace<detail::PlannedReduceKernel>("sum", kCpu, gSum), nullptr);
  EXPECT_NE(replace<dispatch::FillKernel>("fill_", kCpu, gFill), nullptr);
  (void)(a + b).sum();
  EXPECT_EQ(gWrapped.load(), 5);
}

// In a CUDA build (a device or not), every op with a CUDA kernel has a CPU kernel, and the ops the
// CPU has alone are those with a composite on other devices (or an optional fused kernel).
TEST(Dispatch, CudaAndCpuKernelsCoverTheSameOps) {
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA";
  auto isTest = [](const std::string& op) { return op.rfind("test.", 0) == 0; };
  const std::vector<std::string> cpu = dispatch::opsWithKernels(DeviceType::CPU);
  const std::vector<std::string> cuda = dispatch::opsWithKernels(DeviceType::CUDA);
  for (const std::string& op : cuda) {
    if (isTest(op)) continue;
    EXPECT_NE(std::find(cpu.begin(), cpu.end(), op), cpu.end()) << op << ": CUDA only";
  }
  const std::vector<std::string> composites{
      "GradScaler.unscale", "avgPool2d", "avgPool2d backward", "conv2d",  "conv2d backward",
      "gradNorm",           "linear",    "maxPool2d",          "mseLoss", "maxPool2d backward"};
  for (const std::string& op : cpu) {
    if (isTest(op) || std::find(cuda.begin(), cuda.end(), op) != cuda.end()) continue;
    EXPECT_NE(std::find(composites.begin(), composites.end(), op), composites.end())
        << op << ": a CPU kernel that CUDA tensors have no kernel or composite for";
  }
}

TEST(Dispatch, CudaWithoutADeviceIsAClearError) {
  if (cuda::isAvailable()) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_FALSE(cuda::isAvailable());
  EXPECT_EQ(cuda::deviceCount(), 0);
  EXPECT_THROW(cuda::currentStream(), NotSupportedError);
  EXPECT_THROW(cuda::pinnedEmpty({4}), NotSupportedError);
  EXPECT_THROW(zeros({2, 2}, {.device = Device::cuda()}), NotSupportedError);
  EXPECT_FALSE(cuda::isPinned(zeros({2})));
  cuda::Event e;
  EXPECT_TRUE(e.query()) << "an event never recorded is complete";
}

}  // namespace
}  // namespace cohort
