// CUDA runtime on a GPU: streams, events, guards, copies (synchronous, pinned asynchronous), the
// caching allocator on the device (stream pools, recordStream, emptyCache, churn, out of memory),
// and the cuBLAS matrix products against the CPU's. Skips without a GPU.
#include <gtest/gtest.h>

#include <thread>

#include "core/cuda/cuda_test_util.h"

namespace cohort {
namespace {

using testing::expectBitEqual;
using testing::expectClose;

// Inputs uniform in [-1, 1).
Tensor uniform(const Shape& s, DType dt = DType::Float32, uint64_t seed = 1) {
  return testing::values(s, dt, seed, -1, 1);
}

TEST(CudaRuntime, DevicesStreamsAndGuards) {
  COHORT_REQUIRE_GPU();
  EXPECT_GE(cuda::deviceCount(), 1);
  EXPECT_EQ(cuda::currentDevice(), 0);
  EXPECT_TRUE(cuda::currentStream().isDefault());
  cuda::Stream s = cuda::streamFromPool();
  EXPECT_FALSE(s.isDefault());
  {
    cuda::StreamGuard g(s);
    EXPECT_EQ(cuda::currentStream(), s);
  }
  EXPECT_TRUE(cuda::currentStream().isDefault()) << "the guard restores the previous stream";
  // The current stream is per thread.
  cuda::setCurrentStream(s);
  cuda::Stream other;
  std::thread([&] { other = cuda::currentStream(0); }).join();
  EXPECT_TRUE(other.isDefault());
  cuda::setCurrentStream(cuda::defaultStream());
  EXPECT_THROW(cuda::currentStream(cuda::deviceCount()), IndexError);
}

TEST(CudaRuntime, CopiesRoundTripEveryDtype) {
  COHORT_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32,
                   DType::UInt8, DType::Bool}) {
    Tensor x = (uniform({37, 5}, DType::Float32, 3) * 100.0).to(dt);
    Tensor d = x.to(Device::cuda());
    EXPECT_EQ(d.device(), Device::cuda(0));
    expectBitEqual(d.to(Device::cpu()), x, fmt::format("{}", dt));
  }
  Tensor empty0 = zeros({0, 3}).to(Device::cuda());
  EXPECT_EQ(empty0.to(Device::cpu()).sizes(), (Shape{0, 3}));
}

TEST(CudaRuntime, PinnedAsyncCopiesAndEvents) {
  COHORT_REQUIRE_GPU();
  Tensor host = cuda::pinnedEmpty({1 << 20});
  EXPECT_TRUE(cuda::isPinned(host));
  EXPECT_FALSE(cuda::isPinned(zeros({4})));
  host.copy_(uniform({1 << 20}, DType::Float32, 5));
  cuda::Stream s = cuda::streamFromPool();
  cuda::StreamGuard g(s);
  cuda::Event start(true), end(true);
  start.record();
  Tensor d = cuda::copyTo(host, Device::cuda(), /*nonBlocking=*/true);
  Tensor back = cuda::copyTo(d, Device::cpu(), /*nonBlocking=*/true);
  end.record();
  EXPECT_TRUE(cuda::isPinned(back));
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsedMs(end), 0.0f);
  expectBitEqual(back, host, "pinned round trip");
}

TEST(CudaRuntime, AllocatorReusesPerStreamAndHonoursRecordStream) {
  COHORT_REQUIRE_GPU();
  cuda::synchronize();
  void* first = nullptr;
  {
    Tensor t = empty({1 << 18}, {.device = Device::cuda()});
    first = t.storage()->data();
  }
  {
    Tensor t = empty({1 << 18}, {.device = Device::cuda()});
    EXPECT_EQ(t.storage()->data(), first) << "the freed block is reused on the same stream";
  }
  cuda::Stream s = cuda::streamFromPool();
  {
    cuda::StreamGuard g(s);
    Tensor t = empty({1 << 18}, {.device = Device::cuda()});
    EXPECT_NE(t.storage()->data(), first) << "another stream gets another block";
  }
  auto before = cuda::allocatorStats();
  {
    Tensor t = empty({1 << 18}, {.device = Device::cuda()});
    cuda::recordStream(t, s);
  }
  EXPECT_EQ(cuda::allocatorStats().pendingFrees, before.pendingFrees + 1);
  s.synchronize();
  emptyCache(Device::cuda());
  EXPECT_EQ(cuda::allocatorStats().pendingFrees, 0);
}

TEST(CudaRuntime, AllocatorChurnDoesNotGrow) {
  COHORT_REQUIRE_GPU();
  auto step = [] {
    Tensor a = empty({1000, 257}, {.device = Device::cuda()});
    Tensor b = empty({33}, {.dtype = DType::BFloat16, .device = Device::cuda()});
    Tensor c = empty({3 << 20}, {.device = Device::cuda()});
    Tensor d = empty({5, 5}, {.dtype = DType::Int64, .device = Device::cuda()});
  };
  step();
  auto s0 = cuda::allocatorStats();
  for (int i = 0; i < 10000; ++i) step();
  auto s1 = cuda::allocatorStats();
  EXPECT_EQ(s1.segmentAllocations, s0.segmentAllocations) << "no new cudaMalloc after the first step";
  EXPECT_EQ(s1.reservedBytes, s0.reservedBytes);
  EXPECT_EQ(memoryStats(Device::cuda()).bytesLive, 0);
}

