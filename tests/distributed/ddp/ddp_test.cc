// DistributedDataParallel against a single process: N ranks (threads sharing a HashStore), each on
// its slice of the batch, must end every step with the parameters one process reaches on the
// whole batch (loss = the mean over ranks of each rank's mean loss), within float32 rounding —
// with several buckets, bucket rebuilding, noSync accumulation, unused parameters, comm hooks and
// uneven inputs under Join. And the errors: models that differ, a forgotten
// findUnusedParameters, a backward run twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>
#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/ddp/join.h>

#include <cohort/config.h>
#if COHORT_USE_SHM
#include <cohort/distributed/shm/shm_backend.h>
#endif

#include "distributed/pg_test_util.h"

namespace cohort::dist::testing {
namespace {

namespace F = nn::functional;

// fc1 -> tanh -> fc2 -> tanh -> fc3, plus `extra` (used when mode & 1) and `never` (never used).
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed, bool withBuffer = false, int64_t hidden = 12) : nn::Module("Net") {
    Generator g(seed);
    fc1 = registerModule("fc1", std::make_shared<nn::Linear>(6, hidden, true, &g));
    fc2 = registerModule("fc2", std::make_shared<nn::Linear>(hidden, hidden, true, &g));
    fc3 = registerModule("fc3", std::make_shared<nn::Linear>(hidden, 3, true, &g));
    extra = registerModule("extra", std::make_shared<nn::Linear>(hidden, 3, false, &g));
    never = registerParameter("never", randn({3}, {}, &g));
    if (withBuffer) counter = registerBuffer("counter", full({2}, static_cast<double>(seed % 7)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*fc2)((*fc1)(x).tanh()).tanh();
    Tensor out = (*fc3)(h);
    if (mode & 1) out = out + (*extra)(h);
    if (counter.defined()) {
      autograd::NoGradGuard ng;
      counter.add_(1.0);  // a buffer the forward changes, like BatchNorm's running stats
    }
    return out;
  }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3, extra;
  Tensor never, counter;
  int mode = 0;
};

Tensor inputs(int rank, int step, int micro) {
  Generator g(1000 + rank * 97 + step * 13 + micro);
  return randn({4, 6}, {}, &g);
}
Tensor targets(int rank, int step, int micro) {
  Generator g(5000 + rank * 97 + step * 13 + micro);
  return randn({4, 3}, {}, &g);
}

struct Scenario {
  int world = 2;
  int steps = 3;
  int micro = 1;  // micro-batches per step; all but the last under noSync
  DDPOptions options;
  std::function<CommHookPtr()> hook;            // null: the default all-reduce
  std::function<int(int rank, int step)> mode;  // the Net's mode for that rank and step
  std::function<int(int rank)> stepsOf;         // uneven inputs (run under Join) when set
  bool zeroToNone = true;
  bool withBuffer = false;
  int64_t hidden = 12;  // width of fc1/fc2; 128 makes buckets above shm's one-round allreduce size
};

struct Outcome {
  std::vector<std::vector<Tensor>> rankParams;  // per rank, module parameters in order
  std::vector<Tensor> reference;
  std::vector<std::vector<bool>> rankGradDefined;
  std::vector<bool> referenceGradDefined;
  std::vector<size_t> numBuckets;
  std::vector<char> rebuilt;                   // not vector<bool>: rank threads write their own entries concurrently
  std::vector<char> gradsShareStorage;         // some two parameters' .grad in one storage (bucket views)
  std::vector<uint64_t> registeredAllreduces;  // shm: allreduces run in place on shared buckets
};

int modeOf(const Scenario& s, int rank, int step) { return s.mode ? s.mode(rank, step) : 0; }
int stepsOf(const Scenario& s, int rank) { return s.stepsOf ? s.stepsOf(rank) : s.steps; }

Outcome runScenario(const Scenario& s, const std::string& backend = "gloo") {
  Outcome out;
  // Each rank starts from different weights: DDP's construction must copy rank 0's.
  std::vector<std::shared_ptr<Net>> nets;
  for (int r = 0; r < s.world; ++r) nets.push_back(std::make_shared<Net>(42 + r, s.withBuffer, s.hidden));
  auto ref = std::make_shared<Net>(42, s.withBuffer, s.hidden);
  out.rankParams.resize(s.world);
  out.rankGradDefined.resize(s.world);
  out.numBuckets.resize(s.world);
  out.rebuilt.resize(s.world);
  out.gradsShareStorage.resize(s.world);
  out.registeredAllreduces.resize(s.world);
  {
    ThreadWorld world(backend, s.world);
    world.run([&](int r) {
      auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
      auto ddp = std::make_shared<DistributedDataParallel>(nets[r], pg, s.options);
      if (s.hook) ddp->registerCommHook(s.hook());
      optim::SGD opt(ddp->parameters(), {.lr = 0.1, .momentum = 0.9});
      auto loop = [&] {
        for (int step = 0; step < stepsOf(s, r); ++step) {
          nets[r]->mode = modeOf(s, r, step);
          for (int m = 0; m < s.micro; ++m) {
            std::optional<DistributedDataParallel::NoSyncGuard> guard;
            if (m + 1 < s.micro) guard.emplace(ddp->noSync());
            F::mseLoss((*ddp)(inputs(r, step, m)), targets(r, step, m)).backward();
          }
          opt.step();
          opt.zeroGrad(s.zeroToNone);
        }
      };
      if (s.stepsOf) joinUneven(*ddp, loop);
      else loop();
      std::vector<const void*> storages;
      for (const Tensor& p : ddp->module().parameters()) {
        out.rankParams[r].push_back(p.detach().clone());
        out.rankGradDefined[r].push_back(p.grad().defined());
        if (p.grad().defined()) storages.push_back(p.grad().storage().get());
      }
      std::sort(storages.begin(), storages.end());
      out.gradsShareStorage[r] = std::adjacent_find(storages.begin(), storages.end()) != storages.end();
      out.numBuckets[r] = ddp->reducer().numBuckets();
      out.rebuilt[r] = ddp->reducer().bucketsRebuilt();
#if COHORT_USE_SHM
      if (auto* shmBackend = dynamic_cast<shm_backend::ShmBackend*>(&world.pg(r).backend(DeviceType::CPU)))
        out.registeredAllreduces[r] = shmBackend->registeredAllreduces();
#endif
    });
  }
  // The reference: one process, the loss of every rank's slice in one backward.
  optim::SGD opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  int maxSteps = 0;
  for (int r = 0; r < s.world; ++r) maxSteps = std::max(maxSteps, stepsOf(s, r));
  for (int step = 0; step < maxSteps; ++step) {
    Tensor loss;
    for (int r = 0; r < s.world; ++r) {
      if (step >= stepsOf(s, r)) continue;  // joined: contributes zeros, still counted in N
      ref->mode = modeOf(s, r, step);
      for (int m = 0; m < s.micro; ++m) {
        Tensor l = F::mseLoss((*ref)(inputs(r, step, m)), targets(r, step, m));
        loss = loss.defined() ? loss + l : l;
      }
    }
    (loss / static_cast<double>(s.world)).backward();
    opt.step();
    opt.zeroGrad(s.zeroToNone);
  }
  for (const Tensor& p : ref->parameters()) {
    out.reference.push_back(p.detach().clone());
    out.referenceGradDefined.push_back(p.grad().defined());
  }
  return out;
}

void expectMatchesReference(const Outcome& o, double tol) { expectRanksMatchReference(o.rankParams, o.reference, tol); }

constexpr double kFp32Tol = 2e-6;

std::vector<std::string> cpuBackends() {
  std::vector<std::string> out;
  for (const char* b : {"gloo", "shm"})
    if (hasBackend(b)) out.push_back(b);
  return out;
}

TEST(DDP, MatchesSingleProcessForTwoThreeAndFourRanks) {
  for (const std::string& backend : cpuBackends()) {
    for (int world : {2, 3, 4}) {
      SCOPED_TRACE(fmt::format("{}, world {}", backend, world));
      Scenario s;
      s.world = world;
      s.options.findUnusedParameters = true;  // Net has a parameter no forward uses
      Outcome o = runScenario(s, backend);
      expectMatchesReference(o, kFp32Tol);
      // The never-used parameter keeps no gradient on any rank, as in the single process (SGD
      // skips it).
      EXPECT_FALSE(o.referenceGradDefined[0]);
      for (int r = 0; r < world; ++r) EXPECT_FALSE(o.rankGradDefined[r][0]) << "rank " << r;
    }
  }
}

// Wide layers: buckets above shm's one-round size live in memory every rank maps, and their
// all-reduce runs in place there (no copy in or out). Rebuilt buckets get new shared buffers;
// noSync accumulates into them; the result must still be the single process's.
TEST(DDP, ShmBucketsInSharedMemoryAreReducedInPlaceAndMatch) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  for (int world : {2, 3}) {
    for (bool toNone : {true, false}) {
      SCOPED_TRACE(fmt::format("world {}, zeroGrad(setToNone = {})", world, toNone));
      Scenario s;
      s.world = world;
      s.steps = 4;
      s.micro = 2;
      s.hidden = 128;
      s.zeroToNone = toNone;
      s.options.staticGraph = true;  // unused parameters found once; buckets rebuilt after step 1
      s.options.bucketCapMb = 0.05;  // fc2's 64 KiB weight gets a bucket of its own
      Outcome o = runScenario(s, "shm");
      expectMatchesReference(o, 1e-5);
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(o.rebuilt[r]) << "rank " << r;
        // 4 steps with at least one bucket above 32 KiB each.
        EXPECT_GE(o.registeredAllreduces[r], 4u) << "rank " << r;
      }
    }
  }
  {
    // Uneven inputs under Join: a rank with no data shadows the others, including the bucket
    // rebuild, whose new shared buffers it must allocate with them (a collective on shm).
    SCOPED_TRACE("Join, a rank with no data, rebuilt buckets");
    Scenario s;
    s.world = 3;
    s.hidden = 128;
    s.options.staticGraph = true;
    s.options.bucketCapMb = 0.05;
    s.stepsOf = [](int rank) { return rank == 1 ? 0 : 3 + rank; };
    Outcome o = runScenario(s, "shm");
    expectMatchesReference(o, 1e-5);
    for (int r = 0; r < s.world; ++r) {
      EXPECT_TRUE(o.rebuilt[r]) << "rank " << r;
      EXPECT_GE(o.registeredAllreduces[r], 5u) << "rank " << r;
    }
  }
}

