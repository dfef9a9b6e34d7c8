// amp::GradScaler against PyTorch 1.13's torch.cuda.amp.GradScaler: the same training runs (inf
// and NaN forced into a gradient at known steps, float16 gradients that overflow by themselves)
// skip the same steps and end every step with the same scale, growth tracker and parameters;
// unscale then clipGradNorm gives torch's unscale_ then clip_grad_norm_. The PyTorch side is
// tests/parity/grad_scaler_reference.py, run with /usr/bin/python3 (it runs torch's GradScaler
// class, with its two CUDA-only kernels written in Python from their documented semantics; the
// script says how). Then: the fused unscale against the one built from ops, float16 unscaled in
// float32, the state and checkpoints, a disabled scaler, and every misuse as a typed error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/sgd.h>

#include "core/test_util.h"
#include "temp_dir.h"

namespace cohort::amp {
namespace {

using json = nlohmann::json;
using ::cohort::testing::expectError;
using ::cohort::testing::TempDir;
namespace fs = std::filesystem;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> valuesOf(const Tensor& t) { return t.to(DType::Float64).contiguous().toVector<double>(); }

Tensor param(const std::vector<double>& values, DType dtype = DType::Float32) {
  Tensor p = fromVector(values).to(dtype);
  p.setRequiresGrad(true);
  return p;
}

void setGrad(Tensor& p, const std::vector<double>& values, DType dtype = DType::Float32) {
  p.setGrad(fromVector(values).to(dtype));
}

// Writes `value` into element `i` of p's gradient.
void poke(const Tensor& p, int64_t i, double value) {
  autograd::NoGradGuard ng;
  Tensor g = p.grad();
  g.select(0, i).fill_(value);
}

// ---- the PyTorch reference ---------------------------------------------------------------------

struct TrainCase {
  DType dtype = DType::Float32;
  int64_t n = 5;
  int steps = 12;
  double lr = 0.05;
  double momentum = 0.9;
  std::map<int, std::string> forced;  // step -> "inf" / "nan" in gradient element 0
  GradScalerOptions options;
  uint64_t seed = 1;
};

struct Inputs {
  std::vector<double> init;
  std::vector<std::vector<double>> xs;
};

// Values exactly representable in the case's dtype, so both sides start from the same numbers.
Inputs inputsFor(const TrainCase& c) {
  Generator g(c.seed);
  Inputs r;
  r.init = valuesOf(randn({c.n}, {}, &g).to(c.dtype));
  for (int k = 0; k < c.steps; ++k) r.xs.push_back(valuesOf((randn({c.n}, {}, &g) * 2.0).to(c.dtype)));
  return r;
}

json trainConfig(const TrainCase& c) {
  Inputs r = inputsFor(c);
  json forced = json::object();
  for (const auto& [k, v] : c.forced) forced[std::to_string(k)] = v;
  return {{"kind", "train"},
          {"dtype", dtypeName(c.dtype)},
          {"init", r.init},
          {"xs", r.xs},
          {"lr", c.lr},
          {"momentum", c.momentum},
          {"forced", forced},
          {"init_scale", c.options.initScale},
          {"growth_factor", c.options.growthFactor},
          {"backoff_factor", c.options.backoffFactor},
          {"growth_interval", c.options.growthInterval}};
}

struct TrainResult {
  std::vector<bool> stepped;
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  std::vector<std::vector<double>> params;
  GradScalerState state;
};

// The cohort side: loss = sum(p * x_k), scaled, backward, forced values, step, update.
TrainResult runTrain(const TrainCase& c) {
  Inputs r = inputsFor(c);
  Tensor p = param(r.init, c.dtype);
  optim::SGD opt({p}, {.lr = c.lr, .momentum = c.momentum});
  GradScaler scaler(c.options);
  TrainResult out;
  for (int k = 0; k < c.steps; ++k) {
    opt.zeroGrad();
    Tensor loss = (p * fromVector(r.xs[static_cast<size_t>(k)]).to(c.dtype)).sum();
    Tensor scaled = scaler.scale(loss);
    EXPECT_EQ(scaled.dtype(), c.dtype);
    scaled.backward();
    if (auto it = c.forced.find(k); it != c.forced.end()) poke(p, 0, it->second == "inf" ? kInf : kNaN);
    out.stepped.push_back(scaler.step(opt));
    EXPECT_EQ(scaler.foundInf(opt), std::optional<bool>(!out.stepped.back()));
    scaler.update();
    out.scales.push_back(scaler.getScale());
    out.trackers.push_back(scaler.growthTracker());
    out.params.push_back(valuesOf(p));
  }
  out.state = scaler.stateDict();
  return out;
}

struct ClipCase {
  std::vector<std::vector<double>> grads;  // already scaled
  std::vector<bool> hasGrad;
  double scale = 1000;
  double maxNorm = 0.5;
  double normType = 2.0;
};

json clipConfig(const ClipCase& c) {
  return {{"kind", "clip"},         {"grads", c.grads},      {"has_grad", c.hasGrad},
          {"init_scale", c.scale},  {"growth_factor", 2.0},  {"backoff_factor", 0.5},
          {"growth_interval", 100}, {"max_norm", c.maxNorm}, {"norm_type", c.normType}};
}

const std::vector<TrainCase>& trainCases() {
  static const std::vector<TrainCase> kCases = [] {
    std::vector<TrainCase> v;
    // float32, inf at step 3 and NaN at step 7, growth every 3 clean steps.
    v.push_back({.forced = {{3, "inf"}, {7, "nan"}}, .options = {.initScale = 1024, .growthInterval = 3}});
    // Factors that are not powers of two: every product is rounded to float32, as torch keeps it.
    v.push_back({.steps = 14,
                 .forced = {{1, "inf"}, {2, "nan"}, {9, "inf"}},
                 .options = {.initScale = 1000, .growthFactor = 3.0, .backoffFactor = 0.3, .growthInterval = 2},
                 .seed = 2});
    // float16 parameters and gradients: 65536 is inf in float16, so the first steps overflow by
    // themselves and the scale backs off until the gradients fit; a forced inf at step 6 too.
    v.push_back({.dtype = DType::Float16,
                 .steps = 12,
                 .momentum = 0.0,
                 .forced = {{6, "inf"}},
                 .options = {.growthInterval = 2},
                 .seed = 3});
    // Growth interval 1: the scale doubles after every clean step.
    v.push_back({.steps = 6, .forced = {{4, "nan"}}, .options = {.initScale = 8, .growthInterval = 1}, .seed = 4});
    return v;
  }();
  return kCases;
}

ClipCase clipCase() {
  ClipCase c;
  Generator g(9);
  c.scale = 3000;  // not a power of two: unscaling rounds
  c.grads = {valuesOf(randn({6}, {}, &g) * 3000.0), valuesOf(randn({4}, {}, &g)), valuesOf(randn({3}, {}, &g) * 900.0)};
  c.hasGrad = {true, false, true};
  return c;
}

// tests/CMakeLists.txt passes the source tree; without it, the build tree's include/cohort/core
// (a link to the source tree's core/, made by the top CMakeLists.txt) leads there from this binary
// (<build>/tests/grad_scaler_test).
fs::path sourceDir() {
#ifdef COHORT_SOURCE_DIR
  return COHORT_SOURCE_DIR;
#else
  const fs::path build = fs::read_symlink("/proc/self/exe").parent_path().parent_path();
  return fs::canonical(build / "include" / "cohort" / "core").parent_path();
#endif
}

fs::path scriptPath() { return sourceDir() / "tests" / "parity" / "grad_scaler_reference.py"; }

// Runs the reference once for every case; [train cases..., clip case].
const json& torchResults() {
  static const json kResults = [] {
    fs::path dir = fs::temp_directory_path() / fmt::format("cohort_grad_scaler_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    json cases = json::array();
    for (const TrainCase& c : trainCases()) cases.push_back(trainConfig(c));
    cases.push_back(clipConfig(clipCase()));
    { std::ofstream(dir / "config.json") << json{{"cases", cases}}.dump(); }
    std::string cmd = fmt::format("/usr/bin/python3 {} {} 2>&1", scriptPath().string(), dir.string());
    int rc = std::system(cmd.c_str());
    json out;
    if (rc == 0) std::ifstream(dir / "torch_out.json") >> out;
    fs::remove_all(dir);
    if (rc != 0) throw std::runtime_error("the PyTorch reference failed: " + cmd);
    return out["results"];
  }();
  return kResults;
}

void expectClose(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
}

class TorchParity : public ::testing::TestWithParam<size_t> {};

TEST_P(TorchParity, SkipsTheSameStepsWithTheSameScalesAndParameters) {
  const TrainCase& c = trainCases()[GetParam()];
  const json& ref = torchResults()[GetParam()];
  TrainResult got = runTrain(c);
  const auto refStepped = ref["stepped"].get<std::vector<bool>>();
  const auto refScales = ref["scales"].get<std::vector<double>>();
  const auto refTrackers = ref["trackers"].get<std::vector<int64_t>>();
  const auto refParams = ref["params"].get<std::vector<std::vector<double>>>();
  EXPECT_EQ(got.stepped, refStepped);
  EXPECT_EQ(got.scales, refScales);  // exactly: both are float32 values
  EXPECT_EQ(got.trackers, refTrackers);
  const double tol = c.dtype == DType::Float16 ? 2e-3 : 1e-6;
  for (size_t k = 0; k < got.params.size(); ++k)
    expectClose(got.params[k], refParams[k], tol, fmt::format("step {}", k));
  // The forced steps, and only those among steps that did not overflow by themselves, are skipped,
  // and a skipped step leaves the parameters exactly as they were.
  for (const auto& [k, kind] : c.forced) EXPECT_FALSE(got.stepped[static_cast<size_t>(k)]) << "step " << k;
  if (c.dtype == DType::Float32) {
    for (size_t k = 0; k < got.stepped.size(); ++k)
      EXPECT_EQ(got.stepped[k], c.forced.count(static_cast<int>(k)) == 0) << "step " << k;
  }
  Inputs r = inputsFor(c);
  for (size_t k = 0; k < got.stepped.size(); ++k) {
    if (got.stepped[k]) continue;
    EXPECT_EQ(got.params[k], k == 0 ? r.init : got.params[k - 1]) << "skipped step " << k << " changed p";
  }
  // The saved state is torch's state_dict(), by cohort's names.
  const json& sd = ref["state_dict"];
  EXPECT_EQ(got.state.at("scale"), sd["scale"].get<double>());
  EXPECT_EQ(got.state.at("growth_tracker"), sd["_growth_tracker"].get<double>());
  EXPECT_EQ(got.state.at("growth_factor"), sd["growth_factor"].get<double>());
  EXPECT_EQ(got.state.at("backoff_factor"), sd["backoff_factor"].get<double>());
  EXPECT_EQ(got.state.at("growth_interval"), sd["growth_interval"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchParity, ::testing::Range<size_t>(0, 4));

TEST(TorchParityScaleSequence, ForcedOverflowsAtSteps3And7WithGrowthEvery3CleanSteps) {
  // Spelled out for the first case, so the rule is visible here, not only agreed with torch:
  // 2 clean steps count the tracker up, the 3rd grows the scale; an overflow halves it and resets.
  TrainResult got = runTrain(trainCases()[0]);
  EXPECT_EQ(got.scales, (std::vector<double>{1024, 1024, 2048, 1024, 1024, 1024, 2048, 1024, 1024, 1024, 2048, 2048}));
  EXPECT_EQ(got.trackers, (std::vector<int64_t>{1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 1}));
  EXPECT_EQ(got.stepped, (std::vector<bool>{true, true, true, false, true, true, true, false, true, true, true, true}));
}

TEST(TorchParityClip, UnscaleThenClipGradNormMatchesTorch) {
  ClipCase c = clipCase();
  const json& ref = torchResults()[trainCases().size()];
  std::vector<Tensor> params;
  for (size_t i = 0; i < c.grads.size(); ++i) {
    Tensor p = param(std::vector<double>(c.grads[i].size(), 0.0));
    if (c.hasGrad[i]) setGrad(p, c.grads[i]);
    params.push_back(p);
  }
  optim::SGD opt(params, {.lr = 0.1});
  GradScaler scaler({.initScale = c.scale, .growthInterval = 100});
  scaler.unscale(opt);
  double total = optim::clipGradNorm(params, c.maxNorm, c.normType);
  EXPECT_NEAR(total, ref["total_norm"].get<double>(), 1e-6 * ref["total_norm"].get<double>());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!c.hasGrad[i]) {
      EXPECT_TRUE(ref["grads"][i].is_null());
      EXPECT_FALSE(params[i].grad().defined());
      continue;
    }
    expectClose(valuesOf(params[i].grad()), ref["grads"][i].get<std::vector<double>>(), 1e-6,
                fmt::format("grad {}", i));
  }
  EXPECT_EQ(scaler.foundInf(opt), std::optional<bool>(false));
  EXPECT_TRUE(scaler.step(opt));  // already unscaled: steps without unscaling again
  scaler.update();
}

// ---- unscale -----------------------------------------------------------------------------------

TEST(Unscale, FusedKernelAndOpsAgreeBitForBitInEveryFloatDtype) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (bool withInf : {false, true}) {
      Generator g(5);
      Tensor base = (randn({4, 40000}, {}, &g) * 300.0).to(dt);  // above the intra-op grain
      if (withInf) {
        autograd::NoGradGuard ng;
        base.select(0, 3).select(0, 39999).fill_(kNaN);
        base.select(0, 1).select(0, 7).fill_(-kInf);
      }
      const float inv = static_cast<float>(1.0 / 3000.0);
      Tensor a = base.clone(), b = base.clone();
      const uint32_t before = a.version();
      bool foundA = detail::unscaleGrad(a, inv, /*fused=*/true);
      bool foundB = detail::unscaleGrad(b, inv, /*fused=*/false);
      EXPECT_EQ(foundA, withInf) << dtypeName(dt);
      EXPECT_EQ(foundB, withInf) << dtypeName(dt);
      EXPECT_GT(a.version(), before) << "an in-place change must bump the version";
      std::vector<double> va = valuesOf(a), vb = valuesOf(b), vbase = valuesOf(base);
      size_t mismatches = 0;
      for (size_t i = 0; i < va.size(); ++i) {
        if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
        if (va[i] != vb[i]) ++mismatches;
      }
      EXPECT_EQ(mismatches, 0u) << dtypeName(dt);
      // x * (1/S) in the compute type, rounded once to the dtype.
      for (size_t i = 0; i < 50; ++i) {
        double want = dt == DType::Float64 ? vbase[i] * static_cast<double>(inv)
                                           : static_cast<double>(static_cast<float>(vbase[i]) * inv);
        EXPECT_EQ(va[i], valuesOf(scalarTensor(want, {.dtype = DType::Float64}).to(dt))[0])
            << dtypeName(dt) << " " << i;
      }
    }
  }
}

TEST(Unscale, NonContiguousGradientsAreUnscaledInPlace) {
  Tensor p2 = zeros({3, 4});
  p2.setRequiresGrad(true);
  p2.setGrad(mul(arange(12.0).reshape({4, 3}), Scalar(8.0)).t());  // a transposed view
  ASSERT_FALSE(p2.grad().isContiguous());
  Tensor handle = p2.grad();
  optim::SGD opt({p2}, {.lr = 0.1});
  GradScaler scaler({.initScale = 8});
  scaler.unscale(opt);
  EXPECT_TRUE(p2.grad().isSameAs(handle));
  cohort::testing::expectNear(handle.contiguous().flatten(), valuesOf(arange(12.0).reshape({4, 3}).t().contiguous()));
}

TEST(Unscale, Float16GradientsAreUnscaledInFloat32) {
  // 1/S = 1e-5 is a float16 subnormal (168 * 2^-24 = 1.0014e-5): computing in float16 would give
  // about 0.6008; float32 math gives the float16 nearest to 60000 / 100000.
  Tensor p = param({0, 0, 0, 0}, DType::Float16);
  setGrad(p, {60000, 3, -65504, 0.5}, DType::Float16);
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.initScale = 100000});
  scaler.unscale(opt);
  EXPECT_EQ(p.grad().dtype(), DType::Float16);
  const float inv = static_cast<float>(1.0 / 100000.0);
  std::vector<double> want;
  for (double v : {60000.0, 3.0, -65504.0, 0.5}) want.push_back(static_cast<float>(Half(static_cast<float>(v) * inv)));
  EXPECT_EQ(valuesOf(p.grad()), want);
  EXPECT_EQ(scaler.foundInf(opt), std::optional<bool>(false));
}

