// FSDP state dicts and sharded checkpoints: the full state dict loads into a plain module (also
// through a safetensors file) and back; a sharded checkpoint written by N ranks (parameters and
// AdamW state) loads into M ranks, for every N, M in {1, 2, 3, 4}, and training continues exactly
// as one process would; a checkpoint of another model, a missing, damaged or foreign shard file is
// a CheckpointError naming the problem, with the model and optimizer left as they were.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/io/safetensors.h>
#include <cohort/core/util/error.h>
#include <cohort/fsdp/state_dict.h>

#include "core/test_util.h"
#include "distributed/store/store_test_util.h"  // TempDir
#include "fsdp/fsdp_test_util.h"

namespace cohort::fsdp::testing {
namespace {

namespace fs = std::filesystem;
using dist::testing::TempDir;
using dist::testing::ThreadWorld;

// The global batch of a step: 12 rows, so 1, 2, 3 and 4 ranks each take an equal slice and the
// mean over ranks of their mean losses is the mean loss of the whole batch.
Tensor globalX(int step) {
  Generator g(700 + step);
  return randn({12, 6}, {}, &g);
}
Tensor globalY(int step) {
  Generator g(900 + step);
  return randn({12, 3}, {}, &g);
}
Tensor sliceOf(const Tensor& t, int r, int world) { return t.narrow(0, r * (12 / world), 12 / world); }

FSDPOptions blockUnits() { return {.autoWrapPolicy = wrapModuleTypes({"Block"})}; }

// `world` FSDP ranks over Net(seed + r) (rank 0's weights win), AdamW; loads `loadDir` first
// when set, trains steps [from, to), saves to `saveDir` when set. Returns rank 0's full state dict.
// With bf16Masters the model is stored in bfloat16 and the optimizer keeps float32 master weights.
nn::StateDict trainFsdp(int world, int from, int to, const std::string& loadDir, const std::string& saveDir,
                        uint64_t seed = 42, bool bf16Masters = false) {
  nn::StateDict result;
  ThreadWorld tw("gloo", world);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(seed + r);
    if (bf16Masters) net->to(DType::BFloat16);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), blockUnits());
    auto opt = makeOptimizer(/*adamw=*/true, f.parameters());
    if (bf16Masters) opt->setMasterWeights();
    if (!loadDir.empty()) loadShardedCheckpoint(f, loadDir, opt.get());
    for (int step = from; step < to; ++step) {
      opt->zeroGrad();
      const Tensor x = sliceOf(globalX(step), r, world).to(net->parameters().front().dtype());
      F::mseLoss(f(x).to(DType::Float32), sliceOf(globalY(step), r, world)).backward();
      opt->step();
    }
    if (bf16Masters && from < to) {
      for (const Tensor& shard : f.parameters()) {
        EXPECT_EQ(opt->state(shard)->tensors.at("master").dtype(), DType::Float32) << "rank " << r;
      }
    }
    if (!saveDir.empty()) saveShardedCheckpoint(f, saveDir, opt.get());
    nn::StateDict sd = fullStateDict(f, {.rank0Only = true});
    if (r == 0) result = sd;
    else EXPECT_EQ(sd.size(), 0u) << "rank0Only: rank " << r << " gets nothing";
  });
  return result;
}

nn::StateDict referenceAfter(int steps) {
  auto net = std::make_shared<Net>(42);
  auto opt = makeOptimizer(/*adamw=*/true, net->parameters());
  for (int step = 0; step < steps; ++step) {
    opt->zeroGrad();
    F::mseLoss((*net)(globalX(step)), globalY(step)).backward();
    opt->step();
  }
  nn::StateDict out;
  for (const auto& [k, v] : net->stateDict()) out.insert(k, v.detach().clone());
  return out;
}

void expectClose(const nn::StateDict& a, const nn::StateDict& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [k, v] : a) {
    const Tensor* w = b.find(k);
    ASSERT_NE(w, nullptr) << what << ": " << k;
    ASSERT_EQ(v.sizes(), w->sizes()) << what << ": " << k;
    EXPECT_LE((v - *w).abs().max().item<double>(), tol) << what << ": " << k;
  }
}

TEST(FSDPStateDict, FullStateDictHasThePlainModulesKeysAndLoadsIntoIt) {
  TempDir dir;
  nn::StateDict sd = trainFsdp(3, 0, 2, "", "");
  nn::StateDict ref = referenceAfter(2);
  std::vector<std::string> keys, refKeys;
  for (const auto& [k, v] : sd) keys.push_back(k);
  for (const auto& [k, v] : ref) refKeys.push_back(k);
  EXPECT_EQ(keys, refKeys);
  expectClose(sd, ref, kFp32Tol, "full state dict vs one process");
  // Through a safetensors file into a plain, non-distributed module.
  io::saveSafetensors(dir.file("full.safetensors"), sd);
  auto plain = std::make_shared<Net>(7);
  plain->loadStateDict(io::loadSafetensors(dir.file("full.safetensors")).tensors);
  nn::StateDict back;
  for (const auto& [k, v] : plain->stateDict()) back.insert(k, v.detach().clone());
  expectClose(back, sd, 0.0, "plain module after loading the file");
}