TEST(DDP, ManySmallBucketsAreRebuiltInReadyOrderAndStillMatch) {
  Scenario s;
  s.world = 3;
  s.steps = 4;
  s.options.staticGraph = true;        // unused parameters found once; buckets rebuilt
  s.options.bucketCapMb = 40.0 / 1e6;  // 40 bytes: about a bucket per parameter
  s.options.firstBucketCapMb = 10.0 / 1e6;
  Outcome o = runScenario(s);
  expectMatchesReference(o, kFp32Tol);
  for (int r = 0; r < s.world; ++r) {
    EXPECT_GE(o.numBuckets[r], 5u) << "rank " << r;
    EXPECT_TRUE(o.rebuilt[r]) << "rank " << r;
  }
}

// gradientAsBucketView = false: .grad stays each parameter's own tensor (copied into the bucket
// and back), with the same results through rebuilt buckets, noSync accumulation, parameters
// unused on some ranks and steps, and gradients kept between steps (zeroGrad to zeros).
TEST(DDP, GradientsOutsideTheBucketsGiveTheSameResults) {
  for (bool asView : {false, true}) {
    for (bool toNone : {true, false}) {
      SCOPED_TRACE(fmt::format("gradientAsBucketView {}, zeroGrad(setToNone = {})", asView, toNone));
      Scenario s;
      s.world = 3;
      s.steps = 4;
      s.micro = 2;
      s.zeroToNone = toNone;
      s.options.gradientAsBucketView = asView;
      s.options.findUnusedParameters = true;
      s.options.bucketCapMb = 200.0 / 1e6;
      s.options.firstBucketCapMb = 100.0 / 1e6;
      s.mode = [](int rank, int step) { return (rank + step) % 2; };
      Outcome o = runScenario(s);
      expectMatchesReference(o, kFp32Tol);
      for (int r = 0; r < s.world; ++r) {
        EXPECT_GE(o.numBuckets[r], 3u) << "rank " << r;
        // Kept gradients (zeroGrad to zeros) live in the buckets only as views.
        if (!toNone) {
          EXPECT_EQ(o.gradsShareStorage[r] != 0, asView) << "rank " << r;
        }
      }
    }
  }
}