TEST(Unscale, AnUnscaledValueThatOverflowsItsDtypeCountsAsInf) {
  // A scale below 1 multiplies: 60000 * 2 is past float16's range.
  Tensor p = param({0, 0}, DType::Float16);
  setGrad(p, {60000, 1}, DType::Float16);
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.initScale = 0.5});
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(valuesOf(p), (std::vector<double>{0, 0}));
  scaler.update();
  EXPECT_EQ(scaler.getScale(), 0.25);
}

TEST(Unscale, EveryGradientIsUnscaledAndParametersWithoutOneAreSkipped) {
  Tensor a = param({1, 2}), b = param({3}), c = param({4, 5}, DType::BFloat16), d = param({6, 7, 8}, DType::Float16);
  setGrad(a, {kInf, 4});  // the inf is first: the others are unscaled all the same
  setGrad(c, {8, 16}, DType::BFloat16);
  setGrad(d, {-2, 6, 10}, DType::Float16);
  optim::SGD opt({a, b, c, d}, {.lr = 0.1});
  GradScaler scaler({.initScale = 2});
  scaler.unscale(opt);
  EXPECT_EQ(scaler.foundInf(opt), std::optional<bool>(true));
  EXPECT_EQ(valuesOf(a.grad())[1], 2.0);
  EXPECT_TRUE(std::isinf(valuesOf(a.grad())[0]));
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(valuesOf(c.grad()), (std::vector<double>{4, 8}));
  EXPECT_EQ(valuesOf(d.grad()), (std::vector<double>{-1, 3, 5}));
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(valuesOf(a), (std::vector<double>{1, 2}));
  EXPECT_EQ(valuesOf(c), (std::vector<double>{4, 5}));
}