TEST(FSDPStateDict, LoadFullStateDictWritesEachRanksShard) {
  auto source = std::make_shared<Net>(7);
  nn::StateDict want = source->stateDict();
  ThreadWorld tw("gloo", 3);
  tw.run([&](int r) {
    auto net = std::make_shared<Net>(42);
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), blockUnits());
    loadFullStateDict(f, want);
    expectClose(fullStateDict(f), want, 0.0, fmt::format("rank {}", r));
    // A dict of another shape: a ValueError naming the key, and nothing written.
    nn::StateDict bad;
    for (const auto& [k, v] : want) bad.insert(k, k == "head.weight" ? zeros({4, 5}) : v);
    try {
      loadFullStateDict(f, bad);
      ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("'head.weight' has shape [4, 5]"), std::string::npos) << e.what();
    }
    expectClose(fullStateDict(f), want, 0.0, fmt::format("rank {} after the rejected load", r));
  });
}

TEST(FSDPStateDict, TiedWeightsAppearUnderBothNames) {
  ThreadWorld tw("gloo", 2);
  tw.run([&](int r) {
    Generator g(5);
    auto gpt = std::make_shared<nn::GPT>(tinyGpt(), &g);
    FullyShardedDataParallel f(gpt, borrow(tw.pg(r)), {.autoWrapPolicy = wrapModuleTypes({"TransformerBlock"})});
    nn::StateDict sd = fullStateDict(f);
    ASSERT_TRUE(sd.contains("lm_head.weight"));
    ASSERT_TRUE(sd.contains("transformer.wte.weight"));
    EXPECT_EQ((sd.at("lm_head.weight") - sd.at("transformer.wte.weight")).abs().max().item<double>(), 0.0);
    Generator g2(5);
    nn::GPT plain(tinyGpt(), &g2);
    for (const auto& [k, v] : plain.stateDict()) EXPECT_EQ((sd.at(k) - v).abs().max().item<double>(), 0.0) << k;
  });
}

TEST(FSDPStateDict, ShardedCheckpointOfNRanksResumesOnMRanksAsOneProcess) {
  nn::StateDict ref = referenceAfter(4);
  for (int n : {1, 2, 3, 4}) {
    TempDir dir;
    trainFsdp(n, 0, 2, "", dir.file("ckpt"));
    for (int i = 0; i < n; ++i) EXPECT_TRUE(fs::exists(shardFileName(dir.file("ckpt"), i, n)));
    for (int m : {1, 2, 3, 4}) {
      SCOPED_TRACE(fmt::format("saved by {} ranks, resumed on {}", n, m));
      // Different starting weights: everything must come from the checkpoint.
      nn::StateDict sd = trainFsdp(m, 2, 4, dir.file("ckpt"), "", /*seed=*/1234);
      expectClose(sd, ref, 1e-5, fmt::format("{} -> {}", n, m));
    }
  }
}

// A bfloat16 model's float32 master weights are optimizer state like the moments: saved with the
// shards and resharded on load. Resumed on the same world size, training continues bit for bit
// as if never stopped (masters rebuilt from the bfloat16 shards would lose the bits below them);
// on another world size it stays within bf16 rounding of that run.
TEST(FSDPStateDict, ShardedCheckpointCarriesABFloat16ModelsMasterWeights) {
  TempDir dir;
  const nn::StateDict straight = trainFsdp(2, 0, 4, "", "", 42, /*bf16Masters=*/true);
  trainFsdp(2, 0, 2, "", dir.file("ckpt"), 42, /*bf16Masters=*/true);
  const nn::StateDict resumed = trainFsdp(2, 2, 4, dir.file("ckpt"), "", 1234, /*bf16Masters=*/true);
  for (const auto& [k, v] : straight) {
    ASSERT_NE(resumed.find(k), nullptr) << k;
    EXPECT_EQ(v.dtype(), DType::BFloat16) << k;
    EXPECT_TRUE(cohort::testing::sameBits(*resumed.find(k), v)) << k;
  }
  const nn::StateDict onThree = trainFsdp(3, 2, 4, dir.file("ckpt"), "", 1234, /*bf16Masters=*/true);
  expectClose(onThree, straight, 2e-2, "2 -> 3 ranks");
}

