// The NCCL backend (distributed/nccl/), built with COHORT_USE_NCCL. The unique-id exchange runs
// anywhere (ncclGetUniqueId needs no GPU); everything else needs a GPU and skips without one. On
// one GPU every collective runs at world size 1 (where each is a copy or the identity, so a wrong
// pointer, count, dtype or stream order shows as a wrong value); with two GPUs or more the ranks
// are threads, one per GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include <cohort/core/cuda/cuda.h>
#include <cohort/core/cuda/detail/tensor_glue.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/nccl/nccl_backend.h>
#include <cohort/distributed/nccl/nccl_communicator.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>

#include "core/cuda/cuda_test_util.h"
#include "harness/world.h"

namespace cohort::dist {
namespace {

using namespace std::chrono_literals;

const std::vector<DType> kDTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                    DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};

// (i + salt) % 7 in `d` (bool: false every 7th element), on the CPU.
Tensor pattern(DType d, int64_t n, int salt = 0) {
  Tensor t = empty({n}, {.dtype = DType::Float64});
  double* p = t.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<double>((i + salt) % 7);
  return t.to(d);
}

void* devicePtr(const Tensor& t) { return cuda::detail::devicePtr(t); }

std::shared_ptr<ProcessGroup> worldOfOne(const std::string& backend = "nccl", const std::string& name = "world") {
  ProcessGroupOptions o;
  o.backend = backend;
  o.name = name;
  o.timeout = Millis(60'000);
  return ProcessGroup::create(std::make_shared<HashStore>(), 0, 1, o);
}

// Waits for the op (stream-ordered), then brings `t` back to the host (ordered after the wait on
// the current stream).
Tensor afterWait(const WorkPtr& w, const Tensor& t) {
  w->wait();
  return t.to(Device::cpu());
}

TEST(NcclUniqueId, ExchangedThroughTheStoreWithoutAGpu) {
  // ncclGetUniqueId only picks the bootstrap interface: no device needed.
  auto store = std::make_shared<HashStore>();
  constexpr int kRanks = 4;
  std::vector<nccl::UniqueId> ids(kRanks);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        ids[r] = nccl::exchangeUniqueId(*store, "uid/0", r, Millis(10'000));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  nccl::UniqueId zero{};
  EXPECT_NE(ids[0], zero);
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
  EXPECT_NE(nccl::makeUniqueId(), ids[0]);  // a new id each time
  std::cout << "NCCL " << nccl::version() << "\n";
}

TEST(NcclRouting, AutoSendsCudaTensorsToNcclAndCpuTensorsToTheCpuBackend) {
  ASSERT_TRUE(hasBackend("nccl"));
  auto pg = worldOfOne("auto", "routing");
  EXPECT_EQ(pg->backend(DeviceType::CUDA).name(), "nccl");
  EXPECT_NE(pg->backend(DeviceType::CPU).name(), "nccl");
  auto only = worldOfOne("nccl", "ncclonly");
  EXPECT_EQ(only->backend(DeviceType::CUDA).name(), "nccl");
  EXPECT_THROW(only->backend(DeviceType::CPU), NotSupportedError);
  Tensor cpu = ones({4});
  EXPECT_THROW(only->allreduce(cpu), NotSupportedError);
}

TEST(Nccl, EveryCollectiveAtWorldSizeOne) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne();
  const Device dev = Device::cuda(0);
  for (DType d : kDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
      SCOPED_TRACE(fmt::format("{} x {}", dtypeName(d), n));
      const Tensor x = pattern(d, n);
      std::vector<ReduceOp> ops{ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max};
      if (isFloating(d)) ops.push_back(ReduceOp::Avg);
      for (ReduceOp op : ops) {
        Tensor g = x.to(dev);
        testing::expectBitEqual(afterWait(pg->allreduce(g, {.op = op}), g), x, reduceOpName(op));
      }
      {
        Tensor g = x.to(dev);
        testing::expectBitEqual(afterWait(pg->broadcast(g), g), x, "broadcast");
        testing::expectBitEqual(afterWait(pg->reduce(g), g), x, "reduce");
      }
      {
        Tensor in = x.to(dev);
        std::vector<Tensor> outs{zeros({n}, {.dtype = d}).to(dev)};
        testing::expectBitEqual(afterWait(pg->allgather(outs, in), outs[0]), x, "allgather");
        Tensor out = zeros({n}, {.dtype = d}).to(dev);
        testing::expectBitEqual(afterWait(pg->allgatherIntoTensor(out, in), out), x, "allgatherIntoTensor");
        std::vector<std::vector<Tensor>> outLists{{zeros({n}, {.dtype = d}).to(dev), zeros({n}, {.dtype = d}).to(dev)}};
        std::vector<Tensor> ins{in, in};
        auto w = pg->allgatherCoalesced(outLists, ins);
        testing::expectBitEqual(afterWait(w, outLists[0][1]), x, "allgatherCoalesced");
      }
      {
        Tensor out = zeros({n}, {.dtype = d}).to(dev);
        std::vector<Tensor> ins{x.to(dev)};
        testing::expectBitEqual(afterWait(pg->reduceScatter(out, ins), out), x, "reduceScatter");
        Tensor out2 = zeros({n}, {.dtype = d}).to(dev);
        testing::expectBitEqual(afterWait(pg->reduceScatterTensor(out2, ins[0]), out2), x, "reduceScatterTensor");
      }
      {
        Tensor in = x.to(dev);
        Tensor out = zeros({n}, {.dtype = d}).to(dev);
        testing::expectBitEqual(afterWait(pg->alltoall(out, in), out), x, "alltoall");
        Tensor outV = zeros({n}, {.dtype = d}).to(dev);
        testing::expectBitEqual(afterWait(pg->alltoall(outV, in, {.outputSplitSizes = {n}, .inputSplitSizes = {n}}),
                                          outV),
                                x, "alltoallV");
        std::vector<Tensor> ins{in};
        std::vector<Tensor> outs{zeros({n}, {.dtype = d}).to(dev)};
        testing::expectBitEqual(afterWait(pg->alltoallList(outs, ins), outs[0]), x, "alltoallList");
      }
      {
        Tensor in = x.to(dev);
        std::vector<Tensor> outs{zeros({n}, {.dtype = d}).to(dev)};
        testing::expectBitEqual(afterWait(pg->gather(outs, in), outs[0]), x, "gather");
        Tensor out = zeros({n}, {.dtype = d}).to(dev);
        testing::expectBitEqual(afterWait(pg->scatter(out, {in}), out), x, "scatter");
      }
    }
  }
  pg->barrier()->wait();
  cuda::synchronize();
  // Every op was numbered and recorded as the CPU backends do, and completed.
  const auto entries = pg->flightRecorder().entries();
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.back().op, "barrier");
  EXPECT_EQ(entries.back().seq, pg->sequenceNumber());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    bool all = true;
    for (const auto& e : pg->flightRecorder().entries()) all = all && e.state == FlightRecorder::State::Completed;
    if (all) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "flight-recorder entries still not completed";
    std::this_thread::sleep_for(5ms);
  }
}

