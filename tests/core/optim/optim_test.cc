// Optimizers, LR schedules and gradient clipping against PyTorch 1.13.
//
// Reference numbers were produced once with /usr/bin/python3 (torch 1.13) by the script
// described next to each table: parameters P0 [6] and P1 [2, 3] below, loss
//   sum(P0*P0*C0 + P0*D0) + sum(P1*P1*C1 + P1*D1)
// five times: zero_grad, backward, step; the final parameters are printed with 9 digits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include <cohort/cohort.h>
#include <cohort/core/optim/optim.h>

#include "core/test_util.h"

using namespace cohort;
using namespace cohort::optim;

namespace {

const std::vector<float> kP0 = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f, 1.1f};
const std::vector<float> kP1 = {0.2f, -0.4f, 0.9f, -1.5f, 0.05f, 0.6f};
const std::vector<float> kC0 = {0.3f, 0.1f, -0.2f, 0.5f, 0.25f, -0.05f};
const std::vector<float> kD0 = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f};
const std::vector<float> kC1 = {0.2f, 0.4f, -0.1f, 0.3f, -0.3f, 0.15f};
const std::vector<float> kD1 = {0.05f, 0.0f, -0.1f, 0.2f, 0.1f, -0.25f};

struct Problem {
  Tensor p0 = fromVector<float>(kP0).setRequiresGrad();
  Tensor p1 = fromVector<float>(kP1, {2, 3}).setRequiresGrad();
  Tensor c0 = fromVector<float>(kC0), d0 = fromVector<float>(kD0);
  Tensor c1 = fromVector<float>(kC1, {2, 3}), d1 = fromVector<float>(kD1, {2, 3});

  void backward() {
    Tensor loss = (p0 * p0 * c0 + p0 * d0).sum() + (p1 * p1 * c1 + p1 * d1).sum();
    loss.backward();
  }
  void run(Optimizer& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      opt.zeroGrad();
      backward();
      opt.step();
    }
  }
};

void expectClose(const Tensor& t, const std::vector<double>& want, double rtol = 1e-5) {
  std::vector<double> got = t.toVector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rtol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
}

struct Case {
  const char* name;
  std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)> make;
  std::vector<double> p0, p1;
};

}  // namespace

