// DDP and FSDP on CUDA tensors through the NCCL backend, at world size 1 (one GPU: NCCL refuses two
// ranks on one device). At world size 1 the average of one rank's gradients is those gradients, so
// a wrapped model must train bit for bit like the plain model on the same GPU: a wrong bucket
// offset, a gradient left on the wrong stream or a buffer on the wrong device shows as a different
// value. Also the errors for modules on two devices and groups without a CUDA backend, and FSDP's
// sharded checkpoint and gradient clipping on GPU shards. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <cohort/cohort.h>
#include <cohort/core/cuda/cuda.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/ddp/powersgd_hook.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>
#include <cohort/fsdp/state_dict.h>

#include "core/cuda/cuda_test_util.h"

namespace cohort::dist {
namespace {

std::shared_ptr<ProcessGroup> worldOfOne(const std::string& backend) {
  ProcessGroupOptions o;
  o.backend = backend;
  o.name = "world-" + backend;
  o.timeout = Millis(60'000);
  return ProcessGroup::create(std::make_shared<HashStore>(), 0, 1, o);
}

// A 3-layer MLP; with `withSkip` its middle layer has an alternative `skip`, used only when asked
// (an unused parameter for findUnusedParameters).
class Net : public nn::Module {
 public:
  Net(Generator* g, bool withSkip) : nn::Module("Net") {
    a_ = registerModule("a", std::make_shared<nn::Linear>(16, 32, true, g));
    b_ = registerModule("b", std::make_shared<nn::Linear>(32, 32, true, g));
    if (withSkip) skip_ = registerModule("skip", std::make_shared<nn::Linear>(32, 32, true, g));
    c_ = registerModule("c", std::make_shared<nn::Linear>(32, 5, true, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = gelu((*a_)(x));
    h = useSkip ? (*skip_)(h) : (*b_)(h);
    return (*c_)(relu(h));
  }
  bool useSkip = false;
  nn::Linear& firstLayer() { return *a_; }

 private:
  std::shared_ptr<nn::Linear> a_, b_, skip_, c_;
};

// Inputs and labels the MLP can learn: the label is the argmax of a fixed linear map.
std::pair<Tensor, Tensor> batch(int step, Device dev) {
  return testing::learnableBatch(
      {.n = 24, .features = 16, .classes = 5, .weightSeed = 42, .batchSeed = 300, .distinct = 3}, step, dev);
}

// `steps` optimizer steps through `wrapped` (the DDP or FSDP module, or the model itself) on
// `dev`; returns the losses.
std::vector<double> train(nn::Module& wrapped, optim::Optimizer& opt, int steps, Device dev = Device::cuda()) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, dev);
    Tensor loss = nn::functional::crossEntropy(wrapped(x), y);
    opt.zeroGrad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

std::shared_ptr<Net> makeNet(bool withSkip = false, Device dev = Device::cuda()) {
  Generator g(5);
  auto net = std::make_shared<Net>(&g, withSkip);
  net->to(dev);
  return net;
}

void expectSameParameters(nn::Module& got, nn::Module& want, const std::string& what) {
  const auto gotParams = got.namedParameters();
  for (const auto& [name, p] : want.namedParameters()) {
    const Tensor* g = gotParams.find(name);
    ASSERT_NE(g, nullptr) << what << " " << name;
    testing::expectBitEqual(g->detach(), p.detach().to(Device::cpu()), what + " " + name);
  }
}

TEST(DdpCuda, TrainsBitForBitLikeThePlainModelOnTheGpu) {
  COHORT_REQUIRE_GPU();
  for (const char* backend : {"auto", "nccl"}) {  // "nccl" alone: the control tensors go to the GPU too
    SCOPED_TRACE(backend);
    auto pg = worldOfOne(backend);
    auto plain = makeNet();
    auto inner = makeNet();
    auto ddp = std::make_shared<DistributedDataParallel>(inner, pg, DDPOptions{.firstBucketCapMb = 0.001});
    EXPECT_GE(ddp->reducer().numBuckets(), 2u) << "more than one bucket, so bucket offsets are exercised";
    optim::SGD o1(plain->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::SGD o2(ddp->parameters(), {.lr = 0.05, .momentum = 0.9});
    std::vector<double> l1 = train(*plain, o1, 12);
    std::vector<double> l2 = train(*ddp, o2, 12);
    EXPECT_EQ(l2, l1) << "same losses, bit for bit";
    EXPECT_LT(l2.back(), l2.front());
    expectSameParameters(*inner, *plain, "parameter");
    for (const Tensor& p : inner->parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().device(), Device::cuda(0)) << "gradients (bucket views) live on the GPU";
    }
    EXPECT_TRUE(ddp->reducer().bucketsRebuilt()) << "the bucket rebuild's broadcast ran after the first backward";
  }
}

TEST(DdpCuda, FindUnusedParametersLeavesTheUnusedGradientUndefined) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne("nccl");
  auto net = makeNet(true);
  auto ddp = std::make_shared<DistributedDataParallel>(net, pg, DDPOptions{.findUnusedParameters = true});
  auto [x, y] = batch(0, Device::cuda());
  nn::functional::crossEntropy((*ddp)(x), y).backward();
  for (const auto& [name, p] : net->namedParameters()) {
    if (name.rfind("skip.", 0) == 0) EXPECT_FALSE(p.grad().defined()) << name << ": no rank used it";
    else EXPECT_TRUE(p.grad().defined()) << name;
  }
  net->useSkip = true;
  for (Tensor p : net->parameters()) p.setGrad(Tensor());
  nn::functional::crossEntropy((*ddp)(x), y).backward();
  for (const auto& [name, p] : net->namedParameters()) {
    if (name.rfind("b.", 0) == 0) EXPECT_FALSE(p.grad().defined()) << name << ": unused in this iteration";
    else EXPECT_TRUE(p.grad().defined()) << name;
  }
}

TEST(DdpCuda, ModulesOnTwoDevicesAndGroupsWithoutACudaBackendAreRefused) {
  COHORT_REQUIRE_GPU();
  auto net = makeNet();
  net->firstLayer().to(Device::cpu());
  try {
    DistributedDataParallel ddp(net, worldOfOne("auto"));
    FAIL() << "a module on two devices was accepted";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
  }
  try {
    DistributedDataParallel ddp(makeNet(), worldOfOne("gloo"));
    FAIL() << "a CUDA module was accepted by a gloo-only group";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

TEST(DdpCuda, PowerSgdOnGpuBucketsIsRefusedByName) {
  COHORT_REQUIRE_GPU();
  auto ddp = std::make_shared<DistributedDataParallel>(makeNet(), worldOfOne("auto"));
  ddp->registerCommHook(powerSGDHook({.startPowerSGDIter = 0}));
  auto [x, y] = batch(0, Device::cuda());
  try {
    nn::functional::crossEntropy((*ddp)(x), y).backward();
    FAIL() << "PowerSGD ran on GPU buckets";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("powerSGDHook"), std::string::npos) << e.what();
  }
}

TEST(FsdpCuda, TrainsBitForBitLikeThePlainModelAndFreesGatheredParameters) {
  COHORT_REQUIRE_GPU();
  auto pg = worldOfOne("auto");
  auto plain = makeNet();
  auto inner = makeNet();
  fsdp::FSDPOptions opts;
  opts.autoWrapPolicy = fsdp::wrapModuleTypes({"Linear"});
  auto model = std::make_shared<fsdp::FullyShardedDataParallel>(inner, pg, opts);
  EXPECT_EQ(model->parameters().front().device(), Device::cuda(0)) << "the shards live on the GPU";
  optim::SGD o1(plain->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD o2(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  std::vector<double> l1 = train(*plain, o1, 12);
  std::vector<double> l2 = train(*model, o2, 12);
  EXPECT_EQ(l2, l1) << "same losses, bit for bit";
  nn::StateDict full = fsdp::fullStateDict(*model);
  for (const auto& [name, p] : plain->namedParameters())
    testing::expectBitEqual(full.at(name).to(Device::cpu()), p.detach().to(Device::cpu()), "full state dict " + name);
}

// FSDP with bfloat16 compute parameters over float32 shards, 30 AdamW steps on `dev`; returns the
// losses, and checks the shards and that the gathered parameters are freed between steps.
std::vector<double> trainBf16Fsdp(Device dev) {
  auto pg = worldOfOne("auto");
  auto inner = makeNet(false, dev);
  fsdp::FSDPOptions opts;
  opts.autoWrapPolicy = fsdp::wrapModuleTypes({"Linear"});
  opts.mixedPrecision.paramDtype = DType::BFloat16;  // compute copies differ from the float32 shards
  auto model = std::make_shared<fsdp::FullyShardedDataParallel>(inner, pg, opts);
  optim::AdamW opt(model->parameters(), {.lr = 3e-3});
  std::vector<double> losses = train(*model, opt, 30, dev);
  for (const Tensor& s : model->parameters()) {
    EXPECT_EQ(s.dtype(), DType::Float32) << "float32 master shards";
    EXPECT_EQ(s.device(), dev);
  }
  // Between steps the bf16 full parameters are freed: the module's parameters hold no memory.
  for (const Tensor& p : inner->parameters()) EXPECT_TRUE(p.storage()->released());
  return losses;
}

TEST(FsdpCuda, Bf16ParametersGatherIntoFreedBuffersAndTrainAsOnTheCpu) {
  COHORT_REQUIRE_GPU();
  std::vector<double> gpu = trainBf16Fsdp(Device::cuda());
  std::vector<double> cpu = trainBf16Fsdp(Device::cpu());
  ASSERT_EQ(gpu.size(), cpu.size());
  // bfloat16 losses (8 bits of mantissa) from products summed in another order: a few parts in a
  // hundred apart at most.
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 3e-2 * cpu[i] + 1e-2) << "step " << i;
  EXPECT_LT(gpu.back(), 0.8 * gpu.front()) << "bf16 FSDP on the GPU learns";
  std::printf("loss first / last: gpu %.5f / %.5f, cpu %.5f / %.5f\n", gpu.front(), gpu.back(), cpu.front(),
              cpu.back());
}

TEST(FsdpCuda, ShardedCheckpointAndClippingWorkOnGpuShards) {
  COHORT_REQUIRE_GPU();
  const std::string dir = ::testing::TempDir() + "fsdp_cuda_ckpt";
  std::filesystem::remove_all(dir);
  auto make = [] {
    fsdp::FSDPOptions opts;
    opts.autoWrapPolicy = fsdp::wrapModuleTypes({"Linear"});
    return std::make_shared<fsdp::FullyShardedDataParallel>(makeNet(), worldOfOne("auto"), opts);
  };
  auto model = make();
  optim::AdamW opt(model->parameters(), {.lr = 3e-3});
  train(*model, opt, 3);
  auto [x, y] = batch(5, Device::cuda());
  nn::functional::crossEntropy((*model)(x), y).backward();
  const double norm = model->clipGradNorm(1e-3);  // through the group, on the shards' device
  EXPECT_GT(norm, 0.0);
  opt.zeroGrad();
  fsdp::saveShardedCheckpoint(*model, dir, &opt);
  auto restored = make();
  optim::AdamW opt2(restored->parameters(), {.lr = 3e-3});
  fsdp::loadShardedCheckpoint(*restored, dir, &opt2);
  auto a = model->parameters(), b = restored->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].device(), Device::cuda(0));
    testing::expectBitEqual(b[i].detach(), a[i].detach().to(Device::cpu()), "shard " + std::to_string(i));
  }
  // One more step each: equal optimizer state gives equal parameters.
  train(*model, opt, 1);
  train(*restored, opt2, 1);
  for (size_t i = 0; i < a.size(); ++i)
    testing::expectBitEqual(b[i].detach(), a[i].detach().to(Device::cpu()), "after a step, shard " + std::to_string(i));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort::dist