TEST(Nccl, CoalescedAllreduceOfBuckets) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne();
  std::vector<Tensor> cpu{pattern(DType::Float32, 1000, 1), pattern(DType::Float32, 3, 2),
                          pattern(DType::Float32, (1 << 18) + 1, 3), pattern(DType::Float32, 0)};
  std::vector<Tensor> gpu;
  for (auto& t : cpu) gpu.push_back(t.to(Device::cuda(0)));
  auto w = pg->allreduceCoalesced(gpu, {.op = ReduceOp::Max});
  w->wait();
  auto results = w->result();
  ASSERT_EQ(results.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) testing::expectBitEqual(results[i], cpu[i], fmt::format("bucket {}", i));
  EXPECT_TRUE(w->future().waitFor(10s)) << "the Work never completed";
}

// wait() orders the caller's stream after the op, without blocking the host; the op itself
// waits for what the caller queued before it.
TEST(Nccl, WaitIsStreamOrdered) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne();
  constexpr int64_t kN = int64_t{1} << 24;  // 64 MiB of float32: copies long enough to race
  cuda::Stream side = cuda::streamFromPool(0);
  cuda::StreamGuard guard(side);
  Tensor host = cuda::pinnedEmpty({kN});
  float* p = static_cast<float*>(host.dataPtr());
  for (int64_t i = 0; i < kN; ++i) p[i] = static_cast<float>(i % 1013);
  for (int round = 0; round < 3; ++round) {
    Tensor in = cuda::copyTo(host, Device::cuda(0), /*nonBlocking=*/true);  // queued on `side`
    Tensor out = empty({kN}, {.device = Device::cuda(0)});
    auto w = pg->allgatherIntoTensor(out, in);  // must wait for the copy into `in`
    // Stream-ordered unless COHORT_NCCL_BLOCKING_WAIT=1 (then wait() blocks the host: also correct).
    const char* blocking = std::getenv("COHORT_NCCL_BLOCKING_WAIT");
    EXPECT_EQ(w->waitsOnDevice(), blocking == nullptr || std::string(blocking) == "0");
    w->wait();                                                              // `side` waits for the allgather
    Tensor back = cuda::copyTo(out, Device::cpu(), /*nonBlocking=*/false);  // on `side`, after the wait
    const float* b = static_cast<const float*>(back.dataPtr());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < kN; ++i) {
      if (b[i] != p[i]) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    ASSERT_EQ(bad, 0) << "round " << round << ": first wrong element " << first << ": got " << b[first] << ", want "
                      << p[first];
    EXPECT_TRUE(w->future().waitFor(10s));
    EXPECT_TRUE(w->isSuccess());
  }
}