TEST(Optim, StepsMatchTorch) {
  // torch.optim.<X>(..., options as below), 5 steps, the loss above.
  std::vector<Case> cases = {
      {"SGD plain",
       [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1}); },
       {0.322602659, -1.03382182, 2.27081609, 0.606671453, -0.45835337, 1.46217144},
       {0.139996126, -0.263632596, 1.04571307, -1.18955469, 0.0105403513, 0.632962108}},
      {"SGD momentum dampening wd",
       [](auto ps) {
         return std::make_unique<SGD>(ps,
                                      SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weightDecay = 0.01});
       },
       {0.268244773, -0.97339052, 2.30640388, 0.554382026, -0.500781357, 1.53196752},
       {0.122772656, -0.218685806, 1.06929791, -1.09085178, 0.00402178708, 0.637858629}},
      {"SGD nesterov wd",
       [](auto ps) {
         return std::make_unique<SGD>(ps,
                                      SGDOptions{.lr = 0.05, .momentum = 0.8, .weightDecay = 0.05, .nesterov = true});
       },
       {0.233420581, -0.902320743, 2.30470777, 0.525462866, -0.514303803, 1.5709852},
       {0.108665034, -0.195001006, 1.07227063, -1.01388454, -0.00737737259, 0.626611471}},
      {"SGD maximize momentum",
       [](auto ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.02, .momentum = 0.5, .maximize = true}); },
       {0.56632024, -1.32324004, 1.92086375, 0.809111953, -0.242237732, 0.986044049},
       {0.221355408, -0.453548878, 0.855268359, -1.61606061, 0.0609760135, 0.588554144}},
      {"Adam",
       [](auto ps) { return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01}); },
       {0.450071424, -1.20001984, 2.05003285, 0.700148106, -0.349932253, 1.15000594},
       {0.150161684, -0.350126773, 0.950029492, -1.45003927, -0.000207744539, 0.649757385}},
      {"Adam wd",
       [](auto ps) {
         return std::make_unique<Adam>(
             ps, AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weightDecay = 0.1});
       },
       {0.400614709, -1.15019, 2.10032296, 0.651110947, -0.399239868, 1.19999993},
       {0.101520188, -0.301065564, 1.00017595, -1.40030706, -0.051411029, 0.629846573}},
      {"Adam amsgrad",
       [](auto ps) { return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.05, .amsgrad = true}); },
       {0.252576649, -1.00055373, 2.25066733, 0.50727576, -0.547597766, 1.35014582},
       {-0.0416669399, -0.155752182, 1.15061307, -1.25121284, -0.198731884, 0.833957374}},
      {"AdamW",
       [](auto ps) { return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01}); },
       {0.449831814, -1.19940507, 2.04902267, 0.699784398, -0.349772483, 1.14944601},
       {0.150072038, -0.34993732, 0.949569285, -1.44930005, -0.000222751871, 0.649449348}},
      {"AdamW wd amsgrad",
       [](auto ps) {
         return std::make_unique<AdamW>(
             ps, AdamWOptions{.lr = 0.03, .beta1 = 0.85, .beta2 = 0.95, .weightDecay = 0.2, .amsgrad = true});
       },
       {0.337874562, -1.06498706, 2.08910584, 0.581969619, -0.438620329, 1.21564829},
       {0.0481726006, -0.241719484, 1.02174687, -1.30788231, -0.1001205, 0.727422893}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr;
    auto opt = c.make({pr.p0, pr.p1});
    pr.run(*opt, 5);
    expectClose(pr.p0, c.p0);
    expectClose(pr.p1, c.p1);
  }
}

TEST(Optim, Float64ParametersMatchTorchToo) {
  // Same Adam case in float64 (the kernel's double path); the float32 torch reference agrees to ~1e-6.
  Problem pr;
  Tensor p0 = pr.p0.detach().to(DType::Float64).setRequiresGrad();
  Tensor p1 = pr.p1.detach().to(DType::Float64).setRequiresGrad();
  Tensor c0 = pr.c0.to(DType::Float64), d0 = pr.d0.to(DType::Float64);
  Tensor c1 = pr.c1.to(DType::Float64), d1 = pr.d1.to(DType::Float64);
  Adam opt({p0, p1}, {.lr = 0.01});
  for (int s = 0; s < 5; ++s) {
    opt.zeroGrad();
    ((p0 * p0 * c0 + p0 * d0).sum() + (p1 * p1 * c1 + p1 * d1).sum()).backward();
    opt.step();
  }
  expectClose(p0, {0.450071424, -1.20001984, 2.05003285, 0.700148106, -0.349932253, 1.15000594});
  expectClose(p1, {0.150161684, -0.350126773, 0.950029492, -1.45003927, -0.000207744539, 0.649757385});
}

