// Errors where a new user got stuck say what is wrong and what to do:
// - a tensor that a safetensors file or a checkpoint does not hold names the file and the tensor;
// - a DistributedDataParallel state dict ("module." on every key) loaded into the bare model says
//   so and how to strip the prefix (nn::stripPrefix), and the other way round;
// - a bad COHORT_CPU_ALLOCATOR_CACHE_MB or COHORT_CPU_HUGE_PAGES is a ValueError naming it (checked
//   in a child process of this binary, whose allocator is made after the variable is set).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>

#include "core/test_util.h"
#include "temp_dir.h"

using namespace cohort;
using cohort::testing::contains;
using cohort::testing::messageOf;
using cohort::testing::runChild;

namespace {

TEST(UserErrors, ATensorMissingFromASafetensorsFileNamesTheFileAndTheTensor) {
  cohort::testing::TempDir dir;
  const std::string path = dir.file("data.safetensors");
  io::saveSafetensors(path, {{"x0", zeros({2})}, {"y0", ones({2})}});
  io::SafetensorsContents c = io::loadSafetensors(path);
  std::string msg = messageOf<IndexError>([&] { c.tensors.at("batches"); });
  EXPECT_EQ(msg, "safetensors file '" + path + "' has no tensor 'batches' (it has 2: x0, y0)");
  // operator[] and a copy of the dict say the same.
  io::TensorDict copy = c.tensors;
  EXPECT_EQ(messageOf<IndexError>([&] { copy["batches"]; }), msg);
  // Bytes parsed in memory name what the caller called them.
  io::SafetensorsContents m = io::parseSafetensors(io::serializeSafetensors({{"w", zeros({1})}}), "the upload");
  EXPECT_EQ(messageOf<IndexError>([&] { m.tensors.at("b"); }),
            "safetensors 'the upload' has no tensor 'b' (it has 1: w)");
  // A dict nobody described still names the key and lists what it has.
  nn::StateDict plain;
  EXPECT_EQ(messageOf<IndexError>([&] { plain.at("k"); }), "OrderedDict has no key 'k' (it is empty)");
}

TEST(UserErrors, ATensorMissingFromACheckpointNamesTheCheckpoint) {
  cohort::testing::TempDir dir;
  Generator g(1);
  nn::Linear lin(3, 2, true, &g);
  io::TrainingState st{.model = lin.stateDict(), .step = 4};
  st.extraTensors["ema"].insert("weight", zeros({2, 3}));
  const std::string file = io::saveCheckpoint(dir.file("ckpt/"), st);
  io::TrainingState back = io::loadCheckpoint(file);
  EXPECT_EQ(messageOf<IndexError>([&] { back.model.at("head.weight"); }),
            "the model state of checkpoint '" + file + "' has no tensor 'head.weight' (it has 2: weight, bias)");
  EXPECT_EQ(messageOf<IndexError>([&] { back.extraTensors.at("ema").at("bias"); }),
            "extra tensor group 'ema' of checkpoint '" + file + "' has no tensor 'bias' (it has 1: weight)");
}

// A model with two layers, and the same model as DDP's state dict shows it.
std::shared_ptr<nn::Sequential> makeNet(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(4, 3, true, &g), nn::Tanh(), nn::Linear(3, 2, true, &g));
}

nn::StateDict withPrefix(const nn::StateDict& d) {
  nn::StateDict out;
  for (const auto& [k, v] : d) out.insert("module." + k, v);
  return out;
}

TEST(UserErrors, ADdpStateDictLoadedIntoTheBareModelSaysToStripThePrefix) {
  auto source = makeNet(1), bare = makeNet(2);
  nn::StateDict ddpDict = withPrefix(source->stateDict());
  std::string msg = messageOf<ValueError>([&] { bare->loadStateDict(ddpDict); });
  EXPECT_TRUE(contains(msg, "every key of the dict carries the prefix \"module.\" (e.g. 'module.0.weight' for the "
                            "model's '0.weight')"))
      << msg;
  EXPECT_TRUE(contains(msg, "nn::stripPrefix(dict, \"module.\")")) << msg;
  EXPECT_TRUE(contains(msg, "nothing was loaded")) << msg;
  EXPECT_NE((bare->stateDict().at("0.weight") - source->stateDict().at("0.weight")).abs().max().item<double>(), 0.0);

  // The helper makes it load, and the values arrive.
  nn::StateDict stripped = nn::stripPrefix(ddpDict);
  EXPECT_EQ(stripped.keys(), source->stateDict().keys());
  bare->loadStateDict(stripped);
  for (const auto& [k, v] : source->stateDict())
    EXPECT_EQ((bare->stateDict().at(k) - v).abs().max().item<double>(), 0.0) << k;

  // The other way round: a bare dict into a model whose keys carry the prefix.
  auto wrapper = std::make_shared<nn::Module>("Wrapper");
  wrapper->registerModule("module", makeNet(3));
  std::string back = messageOf<ValueError>([&] { wrapper->loadStateDict(source->stateDict()); });
  EXPECT_TRUE(contains(back, "every key of this model carries the prefix \"module.\" (e.g. 'module.0.weight')"))
      << back;
  EXPECT_TRUE(contains(back, "load the dict into ddp.module() instead")) << back;

  // Unrelated mismatches keep the plain message.
  nn::StateDict partial;
  partial.insert("0.weight", source->stateDict().at("0.weight"));
  std::string plain = messageOf<ValueError>([&] { bare->loadStateDict(partial); });
  EXPECT_FALSE(contains(plain, "prefix")) << plain;
  EXPECT_TRUE(contains(plain, "missing keys: [0.bias, 2.weight, 2.bias]")) << plain;
}