// ---- scale, update, several optimizers ---------------------------------------------------------

TEST(Scale, MultipliesInTheLossDtypeAndIsDifferentiable) {
  GradScaler scaler({.initScale = 1024});
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    Tensor x = param({0.5, -2, 3}, dt);
    Tensor loss = (x * x).sum();
    Tensor s = scaler.scale(loss);
    EXPECT_EQ(s.dtype(), dt);
    EXPECT_EQ(s.sizes(), loss.sizes());
    EXPECT_EQ(s.itemDouble(), loss.itemDouble() * 1024) << dtypeName(dt);
    s.backward();
    EXPECT_EQ(valuesOf(x.grad()), (std::vector<double>{1024, -4096, 6144})) << dtypeName(dt);
  }
  Tensor v = fromVector(std::vector<float>{1, 2});
  EXPECT_EQ(valuesOf(scaler.scale(v)), (std::vector<double>{1024, 2048}));  // any shape
}

TEST(Update, NewScaleSetsTheScaleAndKeepsTheTracker) {
  Tensor p = param({1});
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.initScale = 16, .growthInterval = 5});
  for (int i = 0; i < 2; ++i) {
    setGrad(p, {1});
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
  }
  EXPECT_EQ(scaler.growthTracker(), 2);
  setGrad(p, {1});
  scaler.step(opt);
  scaler.update(100.0);
  EXPECT_EQ(scaler.getScale(), 100.0);
  EXPECT_EQ(scaler.growthTracker(), 2);
  setGrad(p, {1});
  scaler.unscale(opt);  // a new iteration began
  scaler.update();
  EXPECT_EQ(scaler.growthTracker(), 3);
}