TEST(DDP, NoSyncAccumulatesAndTheNextSyncReducesTheSum) {
  for (bool toNone : {true, false}) {
    SCOPED_TRACE(toNone ? "zeroGrad(setToNone)" : "zeroGrad(zeros)");
    Scenario s;
    s.world = 2;
    s.micro = 3;
    s.zeroToNone = toNone;
    s.options.findUnusedParameters = true;
    Outcome o = runScenario(s);
    expectMatchesReference(o, kFp32Tol);
  }
}

TEST(DDP, ParametersUnusedOnSomeRanksOrStepsGetTheAverageOfThoseThatUsedThem) {
  Scenario s;
  s.world = 3;
  s.steps = 4;
  s.options.findUnusedParameters = true;
  s.options.bucketCapMb = 400.0 / 1e6;
  s.mode = [](int rank, int step) { return (rank + step) % 2; };  // `extra` used by some ranks only
  Outcome o = runScenario(s);
  expectMatchesReference(o, kFp32Tol);
}

TEST(DDP, ExtraIsUnusedByEveryRankOnSomeStepsAndKeepsNoGradientThen) {
  Scenario s;
  s.world = 2;
  s.steps = 3;
  s.options.findUnusedParameters = true;
  s.mode = [](int, int step) { return step == 0 ? 1 : 0; };  // last step: nobody uses `extra`
  s.zeroToNone = true;
  Outcome o = runScenario(s);
  expectMatchesReference(o, kFp32Tol);
}

