// Op dispatch by device (core/ops/dispatch.h): kernels register under an op name and a signature;
// a lookup with another signature or device finds nothing; an op with no kernel for a device is a
// NotSupportedError naming both. Runs on every machine (the device type is only a key here).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <cohort/cohort.h>
#include <cohort/config.h>
#include <cohort/core/cuda/cuda.h>
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
}

TEST(Dispatch, CudaBuildRegistersMatrixProducts) {
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA";
  EXPECT_NE(dispatch::find<dispatch::GemmKernel>("matmul", Device::cuda(0)), nullptr);
  EXPECT_NE(dispatch::find<dispatch::BatchedGemmKernel>("bmm", Device::cuda(0)), nullptr);
}

TEST(Dispatch, OpsWithoutACudaKernelSayWhichOpAndDevice) {
  // Convolution and pooling have CPU kernels only: on CUDA tensors they are refused by name.
  if (!cuda::isAvailable()) GTEST_SKIP() << "needs a CUDA device to make a CUDA tensor";
  Tensor x = zeros({1, 1, 4, 4}, {.device = Device::cuda()}), w = zeros({1, 1, 3, 3}, {.device = Device::cuda()});
  testing::expectError<NotSupportedError>([&] { nn::functional::conv2d(x, w); }, {"conv2d", "cuda:0"});
  testing::expectError<NotSupportedError>(
      [&] {
        nn::functional::maxPool2d(x, {.kernel = {2, 2}});
      },
      {"maxPool2d", "cuda:0"});
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