TEST(UserErrors, StripPrefixKeepsOtherKeysAndRefusesCollisions) {
  nn::StateDict d;
  d.insert("module.a", zeros({1}));
  d.insert("b", ones({1}));
  nn::StateDict s = nn::stripPrefix(d);
  EXPECT_EQ(s.keys(), (std::vector<std::string>{"a", "b"}));
  d.insert("a", ones({1}));
  EXPECT_EQ(messageOf<ValueError>([&] { nn::stripPrefix(d); }),
            "stripPrefix(\"module.\"): keys 'module.a' and 'a' both become 'a'");
  EXPECT_EQ(nn::stripPrefix(d, "mod.").keys(), d.keys());
}

// ---- COHORT_CPU_ALLOCATOR_CACHE_MB, in child processes of this binary -------------------------

// Run only by the tests below, in a child whose environment they set: prints how the first
// allocation went.
TEST(UserErrorsChild, DISABLED_FirstAllocation) {
  try {
    Tensor t = zeros({1 << 20});
    const bool hugeAligned = reinterpret_cast<uintptr_t>(t.dataPtr()) % (uintptr_t{2} << 20) == 0;
    std::printf("ALLOCATED %.0f ON A 2 MIB BOUNDARY %d\n", t.sum().item<double>(), hugeAligned ? 1 : 0);
  } catch (const ValueError& e) {
    std::printf("VALUEERROR %s\n", e.what());
  }
}

TEST(UserErrors, ABadCpuAllocatorCacheSizeIsAValueErrorNamingTheVariable) {
  auto [status, out] = runChild("COHORT_CPU_ALLOCATOR_CACHE_MB=lots", "UserErrorsChild.DISABLED_FirstAllocation");
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "VALUEERROR environment variable COHORT_CPU_ALLOCATOR_CACHE_MB='lots' is not an integer"))
      << out;
  std::tie(status, out) = runChild("COHORT_CPU_ALLOCATOR_CACHE_MB=-5", "UserErrorsChild.DISABLED_FirstAllocation");
  EXPECT_TRUE(contains(out, "VALUEERROR environment variable COHORT_CPU_ALLOCATOR_CACHE_MB='-5' must be a size in "
                            "MiB from 0"))
      << out;
  for (const char* good : {"COHORT_CPU_ALLOCATOR_CACHE_MB=0", "COHORT_CPU_ALLOCATOR_CACHE_MB=64"}) {
    std::tie(status, out) = runChild(good, "UserErrorsChild.DISABLED_FirstAllocation");
    EXPECT_TRUE(contains(out, "ALLOCATED 0")) << good << ": " << out;
  }
}

TEST(UserErrors, CpuHugePagesTakesAYesOrNoAndOffGivesOrdinaryBlocks) {
  auto [status, out] = runChild("COHORT_CPU_HUGE_PAGES=maybe", "UserErrorsChild.DISABLED_FirstAllocation");
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(contains(out, "VALUEERROR environment variable COHORT_CPU_HUGE_PAGES='maybe' is not a boolean")) << out;
  std::tie(status, out) = runChild("COHORT_CPU_HUGE_PAGES=0", "UserErrorsChild.DISABLED_FirstAllocation");
  EXPECT_TRUE(contains(out, "ALLOCATED 0 ON A 2 MIB BOUNDARY 0")) << out;
  std::tie(status, out) = runChild("COHORT_CPU_HUGE_PAGES=1", "UserErrorsChild.DISABLED_FirstAllocation");
  EXPECT_TRUE(contains(out, "ALLOCATED 0 ON A 2 MIB BOUNDARY 1")) << out;
}

}  // namespace