TEST(DDP, BuffersFollowRankZeroAtEveryForward) {
  Scenario s;
  s.world = 3;
  s.withBuffer = true;
  s.options.findUnusedParameters = true;
  ThreadWorld world("gloo", 3);
  std::vector<double> seen(3);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    auto net = std::make_shared<Net>(10 + r, true);  // counters start at 3, 4, 5
    DistributedDataParallel ddp(net, pg, s.options);
    for (int i = 0; i < 2; ++i) {
      net->counter.add_(static_cast<double>(r) * 100);  // diverge locally; forward resyncs
      (void)ddp(inputs(r, 0, i));
    }
    seen[r] = net->counter.toVector<float>()[0];
  });
  // Rank 0's counter: 3, +1 per forward, re-broadcast before each forward.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(seen[r], 5.0) << "rank " << r;
}

TEST(DDP, CommHooks) {
  {
    SCOPED_TRACE("a user hook (sum, then divide in then()) is exact");
    Scenario s;
    s.world = 3;
    s.options.findUnusedParameters = true;
    s.hook = [] {
      return makeCommHook("sum_then_divide", [](ProcessGroup& pg, GradBucket& b) {
        int n = pg.size();
        return firstOutput(pg.allreduce(b.buffer)).then([n](Future<Tensor> f) {
          Tensor t = f.value();
          t.div_(static_cast<double>(n));
          return t;
        });
      });
    };
    expectMatchesReference(runScenario(s), kFp32Tol);
  }
  for (auto [name, make, tol] :
       {std::tuple{"fp16", &fp16CompressHook, 3e-3}, std::tuple{"bf16", &bf16CompressHook, 3e-2}}) {
    SCOPED_TRACE(name);
    Scenario s;
    s.world = 2;
    s.options.findUnusedParameters = true;
    s.hook = make;
    Outcome o = runScenario(s);
    // Bounded error: one rounding of each gradient (relative 2^-11 / 2^-8), over 3 steps of lr 0.1.
    expectMatchesReference(o, tol);
    double worst = 0;
    for (size_t i = 0; i < o.reference.size(); ++i)
      worst = std::max(worst, maxDiff(o.rankParams[0][i], o.reference[i]));
    EXPECT_GT(worst, 0.0) << "compression changed nothing: is the hook running?";
  }
}