TEST(Optim, ParamGroupsWithTheirOwnOptions) {
  {
    // torch.optim.SGD([{"params": [p0]}, {"params": [p1], "lr": 0.01, "momentum": 0.0}], lr=0.1, momentum=0.9)
    Problem pr;
    SGD opt({{.params = {pr.p0}}, {.params = {pr.p1}, .options = {{"lr", 0.01}, {"momentum", 0.0}}}},
            {.lr = 0.1, .momentum = 0.9});
    EXPECT_DOUBLE_EQ(opt.paramGroups()[0].lr(), 0.1);
    EXPECT_DOUBLE_EQ(opt.paramGroups()[1].lr(), 0.01);
    EXPECT_DOUBLE_EQ(opt.paramGroups()[1].option("momentum"), 0.0);
    pr.run(opt, 5);
    expectClose(pr.p0, {0.0450291298, -0.685962141, 2.72129726, 0.389793962, -0.707990885, 2.05542827});
    expectClose(pr.p1, {0.193551779, -0.384253979, 0.914056063, -1.46541739, 0.0464577526, 0.603479147});
    EXPECT_EQ(opt.state(pr.p1)->tensors.count("momentum_buffer"), 0u);  // no momentum in that group
  }
  {
    // torch.optim.AdamW([{"params": [p0], "weight_decay": 0.0}, {"params": [p1], "lr": 0.003}], lr=0.02,
    // weight_decay=0.1)
    Problem pr;
    AdamW opt({{.params = {pr.p0}, .options = {{"weight_decay", 0.0}}},
               {.params = {pr.p1}, .options = {{"lr", 0.003}}}},
              {.lr = 0.02, .weightDecay = 0.1});
    pr.run(opt, 5);
    expectClose(pr.p0, {0.400313765, -1.15008163, 2.10012507, 0.650705457, -0.399703801, 1.20002389});
    expectClose(pr.p1, {0.18472217, -0.384420067, 0.913644314, -1.48276424, 0.0349056423, 0.614074647});
  }
}

TEST(Optim, StateDictRoundTripContinuesIdentically) {
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<Optimizer> {
      if (kind == 0) return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
      if (kind == 1) return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .amsgrad = true});
      return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.02, .weightDecay = 0.1});
    };
    Problem a;
    auto optA = make({a.p0, a.p1});
    a.run(*optA, 3);
    OptimizerStateDict saved = optA->stateDict();
    // Through the JSON form, as a checkpoint would store it.
    OptimizerStateDict reread;
    reread.setMetadataFromJson(saved.metadataJson());
    EXPECT_EQ(reread.type, saved.type);
    ASSERT_EQ(reread.groups.size(), 1u);
    EXPECT_EQ(reread.groups[0].params, (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(reread.groups[0].options, saved.groups[0].options);  // bit-exact through 17 digits
    for (const auto& [k, t] : saved.tensors) reread.tensors[k] = t.clone();
    EXPECT_EQ(saved.tensors.at("state.1.step").item<double>(), 3.0);

    // A fresh optimizer over copies of the parameters continues exactly like the original.
    Problem b;
    {
      autograd::NoGradGuard ng;
      b.p0.copy_(a.p0);
      b.p1.copy_(a.p1);
    }
    auto optB = make({b.p0, b.p1});
    optB->setLr(123.0);  // overwritten by the loaded group options
    optB->loadStateDict(reread);
    EXPECT_DOUBLE_EQ(optB->paramGroups()[0].lr(), optA->paramGroups()[0].lr());
    a.run(*optA, 3);
    b.run(*optB, 3);
    EXPECT_EQ(a.p0.toVector<float>(), b.p0.toVector<float>());
    EXPECT_EQ(a.p1.toVector<float>(), b.p1.toVector<float>());
  }
}

TEST(Optim, LoadStateDictRejectsMismatchesAndChangesNothing) {
  Problem a;
  Adam opt({a.p0, a.p1}, {.lr = 0.01});
  a.run(opt, 1);
  OptimizerStateDict sd = opt.stateDict();
  OptimizerStateDict bad = sd;
  bad.type = "SGD";
  bad.tensors["state.0.exp_avg"] = zeros({5});
  bad.tensors["state.9.exp_avg"] = zeros({6});
  bad.tensors["garbage"] = zeros({1});
  std::vector<float> before = opt.state(a.p0)->tensors.at("exp_avg").toVector<float>();
  try {
    opt.loadStateDict(bad);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("SGD"), std::string::npos) << m;
    EXPECT_NE(m.find("state.0.exp_avg"), std::string::npos) << m;
    EXPECT_NE(m.find("state.9.exp_avg"), std::string::npos) << m;
    EXPECT_NE(m.find("garbage"), std::string::npos) << m;
  }
  EXPECT_EQ(opt.state(a.p0)->tensors.at("exp_avg").toVector<float>(), before);
  OptimizerStateDict junk;
  EXPECT_THROW(junk.setMetadataFromJson("{\"type\": \"Adam\", \"groups\": [{\"params\": [0, -1]"), ValueError);
  EXPECT_THROW(junk.setMetadataFromJson("{\"groups\": []}"), ValueError);
}