// Runs `world` ranks that each build FSDP over `makeNet()`, then try to load `dir`: every rank must
// get a CheckpointError whose message contains `needle`, and keep its parameters and AdamW state.
void expectRejected(int world, const std::string& dir, const std::string& needle,
                    const std::function<nn::ModulePtr()>& makeNet) {
  ThreadWorld tw("gloo", world);
  tw.run([&](int r) {
    auto net = makeNet();
    FullyShardedDataParallel f(net, borrow(tw.pg(r)), blockUnits());
    auto opt = makeOptimizer(true, f.parameters());
    opt->zeroGrad();
    F::mseLoss(f(sliceOf(globalX(0), r, world)).narrow(1, 0, 3), sliceOf(globalY(0), r, world)).backward();
    opt->step();
    nn::StateDict before = fullStateDict(f);
    auto optBefore = opt->stateDict();
    try {
      loadShardedCheckpoint(f, dir, opt.get());
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "rank " << r << ": " << e.what();
    }
    expectClose(fullStateDict(f), before, 0.0, fmt::format("rank {} after the rejected load", r));
    auto optAfter = opt->stateDict();
    for (const auto& [k, v] : optBefore.tensors)
      EXPECT_EQ((optAfter.tensors.at(k) - v).abs().max().item<double>(), 0.0) << k;
  });
}

// Net with a wider head: same names, one shape differs.
class WideNet : public nn::Module {
 public:
  WideNet() : nn::Module("Net") {
    Generator g(3);
    registerModule("inp", std::make_shared<nn::Linear>(6, kD, true, &g));
    for (int i = 0; i < 3; ++i) registerModule(fmt::format("b{}", i), std::make_shared<Block>(&g));
    registerModule("head", std::make_shared<nn::Linear>(kD, 4, true, &g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*child("inp"))(x);
    for (int i = 0; i < 3; ++i) h = (*child(fmt::format("b{}", i)))(h);
    return (*child("head"))(h);
  }
};

TEST(FSDPStateDict, BadCheckpointsAreCheckpointErrorsAndChangeNothing) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  trainFsdp(3, 0, 1, "", ckpt);
  auto net = [] { return std::make_shared<Net>(11); };

  {
    SCOPED_TRACE("a different model");
    expectRejected(2, ckpt, "parameter 'head.weight' has shape [3, 5] in the checkpoint, [4, 5] in the model",
                   [] { return std::make_shared<WideNet>(); });
  }
  {
    SCOPED_TRACE("a damaged byte in the tensor data");
    TempDir d2;
    fs::copy(ckpt, d2.file("c"));
    const std::string victim = shardFileName(d2.file("c"), 1, 3);
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-3, std::ios::end);
    char c = 0;
    file.read(&c, 1);
    file.seekp(-3, std::ios::end);
    c ^= 0x10;
    file.write(&c, 1);
    file.close();
    expectRejected(2, d2.file("c"), "shard-1-of-3.safetensors: the tensor data does not match the checksum", net);
  }
  {
    SCOPED_TRACE("a truncated file");
    TempDir d3;
    fs::copy(ckpt, d3.file("c"));
    const std::string victim = shardFileName(d3.file("c"), 2, 3);
    fs::resize_file(victim, fs::file_size(victim) - 10);
    expectRejected(4, d3.file("c"), "shard-2-of-3.safetensors", net);
  }
  {
    SCOPED_TRACE("a missing shard");
    TempDir d4;
    fs::copy(ckpt, d4.file("c"));
    fs::remove(shardFileName(d4.file("c"), 1, 3));
    expectRejected(2, d4.file("c"), "shard-1-of-3.safetensors is missing (2 of 3 shard files present)", net);
  }
  {
    SCOPED_TRACE("shard files of two checkpoints in one folder");
    TempDir d5;
    fs::copy(ckpt, d5.file("c"));
    fs::copy_file(shardFileName(ckpt, 0, 3), shardFileName(d5.file("c"), 0, 2));
    expectRejected(2, d5.file("c"), "shard files of two checkpoints (of 2 and of 3 shards)", net);
  }
  {
    SCOPED_TRACE("no checkpoint at all");
    expectRejected(2, dir.file("nowhere"), "no such folder", net);
  }
  // Saving again with another world size replaces the old shards instead of mixing with them.
  trainFsdp(2, 0, 1, "", ckpt);
  EXPECT_FALSE(fs::exists(shardFileName(ckpt, 0, 3)));
  EXPECT_TRUE(fs::exists(shardFileName(ckpt, 1, 2)));
}

}  // namespace
}  // namespace cohort::fsdp::testing