TEST(Update, GrowthStopsBelowFloat32Infinity) {
  Tensor p = param({1});
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.initScale = 2e38, .growthInterval = 1});
  setGrad(p, {1});
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.getScale(), static_cast<double>(2e38F));  // 4e38 is inf in float32: unchanged
  EXPECT_EQ(scaler.growthTracker(), 0);                      // and the tracker starts again
}

TEST(Update, SeveralOptimizersStepOnTheirOwnVerdictAndTheScaleBacksOffForAny) {
  Tensor a = param({1}), b = param({1});
  optim::SGD optA({a}, {.lr = 1.0}), optB({b}, {.lr = 1.0});
  GradScaler scaler({.initScale = 4});
  setGrad(a, {4});
  setGrad(b, {kInf});
  EXPECT_TRUE(scaler.step(optA));
  EXPECT_FALSE(scaler.step(optB));
  EXPECT_EQ(valuesOf(a), (std::vector<double>{0}));
  EXPECT_EQ(valuesOf(b), (std::vector<double>{1}));
  scaler.update();
  EXPECT_EQ(scaler.getScale(), 2.0);
  EXPECT_FALSE(scaler.foundInf(optA).has_value());  // a new iteration
}

TEST(Disabled, IsAPassThrough) {
  GradScaler scaler({.enabled = false});
  EXPECT_FALSE(scaler.isEnabled());
  EXPECT_EQ(scaler.getScale(), 1.0);
  Tensor p = param({1, 2});
  Tensor loss = (p * p).sum();
  EXPECT_TRUE(scaler.scale(loss).isSameAs(loss));
  loss.backward();
  poke(p, 0, kInf);
  optim::SGD opt({p}, {.lr = 0.5});
  scaler.unscale(opt);
  scaler.unscale(opt);  // no bookkeeping at all
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(std::isinf(valuesOf(p)[0]));
  scaler.update();
  scaler.update();
  EXPECT_EQ(scaler.getScale(), 1.0);
  EXPECT_TRUE(scaler.stateDict().empty());
  scaler.loadStateDict({{"scale", 8.0}});  // ignored, as torch ignores it
  EXPECT_EQ(scaler.getScale(), 1.0);
}