TEST(Optim, BadArgumentsAreValueErrors) {
  Problem pr;
  EXPECT_THROW(SGD({pr.p0}, {.lr = -1.0}), ValueError);
  EXPECT_THROW(SGD({pr.p0}, {.lr = 0.1, .nesterov = true}), ValueError);  // nesterov without momentum
  EXPECT_THROW(Adam({pr.p0}, {.beta1 = 1.0}), ValueError);
  EXPECT_THROW(SGD(std::vector<Tensor>{}, {}), ValueError);
  EXPECT_THROW(SGD({pr.p0, pr.p0}, {}), ValueError);  // the same parameter twice
  EXPECT_THROW(SGD({{.params = {pr.p0}, .options = {{"learning_rate", 0.1}}}}, {}), ValueError);
  SGD opt({pr.p0}, {});
  EXPECT_THROW(opt.addParamGroup({.params = {pr.p0}}), ValueError);  // already optimized
  opt.addParamGroup({.params = {pr.p1}, .options = {{"lr", 0.5}}});
  EXPECT_EQ(opt.paramGroups().size(), 2u);
  EXPECT_DOUBLE_EQ(opt.paramGroups()[1].option("momentum"), 0.0);  // filled from the defaults
}

TEST(Optim, StepSkipsParamsWithoutGradAndZeroGrad) {
  Problem pr;
  SGD opt({pr.p0, pr.p1}, {.lr = 0.1, .momentum = 0.9});
  ((pr.p0 * pr.c0).sum()).backward();  // p1 gets no gradient
  opt.step();
  EXPECT_EQ(pr.p1.toVector<float>(), kP1);
  EXPECT_EQ(opt.state(pr.p1), nullptr);
  ASSERT_NE(opt.state(pr.p0), nullptr);
  // p0 -= lr * c0 (first momentum step uses the gradient itself)
  std::vector<float> p0 = pr.p0.toVector<float>();
  for (size_t i = 0; i < p0.size(); ++i) EXPECT_FLOAT_EQ(p0[i], kP0[i] - 0.1f * kC0[i]);
  opt.zeroGrad(/*setToNone=*/false);
  ASSERT_TRUE(pr.p0.grad().defined());
  EXPECT_EQ(pr.p0.grad().toVector<float>(), std::vector<float>(6, 0.0f));
  opt.zeroGrad();
  EXPECT_FALSE(pr.p0.grad().defined());
}

TEST(Optim, HalfPrecisionParametersStep) {
  // bfloat16 parameters: computed in float, rounded once; compare with the float32 run rounded.
  Problem ref;
  SGD optRef({ref.p0}, {.lr = 0.1, .momentum = 0.9});
  Tensor p = ref.p0.detach().to(DType::BFloat16).setRequiresGrad();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.setGrad(fromVector<float>(kC0).to(DType::BFloat16));
  ref.p0.setGrad(fromVector<float>(kC0).to(DType::BFloat16).to(DType::Float32));
  opt.step();
  optRef.step();
  std::vector<float> got = p.toVector<float>(), want = ref.p0.toVector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-2 * std::max(1.0f, std::fabs(want[i])));
}

// ---- schedulers ------------------------------------------------------------------------------

namespace {
std::vector<double> lrSequence(Optimizer& opt, LRScheduler& s, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(opt.paramGroups()[0].lr());
    opt.step();
    s.step();
  }
  return out;
}
void expectLrs(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "step " << i;
}
}  // namespace