TEST(CudaRuntime, OutOfMemoryIsAClearErrorAndTheDeviceStaysUsable) {
  COHORT_REQUIRE_GPU();
  try {
    Tensor huge = empty({int64_t{1} << 42}, {.device = Device::cuda()});  // 16 TiB
    FAIL() << "a 16 TiB tensor was allocated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:0"), std::string::npos) << e.what();
  }
  Tensor ok = ones({4}).to(Device::cuda());
  EXPECT_EQ(ok.to(Device::cpu()).toVector<float>(), std::vector<float>(4, 1.0f));
}

// ---- matrix products ----------------------------------------------------------------------------

struct GemmCase {
  DType dt;
  double atol, rtol;  // per element, relative to sqrt(k)-scaled sums of products of U[-1,1] values
};

std::vector<GemmCase> gemmCases() {
  return {{DType::Float64, 1e-12, 1e-12},
          {DType::Float32, 2e-5, 1e-5},
          {DType::BFloat16, 2e-2, 8e-3},
          {DType::Float16, 4e-3, 1e-3}};
}

TEST(CudaGemm, MatchesCpuForEveryDtypeAndLayout) {
  COHORT_REQUIRE_GPU();
  for (const GemmCase& c : gemmCases()) {
    for (auto [m, k, n] : {std::tuple{1, 1, 1}, {7, 13, 5}, {64, 256, 96}, {300, 129, 1}, {1, 512, 300}}) {
      Tensor a = uniform({m, k}, c.dt, 11), b = uniform({k, n}, c.dt, 12);
      Tensor at = uniform({k, m}, c.dt, 13).t(), bt = uniform({n, k}, c.dt, 14).t();  // transposed views
      double s = std::sqrt(static_cast<double>(k));
      for (auto [x, y, name] :
           {std::tuple{a, b, "a@b"}, {at, b, "a.t()@b"}, {a, bt, "a@b.t()"}, {at, bt, "both .t()"}}) {
        Tensor want = matmul(x, y);
        Tensor got = matmul(x.to(Device::cuda()), y.to(Device::cuda()));
        EXPECT_EQ(got.device(), Device::cuda(0));
        expectClose(got, want, c.atol * s, c.rtol, fmt::format("{} {}x{}x{} {}", c.dt, m, k, n, name));
      }
    }
  }
}

TEST(CudaGemm, BatchedBroadcastLinearAddmmAndGradients) {
  COHORT_REQUIRE_GPU();
  Tensor a = uniform({3, 4, 17, 9}), b = uniform({4, 9, 6});
  expectClose(matmul(a.to(Device::cuda()), b.to(Device::cuda())), matmul(a, b), 1e-5, 1e-5, "batched broadcast");
  Tensor x = uniform({5, 8, 16}), w = uniform({12, 16}), bias = uniform({12});
  x.setRequiresGrad(true);
  w.setRequiresGrad(true);
  bias.setRequiresGrad(true);
  Tensor xd = x.detach().to(Device::cuda()), wd = w.detach().to(Device::cuda()), bd = bias.detach().to(Device::cuda());
  xd.setRequiresGrad(true);
  wd.setRequiresGrad(true);
  bd.setRequiresGrad(true);
  Tensor y = linear(x, w, bias);
  Tensor yd = linear(xd, wd, bd);
  expectClose(yd, y, 1e-5, 1e-5, "linear forward");
  Tensor g = uniform({5, 8, 12}, DType::Float32, 9);
  y.backward(g);
  yd.backward(g.to(Device::cuda()));
  expectClose(xd.grad(), x.grad(), 1e-5, 1e-5, "linear dx");
  expectClose(wd.grad(), w.grad(), 1e-4, 1e-5, "linear dw");
  expectClose(bd.grad(), bias.grad(), 1e-4, 1e-5, "linear dbias");
  Tensor c = uniform({4, 6}), p = uniform({4, 5}), q = uniform({5, 6});
  expectClose(addmm(c.to(Device::cuda()), p.to(Device::cuda()), q.to(Device::cuda()), 0.5, 2.0),
              addmm(c, p, q, 0.5, 2.0), 1e-5, 1e-5, "addmm");
}

TEST(CudaGemm, Tf32IsOptIn) {
  COHORT_REQUIRE_GPU();
  EXPECT_FALSE(cuda::allowTf32());
  Tensor a = uniform({256, 1024}), b = uniform({1024, 256});
  Tensor ref = matmul(a.to(DType::Float64), b.to(DType::Float64));
  Tensor full = matmul(a.to(Device::cuda()), b.to(Device::cuda())).to(Device::cpu()).to(DType::Float64);
  cuda::setAllowTf32(true);
  Tensor tf32 = matmul(a.to(Device::cuda()), b.to(Device::cuda())).to(Device::cpu()).to(DType::Float64);
  cuda::setAllowTf32(false);
  double errFull = (full - ref).abs().max().item<double>(), errTf32 = (tf32 - ref).abs().max().item<double>();
  EXPECT_LT(errFull, 1e-3);
  EXPECT_LT(errTf32, 0.1);
  std::printf("max |error| vs float64 at k=1024: float32 %.3g, TF32 %.3g\n", errFull, errTf32);
}

TEST(CudaGemm, MismatchedDevicesAndIntegerMatricesAreClearErrors) {
  COHORT_REQUIRE_GPU();
  Tensor a = uniform({2, 3}), b = uniform({3, 2});
  EXPECT_THROW(matmul(a.to(Device::cuda()), b), ValueError);
  Tensor ai = a.to(DType::Int64).to(Device::cuda()), bi = b.to(DType::Int64).to(Device::cuda());
  EXPECT_THROW(matmul(ai, bi), NotSupportedError);
}

}  // namespace
}  // namespace cohort