// ---- errors ------------------------------------------------------------------------------------

// An optimizer without parameters (SGD and Adam refuse to be built empty).
class EmptyOptimizer : public optim::Optimizer {
 public:
  EmptyOptimizer() : optim::Optimizer("Empty", {{"lr", 0.1}}) {}

 protected:
  void checkOptions(const optim::GroupOptions&) const override {}
  void stepGroup(optim::ParamGroup&) override {}
};

TEST(Errors, BadOptionsNameTheOption) {
  auto bad = [](GradScalerOptions o, const std::string& name) {
    expectError<ValueError>([&] { GradScaler s(o); }, {"GradScaler", name});
  };
  bad({.initScale = 0}, "initScale");
  bad({.initScale = -1}, "initScale");
  bad({.initScale = kInf}, "initScale");
  bad({.initScale = kNaN}, "initScale");
  bad({.initScale = 1e39}, "initScale");   // inf in float32
  bad({.initScale = 1e-50}, "initScale");  // 0 in float32
  bad({.growthFactor = 1.0}, "growthFactor");
  bad({.growthFactor = 0.5}, "growthFactor");
  bad({.growthFactor = kInf}, "growthFactor");
  bad({.growthFactor = kNaN}, "growthFactor");
  bad({.backoffFactor = 0.0}, "backoffFactor");
  bad({.backoffFactor = 1.0}, "backoffFactor");
  bad({.backoffFactor = 1.5}, "backoffFactor");
  bad({.backoffFactor = -0.5}, "backoffFactor");
  bad({.backoffFactor = kNaN}, "backoffFactor");
  bad({.growthInterval = 0}, "growthInterval");
  bad({.growthInterval = -3}, "growthInterval");
  bad({.growthInterval = int64_t{1} << 40}, "growthInterval");
  bad({.growthFactor = 1.0, .enabled = false}, "growthFactor");  // checked when disabled too
}