// NCCL pairs a send and a receive to oneself within one group.
TEST(NcclCommunicator, SendRecvToSelfInOneGroup) {
  COHORT_REQUIRE_GPU();
  cuda::DeviceGuard device(0);
  auto comm = nccl::NcclCommunicator::create(nccl::makeUniqueId(), 0, 1, 0);
  const Tensor x = pattern(DType::Float32, 4096);
  Tensor in = x.to(Device::cuda(0));
  Tensor out = zeros({4096}, {.device = Device::cuda(0)});
  cuda::Stream s = cuda::streamFromPool(0);
  cuda::synchronize();  // the copies above ran on the current stream
  CommOp send{.kind = CommOpKind::Send, .send = devicePtr(in), .count = 4096, .dtype = DType::Float32, .peer = 0};
  CommOp recv{.kind = CommOpKind::Recv, .recv = devicePtr(out), .count = 4096, .dtype = DType::Float32, .peer = 0};
  std::vector<CommOp> ops{send, recv};
  auto done = comm->enqueue(std::span<const CommOp>(ops), s.handle());
  s.synchronize();
  EXPECT_TRUE(done->started());
  EXPECT_TRUE(done->done());
  EXPECT_EQ(comm->asyncError(), "");
  testing::expectBitEqual(out, x, "send/recv to self");
}

// A subgroup made after the parent has a communicator gets its own by ncclCommSplit, at once.
TEST(Nccl, SubgroupSplitsTheParentsCommunicator) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne("nccl", "splitparent");
  Tensor t = ones({8}).to(Device::cuda(0));
  pg->allreduce(t)->wait();
  auto sub = pg->newGroup({0});
  ASSERT_NE(sub, nullptr);
  auto& child = dynamic_cast<nccl::NcclBackend&>(sub->backend(DeviceType::CUDA));
  EXPECT_EQ(child.devices(), std::vector<int>{0}) << "the subgroup did not get a split communicator";
  Tensor u = full({8}, 3.0).to(Device::cuda(0));
  testing::expectBitEqual(afterWait(sub->allreduce(u), u), full({8}, 3.0), "allreduce on the split subgroup");
}

// Ranks as threads, one per GPU (needs two GPUs or more).
// Held until the process exits, as the default process group is: a global made before CUDA is
// initialised, so that its destructor runs after the CUDA runtime has been torn down.
ProcessGroupPtr gHeldUntilExit;

TEST(Nccl, ACommunicatorStillHeldAtExitLeavesQuietly) {
  COHORT_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: CUDA does not survive fork
  EXPECT_EXIT(
      {
        gHeldUntilExit = worldOfOne();
        Tensor g = pattern(DType::Float32, 1000).to(Device::cuda(0));
        afterWait(gHeldUntilExit->allreduce(g), g);
        std::fputs("allreduce done\n", stderr);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "allreduce done\n$");  // nothing after it: no warning at exit
}

TEST(Nccl, ThreadRanksOnePerGpu) {
  COHORT_REQUIRE_GPU();
  const int n = cuda::deviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << n;
  auto store = std::make_shared<HashStore>();
  ::cohort::testing::runOnThreads(
      [&] {
        std::vector<int> r;
        for (int i = 0; i < n; ++i) r.push_back(i);
        return r;
      }(),
      [&](int r) {
        cuda::setDevice(r);
        ProcessGroupOptions o;
        o.backend = "nccl";
        o.name = "perGpu";
        auto pg = ProcessGroup::create(store, r, n, o);
        Tensor t = full({1000}, static_cast<double>(r + 1)).to(Device::cuda(r));
        pg->allreduce(t)->wait();
        Tensor back = t.to(Device::cpu());
        const double want = n * (n + 1) / 2.0;
        if (back.max().item<double>() != want || back.min().item<double>() != want)
          throw std::runtime_error(fmt::format("allreduce gave {} .. {}, want {}", back.min().item<double>(),
                                               back.max().item<double>(), want));
        Tensor out = zeros({1000 * n}).to(Device::cuda(r));
        pg->allgatherIntoTensor(out, t)->wait();
        cuda::synchronize(r);
      });
}

}  // namespace
}  // namespace cohort::dist