TEST(DDP, UnevenInputsUnderJoinFinishAndMatch) {
  for (const std::string& backend : cpuBackends()) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(fmt::format("{}, world {}", backend, world));
      Scenario s;
      s.world = world;
      s.options.findUnusedParameters = true;
      s.stepsOf = [](int rank) { return 2 + 2 * rank; };  // rank 0 joins first, rank N-1 last
      expectMatchesReference(runScenario(s, backend), kFp32Tol);
    }
  }
  {
    SCOPED_TRACE("a rank with no data at all, rebuilt buckets, a buffer");
    Scenario s;
    s.world = 3;
    s.options.staticGraph = true;
    s.options.bucketCapMb = 300.0 / 1e6;
    s.stepsOf = [](int rank) { return rank == 1 ? 0 : 3 + rank; };
    expectMatchesReference(runScenario(s), kFp32Tol);
  }
}

TEST(DDP, JoinWithThrowOnEarlyTerminationFailsEveryRank) {
  ThreadWorld world("gloo", 2);
  std::vector<std::string> errors(2);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    auto net = std::make_shared<Net>(1);
    DistributedDataParallel ddp(net, pg, {.findUnusedParameters = true});
    try {
      joinUneven(ddp,
                 [&] {
                   for (int step = 0; step < 1 + 2 * r; ++step)
                     F::mseLoss(ddp(inputs(r, step, 0)), targets(r, step, 0)).backward();
                 },
                 {.throwOnEarlyTermination = true});
    } catch (const DistError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank(s) [0] ran out of inputs"), std::string::npos) << errors[r];
}

// ---- errors ---------------------------------------------------------------------------------

class Wide : public nn::Module {
 public:
  explicit Wide(int64_t hidden) : nn::Module("Wide") {
    fc1 = registerModule("fc1", std::make_shared<nn::Linear>(4, hidden));
    fc2 = registerModule("fc2", std::make_shared<nn::Linear>(hidden, 2));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*fc1)(x)); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

TEST(DDP, DifferentModelsNameTheFirstDifferingParameterOnEveryRank) {
  ThreadWorld world("gloo", 3);
  std::vector<std::string> errors(3);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    try {
      DistributedDataParallel ddp(std::make_shared<Wide>(r == 2 ? 5 : 8), pg);
    } catch (const ValueError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(errors[r]);
    EXPECT_NE(errors[r].find(
                  "parameter #0 is 'module.fc1.weight' [8, 4] float32 on rank 0 but 'module.fc1.weight' [5, 4] float32 "
                  "on rank 2"),
              std::string::npos);
    EXPECT_NE(errors[r].find("ranks [2] differ from rank 0"), std::string::npos);
  }
}

TEST(DDP, AnUnusedParameterWithoutFindUnusedParametersIsNamedNotAHang) {
  ThreadWorld world("gloo", 2, Millis(10'000));
  std::vector<std::string> errors(2);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    auto net = std::make_shared<Net>(3);
    DistributedDataParallel ddp(net, pg);
    try {
      F::mseLoss(ddp(inputs(r, 0, 0)), targets(r, 0, 0)).backward();
    } catch (const ValueError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(errors[r]);
    EXPECT_NE(errors[r].find("2 parameter(s) received no gradient"), std::string::npos);
    EXPECT_NE(errors[r].find("'module.extra.weight'"), std::string::npos);
    EXPECT_NE(errors[r].find("'module.never'"), std::string::npos);
    EXPECT_NE(errors[r].find("findUnusedParameters = true"), std::string::npos);
  }
}

TEST(DDP, BackwardTwiceAfterOneForwardIsAnError) {
  ThreadWorld world("gloo", 2);
  std::vector<std::string> errors(2);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    auto net = std::make_shared<Wide>(4);
    DistributedDataParallel ddp(net, pg);
    Tensor loss = ddp(inputs(r, 0, 0).narrow(1, 0, 4)).sum();
    loss.backward(Tensor(), /*retainGraph=*/true);
    try {
      loss.backward();  // would accumulate gradients no rank reduces: the ranks would drift apart
    } catch (const ValueError& e) {
      errors[r] = e.what();
    }
    // The next forward and backward work again.
    ddp(inputs(r, 1, 0).narrow(1, 0, 4)).sum().backward();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("a second backward after one forward"), std::string::npos) << errors[r];
}

TEST(DDP, CommHookAfterTheFirstBackwardIsRejected) {
  ThreadWorld world("gloo", 2);
  std::vector<std::string> errors(2);
  world.run([&](int r) {
    auto pg = std::shared_ptr<ProcessGroup>(&world.pg(r), [](ProcessGroup*) {});
    DistributedDataParallel ddp(std::make_shared<Wide>(4), pg);
    ddp(inputs(r, 0, 0).narrow(1, 0, 4)).sum().backward();
    try {
      ddp.registerCommHook(fp16CompressHook());
    } catch (const ValueError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("before the first backward"), std::string::npos) << errors[r];
}

TEST(DDP, BucketAssignment) {
  std::vector<Tensor> ps = {zeros({10}), zeros({10}), zeros({100}), zeros({5}, {.dtype = DType::Float64}),
                            zeros({3}),  zeros({30})};
  // Caps in bytes: first 60, then 200. A bucket closes once it holds at least its cap.
  auto b = assignBuckets(ps, {0, 1, 2, 4, 3, 5}, 60, 200);
  // [0, 1] (80 B: passes 60, closes), [2] (400 B), [4] (12 B, closed by the dtype change),
  // [3] (float64), [5] (120 B, the end).
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(b[1], (std::vector<size_t>{2}));
  EXPECT_EQ(b[2], (std::vector<size_t>{4}));
  EXPECT_EQ(b[3], (std::vector<size_t>{3}));
  EXPECT_EQ(b[4], (std::vector<size_t>{5}));
  // The benchmark's MLP 784-1024-1024-10 (bench/ddp.cc) with the default caps (1 and 25 MiB), reverse order:
  // fc3 and fc2 (4.2 MB) in the first bucket, fc1 (3.2 MB) in the second, as PyTorch.
  std::vector<Tensor> mlp = {zeros({1024, 784}), zeros({1024}),     zeros({1024, 1024}),
                             zeros({1024}),      zeros({10, 1024}), zeros({10})};
  auto m = assignBuckets(mlp, {5, 4, 3, 2, 1, 0}, 1 << 20, 25 << 20);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::vector<size_t>{5, 4, 3, 2}));
  EXPECT_EQ(m[1], (std::vector<size_t>{1, 0}));
}

TEST(DDP, RejectsBadOptions) {
  ThreadWorld world("gloo", 1);
  auto pg = std::shared_ptr<ProcessGroup>(&world.pg(0), [](ProcessGroup*) {});
  EXPECT_THROW(DistributedDataParallel(std::make_shared<Wide>(4), pg, {.bucketCapMb = 0}), ValueError);
  EXPECT_THROW(DistributedDataParallel(nullptr, pg), ValueError);
}

TEST(AutogradEngine, QueuedCallbacksRunAtTheEndOfBackwardInOrder) {
  Tensor w = ones({2}).setRequiresGrad();
  std::vector<std::string> log;
  w.registerPostAccumulateGradHook([&](Tensor&) {
    log.push_back("hook");
    autograd::queueCallback([&] {
      log.push_back("first");
      autograd::queueCallback([&] { log.push_back("queued by a callback"); });
    });
    autograd::queueCallback([&] { log.push_back("second"); });
  });
  (w * 3.0).sum().backward();
  EXPECT_EQ(log, (std::vector<std::string>{"hook", "first", "second", "queued by a callback"}));
  EXPECT_FALSE(autograd::inBackward());
  EXPECT_THROW(autograd::queueCallback([] {}), ValueError);
}

}  // namespace
}  // namespace cohort::dist::testing