TEST(Errors, ScaleNeedsAFloatingTensor) {
  GradScaler scaler;
  expectError<ValueError>([&] { scaler.scale(Tensor()); }, {"GradScaler.scale", "undefined"});
  expectError<ValueError>([&] { scaler.scale(arange(3.0, {.dtype = DType::Int64})); },
                          {"GradScaler.scale", "floating-point", "int64"});
  expectError<ValueError>([&] { scaler.scale(full({2}, 1.0, {.dtype = DType::Bool})); }, {"bool"});
}

TEST(Errors, CallOrderMisuse) {
  Tensor p = param({1, 2});
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler;
  expectError<ValueError>([&] { scaler.update(); }, {"GradScaler.update", "no optimizer was unscaled or stepped"});
  setGrad(p, {1, 2});
  scaler.unscale(opt);
  expectError<ValueError>([&] { scaler.unscale(opt); }, {"GradScaler.unscale", "already called", "SGD"});
  EXPECT_TRUE(scaler.step(opt));
  expectError<ValueError>([&] { scaler.step(opt); }, {"GradScaler.step", "already called"});
  expectError<ValueError>([&] { scaler.unscale(opt); }, {"GradScaler.unscale", "after step()"});
  scaler.update();
  expectError<ValueError>([&] { scaler.update(); }, {"no optimizer was unscaled or stepped"});
  // A new iteration works again.
  setGrad(p, {1, 2});
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST(Errors, OptimizersWithoutParametersOrGradients) {
  GradScaler scaler;
  EmptyOptimizer empty;
  expectError<ValueError>([&] { scaler.step(empty); }, {"GradScaler.unscale", "Empty optimizer has no parameters"});
  expectError<ValueError>([&] { scaler.unscale(empty); }, {"has no parameters"});
  Tensor p = param({1, 2});
  optim::SGD opt({p}, {.lr = 0.1});
  expectError<ValueError>([&] { scaler.step(opt); }, {"none of the 1 parameters", "has a gradient", "backward()"});
  EXPECT_EQ(valuesOf(p), (std::vector<double>{1, 2}));
  // Nothing was recorded: after a backward the same iteration goes on.
  setGrad(p, {65536, 0});
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST(Errors, UpdateWithABadScale) {
  GradScaler scaler;
  for (double v : {0.0, -1.0, kInf, kNaN, 1e39})
    expectError<ValueError>([&] { scaler.update(v); }, {"GradScaler.update", "newScale"});
  EXPECT_EQ(scaler.getScale(), 65536.0);
}

// ---- state -------------------------------------------------------------------------------------

GradScalerState trainedState() {
  Tensor p = param({1});
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.initScale = 512, .growthFactor = 3, .backoffFactor = 0.25, .growthInterval = 4});
  for (double g : {1.0, kInf, 1.0, 1.0}) {
    setGrad(p, {g});
    scaler.step(opt);
    scaler.update();
  }
  return scaler.stateDict();
}