TEST(LRScheduler, StepLRMatchesTorch) {
  // torch.optim.lr_scheduler.StepLR(SGD(lr=0.5), step_size=3, gamma=0.5), lr before each of 12 steps
  Problem pr;
  SGD opt({pr.p0}, {.lr = 0.5});
  StepLR s(opt, 3, 0.5);
  expectLrs(lrSequence(opt, s, 12), {0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.0625, 0.0625, 0.0625});
}

TEST(LRScheduler, LinearWarmupMatchesTorchLinearLR) {
  // torch.optim.lr_scheduler.LinearLR(SGD(lr=0.5), start_factor=1/4, end_factor=1.0, total_iters=3)
  Problem pr;
  SGD opt({pr.p0}, {.lr = 0.5});
  LinearWarmup s(opt, 4);
  expectLrs(lrSequence(opt, s, 12), {0.125, 0.25, 0.375, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
}

TEST(LRScheduler, CosineWithWarmupMatchesReference) {
  // torch LambdaLR(SGD(lr=0.5)) with tests/parity/torch_reference.py's lr_at (warmup 3, total 10, min_lr 0.05).
  Problem pr;
  SGD opt({pr.p0}, {.lr = 0.5});
  CosineWithWarmup s(opt, {.warmupSteps = 3, .totalSteps = 10, .minLr = 0.05});
  expectLrs(lrSequence(opt, s, 12), {0.16666666666666666, 0.33333333333333331, 0.5, 0.5, 0.47771799527804426,
                                     0.41528520541821506, 0.3250672101401707, 0.22493278985982929, 0.13471479458178498,
                                     0.072282004721955728, 0.050000000000000003, 0.050000000000000003});
}

TEST(LRScheduler, StateRoundTripAndGroups) {
  Problem pr;
  SGD opt({{.params = {pr.p0}}, {.params = {pr.p1}, .options = {{"lr", 0.1}}}}, {.lr = 1.0});
  StepLR s(opt, 2, 0.1);
  for (int i = 0; i < 5; ++i) s.step();
  EXPECT_EQ(s.lastStep(), 5);
  std::vector<double> lrs = s.lastLr();
  EXPECT_NEAR(lrs[0], 1.0 * 0.01, 1e-15);
  EXPECT_NEAR(lrs[1], 0.1 * 0.01, 1e-15);
  SchedulerState st = s.state();

  Problem pr2;
  SGD opt2({{.params = {pr2.p0}}, {.params = {pr2.p1}, .options = {{"lr", 0.1}}}}, {.lr = 1.0});
  StepLR s2(opt2, 2, 0.1);
  s2.loadState(st);
  EXPECT_EQ(s2.lastLr(), lrs);
  s.step();
  s2.step();
  EXPECT_EQ(s2.lastLr(), s.lastLr());
  EXPECT_THROW(s2.loadState({3, {1.0}}), ValueError);
  EXPECT_THROW(CosineWithWarmup(opt2, {.warmupSteps = 5, .totalSteps = 3}), ValueError);
}

// ---- gradient clipping -----------------------------------------------------------------------

TEST(ClipGradNorm, MatchesTorch) {
  // torch.nn.utils.clip_grad_norm_([a, b], max_norm, norm_type) with a.grad = P0, b.grad = P1:
  // (norm type, max norm) -> total norm | clipped P0 grads | clipped P1 grads
  struct Ref {
    double type, maxNorm, total;
    std::vector<double> g0, g1;
  };
  std::vector<Ref> refs = {
      {2.0,
       1.0,
       3.36117554,
       {0.148757443, -0.371893615, 0.595029771, 0.223136157, -0.0892544687, 0.327266395},
       {0.0595029779, -0.119005956, 0.267763376, -0.446272314, 0.0148757445, 0.178508937}},
      {kInfNorm,
       0.5,
       2.0,
       {0.12499994, -0.312499851, 0.499999762, 0.187499911, -0.0749999657, 0.274999887},
       {0.0499999784, -0.0999999568, 0.22499989, -0.374999821, 0.0124999946, 0.149999931}},
      {1.0,
       100.0,
       9.55000019,
       {0.5, -1.25, 2, 0.75, -0.300000012, 1.10000002},
       {0.200000003, -0.400000006, 0.899999976, -1.5, 0.0500000007, 0.600000024}},
      {3.0,
       0.7,
       2.5329051,
       {0.138181195, -0.345452994, 0.552724779, 0.207271785, -0.0829087198, 0.303998649},
       {0.0552724786, -0.110544957, 0.248726144, -0.414543569, 0.0138181197, 0.16581744}},
  };
  for (const Ref& r : refs) {
    SCOPED_TRACE(r.type);
    Tensor a = zeros({6}).setRequiresGrad(), b = zeros({2, 3}).setRequiresGrad(), c = zeros({2}).setRequiresGrad();
    a.setGrad(fromVector<float>(kP0));
    b.setGrad(fromVector<float>(kP1, {2, 3}));
    double total = clipGradNorm({a, b, c}, r.maxNorm, r.type);  // c has no grad: skipped
    EXPECT_NEAR(total, r.total, 1e-6 * r.total);
    expectClose(a.grad(), r.g0);
    expectClose(b.grad(), r.g1);
  }
  Tensor a = zeros({2}).setRequiresGrad();
  a.setGrad(fromVector<float>({NAN, 1.0f}));
  EXPECT_THROW(clipGradNorm({a}, 1.0, 2.0, /*errorIfNonfinite=*/true), ValueError);
  EXPECT_TRUE(std::isnan(gradNorm({a})));
}

// ---- float32 master weights for half parameters ------------------------------------------------

TEST(MasterWeights, HalfParametersFollowTheFloat32TrajectoryRoundedOnce) {
  // A float32 parameter and a bfloat16/float16 one with master weights, fed the same gradients
  // (values the half type holds exactly): the master is the float32 parameter bit for bit, and
  // the half parameter is it rounded once, every step, for AdamW and SGD with momentum.
  for (DType half : {DType::BFloat16, DType::Float16}) {
    for (int which = 0; which < 2; ++which) {
      Generator g(3);
      Tensor p32 = (randn({37}, {}, &g)).to(half).to(DType::Float32).setRequiresGrad(true);
      Tensor ph = p32.detach().to(half).setRequiresGrad(true);
      std::unique_ptr<Optimizer> o32, oh;
      if (which == 0) {
        o32 = std::make_unique<AdamW>(std::vector<Tensor>{p32}, AdamWOptions{.lr = 1e-3, .weightDecay = 0.1});
        oh = std::make_unique<AdamW>(std::vector<Tensor>{ph}, AdamWOptions{.lr = 1e-3, .weightDecay = 0.1});
      } else {
        o32 = std::make_unique<SGD>(std::vector<Tensor>{p32}, SGDOptions{.lr = 1e-3, .momentum = 0.9});
        oh = std::make_unique<SGD>(std::vector<Tensor>{ph}, SGDOptions{.lr = 1e-3, .momentum = 0.9});
      }
      oh->setMasterWeights();
      for (int step = 0; step < 8; ++step) {
        Tensor grad = (randn({37}, {}, &g) * 0.1).to(half);
        p32.setGrad(grad.to(DType::Float32));
        ph.setGrad(grad);
        o32->step();
        oh->step();
        const Tensor& master = oh->state(ph)->tensors.at("master");
        ASSERT_TRUE(cohort::testing::sameBits(master, p32.detach()))
            << dtypeName(half) << " optimizer " << which << " step " << step;
        ASSERT_TRUE(cohort::testing::sameBits(ph.detach(), p32.detach().to(half)))
            << dtypeName(half) << " step " << step;
      }
      // The moments are float32 too.
      for (const auto& [k, t] : oh->state(ph)->tensors) EXPECT_EQ(t.dtype(), DType::Float32) << k;
    }
  }
}

TEST(MasterWeights, TheUpdateReadsTheHalfGradientWithoutAWidenedCopy) {
  // The fused CPU updates read a bfloat16/float16 gradient straight into the float32 master: a
  // step after the first (state made) allocates nothing the size of a float32 gradient.
  constexpr int64_t kN = 1 << 16;
  for (DType half : {DType::BFloat16, DType::Float16}) {
    for (int which = 0; which < 2; ++which) {
      Tensor p = zeros({kN}, {.dtype = half}).setRequiresGrad(true);
      std::unique_ptr<Optimizer> opt;
      if (which == 0) opt = std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 1e-3});
      else opt = std::make_unique<SGD>(std::vector<Tensor>{p}, SGDOptions{.lr = 1e-3, .momentum = 0.9});
      opt->setMasterWeights();
      p.setGrad(ones({kN}, {.dtype = half}));
      opt->step();
      const int64_t live = memoryStats().bytesLive;
      resetPeakMemory();
      opt->step();
      EXPECT_LT(memoryStats().peakBytes - live, kN * 4) << dtypeName(half) << " optimizer " << which;
    }
  }
}