TEST(State, RoundTripsScaleTrackerAndOptions) {
  GradScalerState st = trainedState();
  EXPECT_EQ(st, (GradScalerState{{"scale", 128},
                                 {"growth_tracker", 2},
                                 {"growth_factor", 3},
                                 {"backoff_factor", 0.25},
                                 {"growth_interval", 4}}));
  GradScaler other;
  other.loadStateDict(st);
  EXPECT_EQ(other.getScale(), 128.0);
  EXPECT_EQ(other.growthTracker(), 2);
  EXPECT_EQ(other.options().growthFactor, 3.0);
  EXPECT_EQ(other.options().backoffFactor, 0.25);
  EXPECT_EQ(other.options().growthInterval, 4);
  EXPECT_EQ(other.stateDict(), st);
  // Two more clean steps reach the interval of 4: the loaded tracker counts.
  Tensor p = param({1});
  optim::SGD opt({p}, {.lr = 0.1});
  for (int i = 0; i < 2; ++i) {
    setGrad(p, {1});
    other.step(opt);
    other.update();
  }
  EXPECT_EQ(other.getScale(), 384.0);
  EXPECT_EQ(other.growthTracker(), 0);
}

TEST(State, BadStatesAreValueErrorsAndChangeNothing) {
  const GradScalerState good = trainedState();
  auto with = [&](const std::string& k, double v) {
    GradScalerState s = good;
    s[k] = v;
    return s;
  };
  auto without = [&](const std::string& k) {
    GradScalerState s = good;
    s.erase(k);
    return s;
  };
  const std::vector<std::pair<GradScalerState, std::vector<std::string>>> bad = {
      {{}, {"empty", "disabled"}},
      {without("scale"), {"no \"scale\""}},
      {without("growth_tracker"), {"no \"growth_tracker\""}},
      {without("growth_interval"), {"no \"growth_interval\""}},
      {with("bogus", 1), {"unknown entry \"bogus\""}},
      {with("scale", 0), {"initScale", "\"scale\" = 0"}},
      {with("scale", -4), {"initScale"}},
      {with("scale", kInf), {"initScale"}},
      {with("scale", kNaN), {"initScale"}},
      {with("growth_factor", 1), {"growthFactor"}},
      {with("backoff_factor", 2), {"backoffFactor"}},
      {with("growth_interval", 2.5), {"\"growth_interval\" must be an integer"}},
      {with("growth_interval", 0), {"growthInterval"}},
      {with("growth_tracker", -1), {"growth_tracker"}},
      {with("growth_tracker", 1.5), {"growth_tracker"}},
      {with("growth_tracker", 4), {"growth_tracker", "[0, growth_interval = 4)"}},
  };
  for (const auto& entry : bad) {
    const GradScalerState& state = entry.first;
    GradScaler scaler({.initScale = 8, .growthInterval = 7});
    std::vector<std::string> all = entry.second;
    all.push_back("GradScaler.loadStateDict");
    expectError<ValueError>([&] { scaler.loadStateDict(state); }, all);
    EXPECT_EQ(scaler.getScale(), 8.0);
    EXPECT_EQ(scaler.options().growthInterval, 7);
    EXPECT_EQ(scaler.growthTracker(), 0);
  }
}

// ---- training checkpoints ----------------------------------------------------------------------

TEST(Checkpoint, TheScalerStateTravelsInATrainingCheckpoint) {
  TempDir tmp;
  auto model = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  const GradScalerState st = trainedState();
  io::saveCheckpoint(tmp.file("ckpt"), {.model = model->stateDict(), .optimizer = opt.stateDict(), .gradScaler = st});
  EXPECT_EQ(io::loadCheckpoint(tmp.file("ckpt")).gradScaler, std::optional<GradScalerState>(st));
  GradScaler scaler;
  io::restoreCheckpoint(tmp.file("ckpt"), {.model = model.get(), .optimizer = &opt, .gradScaler = &scaler});
  EXPECT_EQ(scaler.stateDict(), st);
  // A disabled scaler saves {} and an enabled one refuses it.
  GradScaler disabled({.enabled = false});
  io::saveCheckpoint(tmp.file("off"), {.gradScaler = disabled.stateDict()});
  EXPECT_EQ(io::loadCheckpoint(tmp.file("off")).gradScaler, std::optional<GradScalerState>(GradScalerState{}));
  io::restoreCheckpoint(tmp.file("off"), {.gradScaler = &disabled});
  expectError<CheckpointError>([&] { io::restoreCheckpoint(tmp.file("off"), {.gradScaler = &scaler}); },
                               {"off", "grad scaler state does not fit", "empty"});
  EXPECT_EQ(scaler.stateDict(), st);
  // A checkpoint without one: no state, and a scaler target is an error naming what is missing.
  io::saveCheckpoint(tmp.file("none"), {.step = 3});
  EXPECT_FALSE(io::loadCheckpoint(tmp.file("none")).gradScaler.has_value());
  expectError<CheckpointError>([&] { io::restoreCheckpoint(tmp.file("none"), {.gradScaler = &scaler}); },
                               {"no grad scaler state"});
  // Values that JSON cannot carry are refused when saving.
  expectError<ValueError>(
      [&] {
        io::saveCheckpoint(tmp.file("nan"), {.gradScaler = GradScalerState{{"scale", kNaN}}});
      },
      {"grad scaler state", "scale"});
}

// Rewrites the "grad_scaler" entry of a checkpoint's state JSON.
void rewriteScaler(const std::string& file, const json& scaler) {
  io::SafetensorsContents c = io::loadSafetensors(file);
  json state = json::parse(c.metadata.at("state"));
  state["grad_scaler"] = scaler;
  c.metadata["state"] = state.dump();
  io::saveSafetensors(file, c.tensors, c.metadata);
}

TEST(Checkpoint, ACorruptScalerStateIsACheckpointErrorAndRestoresNothing) {
  TempDir tmp;
  auto model = std::make_shared<nn::Linear>(3, 2);
  const GradScalerState st = trainedState();
  const std::string file = io::saveCheckpoint(tmp.file("ckpt"), {.model = model->stateDict(), .gradScaler = st});
  auto fresh = std::make_shared<nn::Linear>(3, 2);
  const std::vector<double> before = valuesOf(fresh->parameters()[0]);
  const std::vector<std::pair<json, std::vector<std::string>>> cases = {
      {json("65536"), {"grad_scaler is not a JSON object"}},
      {json{{"scale", "big"}}, {"grad_scaler.scale is not a number"}},
      {json{{"scale", 1024.0}, {"growth_factor", 2.0}}, {"no \"growth_tracker\"", "it has: growth_factor, scale"}},
      {json{{"scale", 1024.0},
            {"growth_factor", 2.0},
            {"backoff_factor", 0.5},
            {"growth_interval", 2.5},
            {"growth_tracker", 0.0}},
       {"\"growth_interval\" must be an integer"}},
      {json{{"scale", -1.0},
            {"growth_factor", 2.0},
            {"backoff_factor", 0.5},
            {"growth_interval", 10.0},
            {"growth_tracker", 0.0}},
       {"initScale"}},
  };
  for (const auto& [scalerJson, parts] : cases) {
    rewriteScaler(file, scalerJson);
    GradScaler scaler({.initScale = 8});
    std::vector<std::string> all = parts;
    all.push_back(file);
    expectError<CheckpointError>(
        [&] { io::restoreCheckpoint(tmp.file("ckpt"), {.model = fresh.get(), .gradScaler = &scaler}); }, all);
    EXPECT_EQ(scaler.getScale(), 8.0);
    EXPECT_EQ(valuesOf(fresh->parameters()[0]), before) << "the model was restored although the scaler failed";
  }
}

}  // namespace
}  // namespace cohort::amp