TEST(MasterWeights, WithoutThemSmallUpdatesOfABFloat16WeightAreLost) {
  Tensor p = ones({4}, {.dtype = DType::BFloat16}).setRequiresGrad(true);
  Tensor q = ones({4}, {.dtype = DType::BFloat16}).setRequiresGrad(true);
  SGD plain({p}, {.lr = 1e-3}), mastered({q}, {.lr = 1e-3});
  mastered.setMasterWeights();
  for (int i = 0; i < 10; ++i) {
    p.setGrad(ones({4}, {.dtype = DType::BFloat16}));
    q.setGrad(ones({4}, {.dtype = DType::BFloat16}));
    plain.step();
    mastered.step();
  }
  // 1 - 10 * 1e-3 = 0.99: bfloat16 has 2^-8 steps below 1, so each 1e-3 update rounds away.
  EXPECT_EQ(p.detach().to(DType::Float32).max().item<double>(), 1.0);
  EXPECT_NEAR(q.detach().to(DType::Float32).max().item<double>(), 0.99, 2.0 / 256);
  EXPECT_LT(q.detach().to(DType::Float32).max().item<double>(), 1.0);
}

TEST(MasterWeights, StateDictCarriesTheMastersAndMisuseIsAValueError) {
  Generator g(5);
  Tensor p = randn({6}, {}, &g).to(DType::BFloat16).setRequiresGrad(true);
  AdamW opt({p}, {.lr = 1e-2});
  opt.setMasterWeights();
  std::vector<Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(randn({6}, {}, &g).to(DType::BFloat16));
  for (int i = 0; i < 3; ++i) {
    p.setGrad(grads[i]);
    opt.step();
  }
  OptimizerStateDict saved = opt.stateDict();
  ASSERT_TRUE(saved.tensors.count("state.0.master"));
  EXPECT_EQ(saved.tensors.at("state.0.master").dtype(), DType::Float32);
  cohort::testing::expectError<ValueError>([&] { opt.setMasterWeights(false); },
                                           {"setMasterWeights", "before the first step"});

  // Resume into a fresh parameter and optimizer: the same next steps, bit for bit.
  Tensor p2 = p.detach().clone().setRequiresGrad(true);
  AdamW resumed({p2}, {.lr = 1e-2});
  AdamW noMasters({p2}, {.lr = 1e-2});
  cohort::testing::expectError<ValueError>([&] { noMasters.loadStateDict(saved); },
                                           {"state.0.master", "setMasterWeights"});
  resumed.setMasterWeights();
  resumed.loadStateDict(saved);
  for (int i = 3; i < 6; ++i) {
    p.setGrad(grads[i]);
    p2.setGrad(grads[i]);
    opt.step();
    resumed.step();
    ASSERT_TRUE(cohort::testing::sameBits(p.detach(), p2.detach())) << i;
  }
}
