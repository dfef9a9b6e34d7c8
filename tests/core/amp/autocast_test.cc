// Autocast: the policy table, op by op against PyTorch 1.13's torch.autocast("cpu") on the same
// inputs (tests/parity/autocast_reference.py through /usr/bin/python3), scopes (nesting,
// disabling, restoring), the weight-cast cache, backward dtypes, activation checkpointing and the
// float32 path left bit for bit as it was.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <cohort/cohort.h>
#include <cohort/core/amp/autocast.h>
#include <cohort/core/io/safetensors.h>

#include "core/test_util.h"

using namespace cohort;
namespace F = cohort::nn::functional;
namespace fs = std::filesystem;

namespace {

using amp::Autocast;
using amp::CastPolicy;

using Outputs = std::vector<Tensor>;
using CaseFn = std::function<Outputs()>;

struct Inputs {
  std::map<std::string, Tensor> t;
  const Tensor& operator[](const std::string& k) const { return t.at(k); }
};

Inputs makeInputs() {
  Generator g(7);
  Inputs in;
  in.t["x"] = randn({4, 8}, {}, &g);
  in.t["x2"] = randn({4, 8}, {}, &g);
  in.t["w"] = randn({6, 8}, {}, &g) * 0.3;
  in.t["b"] = randn({6}, {}, &g);
  in.t["sq"] = randn({8, 8}, {}, &g) * 0.3;
  in.t["y3"] = randn({2, 4, 8}, {}, &g);
  in.t["w3"] = randn({2, 8, 5}, {}, &g) * 0.3;
  in.t["tgt"] = randint(0, 8, {4}, {.dtype = DType::Int64}, &g);
  in.t["idx"] = fromVector(std::vector<int64_t>{3, 0, 2}, {3});
  in.t["idx2"] = randint(0, 8, {4, 3}, {.dtype = DType::Int64}, &g);
  in.t["mask"] = gt(randn({4, 8}, {}, &g), zeros({4, 8}));
  in.t["img"] = randn({1, 2, 6, 6}, {}, &g);
  in.t["kw"] = randn({3, 2, 3, 3}, {}, &g) * 0.3;
  in.t["kb"] = randn({3}, {}, &g);
  in.t["ln_w"] = randn({8}, {}, &g);
  in.t["ln_b"] = randn({8}, {}, &g);
  in.t["q"] = randn({1, 2, 5, 8}, {}, &g);
  in.t["k"] = randn({1, 2, 5, 8}, {}, &g);
  in.t["v"] = randn({1, 2, 5, 8}, {}, &g);
  return in;
}

// The cases of autocast_reference.py, in cohort. Each names the op of the policy table it covers
// (the part before the first '_').
std::map<std::string, CaseFn> cases(const Inputs& t, DType half) {
  auto h = [half](const Tensor& a) { return a.to(half); };
  Tensor x = t["x"], x2 = t["x2"], w = t["w"], b = t["b"], sq = t["sq"], y3 = t["y3"], w3 = t["w3"];
  Tensor tgt = t["tgt"], idx = t["idx"], idx2 = t["idx2"], mask = t["mask"], img = t["img"];
  Tensor pos = x.abs() + 0.5;
  Tensor hx = h(x), hx2 = h(x2), hpos = h(pos), himg = h(img);
  auto one = [](Tensor r) { return Outputs{std::move(r)}; };
  auto two = [](std::pair<Tensor, Tensor> r) { return Outputs{r.first, r.second}; };
  const Tensor q = t["q"], k = t["k"], v = t["v"];
  const F::Conv2dOptions pad1{.padding = {1, 1}};
  const F::Pool2dOptions pool{.kernel = {2, 2}};
  return {
      {"mm_f32", [=] { return one(mm(x, sq)); }},
      {"mm_half", [=] { return one(mm(hx, h(sq))); }},
      {"bmm_f32", [=] { return one(bmm(y3, w3)); }},
      {"matmul_f32", [=] { return one(matmul(y3, sq)); }},
      {"matmul_mixed", [=] { return one(matmul(hx, sq)); }},
      {"linear_f32", [=] { return one(linear(x, w, b)); }},
      {"addmm_f32", [=] { return one(addmm(b, x, w.t())); }},
      {"conv2d_f32", [=] { return one(F::conv2d(img, t["kw"], t["kb"], pad1)); }},
      {"sdpa_f32", [=] { return one(F::scaledDotProductAttention(q, k, v)); }},
      {"crossEntropy_half", [=] { return one(F::crossEntropy(hx, tgt)); }},
      {"crossEntropy_f32", [=] { return one(F::crossEntropy(x, tgt)); }},
      {"nllLoss_half", [=] { return one(F::nllLoss(h(F::logSoftmax(x, -1)), tgt)); }},
      {"mseLoss_half", [=] { return one(F::mseLoss(hx, hx2)); }},
      {"softmax_half", [=] { return one(F::softmax(hx, -1)); }},
      {"softmax_f32", [=] { return one(F::softmax(x, -1)); }},
      {"logSoftmax_half", [=] { return one(F::logSoftmax(hx, -1)); }},
      {"layerNorm_half", [=] { return one(F::layerNorm(hx, {8})); }},
      {"layerNorm_f32", [=] { return one(F::layerNorm(x, {8}, t["ln_w"], t["ln_b"])); }},
      {"exp_half", [=] { return one(exp(hx)); }},
      {"log_half", [=] { return one(log(hpos)); }},
      {"pow_half", [=] { return one(pow(hx, 2)); }},
      {"rsqrt_half", [=] { return one(rsqrt(hpos)); }},
      {"sqrt_half", [=] { return one(sqrt(hpos)); }},
      {"abs_half", [=] { return one(abs(hx)); }},
      {"neg_half", [=] { return one(neg(hx)); }},
      {"tanh_half", [=] { return one(tanh(hx)); }},
      {"sigmoid_half", [=] { return one(sigmoid(hx)); }},
      {"relu_half", [=] { return one(relu(hx)); }},
      {"gelu_half", [=] { return one(gelu(hx)); }},
      {"silu_half", [=] { return one(silu(hx)); }},
      {"clamp_half", [=] { return one(clamp(hx, -0.5, 0.5)); }},
      {"dropout_half", [=] { return one(F::dropout(hx, 0.5, false)); }},
      {"add_mixed", [=] { return one(add(hx, x2)); }},
      {"sub_mixed", [=] { return one(sub(hx, x2)); }},
      {"rsub_half", [=] { return one(rsub(hx, 2.0)); }},
      {"mul_mixed", [=] { return one(mul(hx, x2)); }},
      {"div_mixed", [=] { return one(div(hx, x2.abs() + 1)); }},
      {"add_half", [=] { return one(add(hx, hx2)); }},
      {"maximum_mixed", [=] { return one(maximum(hx, x2)); }},
      {"minimum_mixed", [=] { return one(minimum(hx, x2)); }},
      {"where_mixed", [=] { return one(where(mask, hx, x2)); }},
      {"eq_mixed", [=] { return one(eq(hx, x2)); }},
      {"ne_mixed", [=] { return one(ne(hx, x2)); }},
      {"lt_mixed", [=] { return one(lt(hx, x2)); }},
      {"le_mixed", [=] { return one(le(hx, x2)); }},
      {"gt_mixed", [=] { return one(gt(hx, x2)); }},
      {"ge_mixed", [=] { return one(ge(hx, x2)); }},
      {"sum_half", [=] { return one(sum(hx)); }},
      {"sum_dim_half", [=] { return one(sum(hx, {1})); }},
      {"mean_half", [=] { return one(mean(hx, {1})); }},
      {"norm_half", [=] { return one(norm(hx)); }},
      {"var_half", [=] { return one(var(hx, {1})); }},
      {"std_half", [=] { return one(cohort::std(hx, {1})); }},
      {"amax_half", [=] { return one(amax(hx, {1})); }},
      {"amin_half", [=] { return one(amin(hx, {1})); }},
      {"max_half", [=] { return two(max(hx, 1)); }},
      {"min_half", [=] { return two(min(hx, 1)); }},
      {"argmax_half", [=] { return one(argmax(hx, 1)); }},
      {"argmin_half", [=] { return one(argmin(hx, 1)); }},
      {"cat_mixed",
       [=] {
         return one(cat({hx, x2}));
       }},
      {"stack_mixed",
       [=] {
         return one(stack({hx, x2}));
       }},
      {"cat_half",
       [=] {
         return one(cat({hx, hx2}));
       }},
      {"embedding_f32", [=] { return one(F::embedding(tgt, sq)); }},
      {"indexSelect_half", [=] { return one(indexSelect(hx, 0, idx)); }},
      {"gather_half", [=] { return one(gather(hx, 1, idx2)); }},
      {"scatterAdd_half", [=] { return one(scatterAdd(hx, 1, idx2, hx2.slice(1, 0, 3))); }},
      {"maskedFill_half", [=] { return one(maskedFill(hx, mask, 0.5)); }},
      {"tril_half", [=] { return one(tril(hx)); }},
      {"triu_half", [=] { return one(triu(hx)); }},
      {"oneHot", [=] { return one(oneHot(tgt, 8)); }},
      {"maxPool2d_half", [=] { return one(F::maxPool2d(himg, pool)); }},
      {"avgPool2d_half", [=] { return one(F::avgPool2d(himg, pool)); }},
  };
}

std::string opOf(const std::string& caseName) {
  std::string op = caseName.substr(0, caseName.find('_'));
  return op == "sdpa" ? "scaledDotProductAttention" : op;
}

struct Reference {
  std::map<std::string, Tensor> outputs;
  std::map<std::string, std::string> errors;
};

// Runs the PyTorch side once (bfloat16: PyTorch 1.13's CPU autocast has no float16).
const Reference& reference() {
  static const Reference* ref = [] {
    auto* r = new Reference();
    fs::path dir = fs::temp_directory_path() / fmt::format("cohort_autocast_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    io::TensorDict dict;
    for (auto& [k, v] : makeInputs().t) dict.insert(k, v);
    io::saveSafetensors((dir / "inputs.safetensors").string(), dict);
    fs::path script = fs::path(COHORT_SOURCE_DIR) / "tests" / "parity" / "autocast_reference.py";
    std::string cmd = fmt::format("/usr/bin/python3 {} {} 2>&1", script.string(), dir.string());
    auto [status, out] = cohort::testing::runCommand(cmd);
    EXPECT_EQ(status, 0) << cmd << "\n" << out;
    if (status == 0) {
      for (auto& [k, v] : io::loadSafetensors((dir / "outputs.safetensors").string()).tensors) r->outputs[k] = v;
      std::ifstream f(dir / "errors.json");
      nlohmann::json e = nlohmann::json::parse(f);
      for (auto& [k, v] : e.items()) r->errors[k] = v.get<std::string>();
    }
    fs::remove_all(dir);
    return r;
  }();
  return *ref;
}

class AutocastVsTorch : public ::testing::TestWithParam<DType> {};

// Every case: the output dtypes are PyTorch's and the values agree within bfloat16's rounding (a
// few units in the last place: the libraries round intermediate results differently), or both
// reject the inputs. Under float16 autocast the policy is the same with float16 where PyTorch's
// bfloat16 run gives bfloat16, and the values agree with PyTorch's bfloat16 ones within bfloat16's
// rounding (float16 rounds finer).
TEST_P(AutocastVsTorch, EveryOpGivesPyTorchsDtypeAndValues) {
  DType half = GetParam();
  const Reference& ref = reference();
  ASSERT_FALSE(ref.outputs.empty());
  Inputs in = makeInputs();
  auto all = cases(in, half);
  const double tol = 2.0 / 128;
  Autocast guard(DeviceType::CPU, half);
  for (auto& [name, fn] : all) {
    SCOPED_TRACE(name);
    auto err = ref.errors.find(name);
    if (err != ref.errors.end()) {
      EXPECT_THROW(fn(), Error) << "PyTorch rejects " << name << ": " << err->second;
      continue;
    }
    Outputs got = fn();
    for (size_t i = 0; i < got.size(); ++i) {
      std::string key = got.size() == 1 ? name : fmt::format("{}.{}", name, i);
      auto it = ref.outputs.find(key);
      ASSERT_NE(it, ref.outputs.end()) << "no PyTorch output " << key;
      const Tensor& want = it->second;
      DType wantDType = want.dtype() == DType::BFloat16 ? half : want.dtype();
      EXPECT_EQ(got[i].dtype(), wantDType)
          << key << ": cohort " << dtypeName(got[i].dtype()) << ", PyTorch " << dtypeName(wantDType);
      ASSERT_EQ(got[i].sizes(), want.sizes()) << key;
      if (!isFloating(want.dtype())) {
        EXPECT_TRUE(cohort::testing::sameBits(got[i].to(DType::Int64), want.to(DType::Int64)))
            << key << "\ncohort " << got[i] << "\nPyTorch " << want;
        continue;
      }
      Tensor g64 = got[i].to(DType::Float64), w64 = want.to(DType::Float64);
      double worst = ((g64 - w64).abs() - (w64.abs() + 1.0) * tol).max().item<double>();
      EXPECT_LE(worst, 0.0) << key << "\ncohort " << got[i] << "\nPyTorch " << want;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Half, AutocastVsTorch, ::testing::Values(DType::BFloat16, DType::Float16),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

TEST(AutocastPolicy, EveryOpOfTheTableHasACaseAndEveryCaseAnOp) {
  Inputs in = makeInputs();
  std::set<std::string> covered;
  for (auto& [name, fn] : cases(in, DType::BFloat16)) {
    std::string op = opOf(name);
    EXPECT_NO_THROW(amp::policyFor(op)) << name;
    covered.insert(op);
  }
  std::set<std::string> seen;
  for (const amp::OpPolicy& p : amp::policyTable()) {
    EXPECT_TRUE(seen.insert(std::string(p.op)).second) << "listed twice: " << p.op;
    EXPECT_TRUE(covered.count(std::string(p.op))) << "no test case for " << p.op;
  }
}

TEST(AutocastPolicy, TableIsPrintableAndUnknownOpsAreNamed) {
  std::string s = amp::policyTableString();
  for (const amp::OpPolicy& p : amp::policyTable()) EXPECT_NE(s.find(std::string(p.op)), std::string::npos) << p.op;
  EXPECT_NE(s.find("lower_precision"), std::string::npos);
  EXPECT_EQ(amp::policyFor("linear").cpu, CastPolicy::LowerPrecision);
  EXPECT_EQ(amp::policyFor("crossEntropy").cpu, CastPolicy::Float32);
  EXPECT_EQ(amp::policyFor("softmax").cuda, CastPolicy::Float32);
  cohort::testing::expectError<NotSupportedError>([] { amp::policyFor("frobnicate"); }, {"frobnicate", "policyTable"});
}

TEST(AutocastScope, NestsDisablesAndRestores) {
  EXPECT_FALSE(amp::isEnabled());
  Tensor a = randn({3, 4}), b = randn({4, 2});
  EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
  {
    Autocast outer(DeviceType::CPU, DType::BFloat16);
    EXPECT_TRUE(amp::isEnabled());
    EXPECT_EQ(mm(a, b).dtype(), DType::BFloat16);
    {
      Autocast off(DeviceType::CPU, DType::BFloat16, {.enabled = false});
      EXPECT_FALSE(amp::isEnabled());
      EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
      {
        Autocast inner(DeviceType::CPU, DType::Float16);
        EXPECT_EQ(mm(a, b).dtype(), DType::Float16);
      }
      EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
    }
    EXPECT_EQ(amp::autocastDType(), DType::BFloat16);
    EXPECT_EQ(mm(a, b).dtype(), DType::BFloat16);
    // CUDA autocast does not touch CPU tensors.
    Autocast cuda(DeviceType::CUDA, DType::Float16);
    EXPECT_TRUE(amp::isEnabled(DeviceType::CUDA));
    EXPECT_EQ(mm(a, b).dtype(), DType::BFloat16);
  }
  EXPECT_FALSE(amp::isEnabled());
  EXPECT_FALSE(amp::isEnabled(DeviceType::CUDA));
  EXPECT_EQ(mm(a, b).dtype(), DType::Float32);
  EXPECT_EQ(amp::cachedCasts(), 0u);
}

TEST(AutocastScope, OtherThreadsAreNotAffected) {
  Autocast guard(DeviceType::CPU, DType::BFloat16);
  DType there = DType::Float64;
  std::thread([&] { there = mm(randn({2, 2}), randn({2, 2})).dtype(); }).join();
  EXPECT_EQ(there, DType::Float32);
}

TEST(AutocastScope, BadArgumentsAreValueErrors) {
  cohort::testing::expectError<ValueError>([] { Autocast a(DeviceType::CPU, DType::Float32); },
                                           {"Autocast", "bfloat16 or float16", "float32"});
  cohort::testing::expectError<ValueError>([] { Autocast a(DeviceType::CPU, DType::Int64); }, {"int64"});
}

TEST(AutocastScope, Float64AndIntegerTensorsAreNeverCast) {
  Autocast guard(DeviceType::CPU, DType::BFloat16);
  Tensor a = randn({3, 3}, {.dtype = DType::Float64});
  EXPECT_EQ(mm(a, a).dtype(), DType::Float64);
  EXPECT_EQ(F::crossEntropy(a, fromVector(std::vector<int64_t>{0, 1, 2}, {3})).dtype(), DType::Float64);
}

TEST(AutocastCache, EachWeightIsCastOncePerScopeAndUpdatesAreSeen) {
  nn::Linear lin(8, 4);
  Tensor x = randn({2, 8});
  {
    Autocast guard(DeviceType::CPU, DType::BFloat16);
    Tensor y1 = lin.forward(x), y2 = lin.forward(x);
    EXPECT_EQ(y1.dtype(), DType::BFloat16);
    EXPECT_EQ(amp::cachedCasts(), 2u);  // weight and bias, once each
    EXPECT_TRUE(cohort::testing::sameBits(y1, y2));
    // An in-place update of the weight inside the scope is seen (the cache is keyed by version).
    {
      autograd::NoGradGuard ng;
      Tensor weight = lin.weight();
      weight.mul_(2.0);
    }
    Tensor y3 = lin.forward(x);
    EXPECT_FALSE(cohort::testing::sameBits(y1, y3));
    Tensor want;
    {
      Autocast off(DeviceType::CPU, DType::BFloat16, {.enabled = false});
      want = linear(x.to(DType::BFloat16), lin.weight().to(DType::BFloat16), lin.bias().to(DType::BFloat16));
    }
    EXPECT_TRUE(cohort::testing::sameBits(y3, want));
  }
  EXPECT_EQ(amp::cachedCasts(), 0u);
  {
    Autocast guard(DeviceType::CPU, DType::BFloat16, {.cacheEnabled = false});
    lin.forward(x);
    EXPECT_EQ(amp::cachedCasts(), 0u);
  }
}

TEST(AutocastCache, CastsMadeWithoutGradAreNotReusedWithGrad) {
  nn::Linear lin(8, 4);
  Tensor x = randn({2, 8});
  Autocast guard(DeviceType::CPU, DType::BFloat16);
  {
    autograd::NoGradGuard ng;
    lin.forward(x);
  }
  Tensor y = lin.forward(x);
  sum(y.to(DType::Float32)).backward();
  ASSERT_TRUE(lin.weight().grad().defined());
  EXPECT_GT(lin.weight().grad().abs().sum().item<double>(), 0.0);
}

TEST(AutocastBackward, GradientsComeBackInTheWeightsDtype) {
  nn::Linear lin(8, 4);
  Tensor x = randn({3, 8}, {.requiresGrad = true});
  Tensor loss;
  {
    Autocast guard(DeviceType::CPU, DType::BFloat16);
    Tensor y = lin.forward(x);
    EXPECT_EQ(y.dtype(), DType::BFloat16);
    loss = F::mseLoss(y, zeros({3, 4}));
    EXPECT_EQ(loss.dtype(), DType::Float32);
    loss.backward();  // inside the scope: backward functions still run in the forward's dtypes
  }
  EXPECT_EQ(lin.weight().grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  // The same gradients as the model run by hand in bfloat16.
  Tensor w = lin.weight().detach().setRequiresGrad(true), xb = x.detach().setRequiresGrad(true);
  Tensor yb = linear(xb.to(DType::BFloat16), w.to(DType::BFloat16), lin.bias().detach().to(DType::BFloat16));
  F::mseLoss(yb.to(DType::Float32), zeros({3, 4})).backward();
  EXPECT_TRUE(cohort::testing::sameBits(w.grad(), lin.weight().grad()));
  EXPECT_TRUE(cohort::testing::sameBits(xb.grad(), x.grad()));
}

TEST(AutocastCheckpoint, RecomputationRunsInTheForwardsDtypes) {
  nn::Linear lin(8, 8);
  Tensor x = randn({2, 8}, {.requiresGrad = true});
  Tensor out;
  {
    Autocast guard(DeviceType::CPU, DType::BFloat16);
    out = autograd::checkpoint(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(lin.forward(in[0]))}; }, {x})[0];
    EXPECT_EQ(out.dtype(), DType::BFloat16);
  }
  // Backward outside the scope: the recomputation must still give bfloat16 (it checks).
  sum(out.to(DType::Float32)).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
}

TEST(AutocastFloat32, DisabledScopeLeavesFloat32BitForBit) {
  // The dispatch hook must not change float32 results: a model run with no scope and inside a
  // disabled one gives the same bits, forward and backward.
  manualSeed(3);
  nn::Linear a(16, 16), b(16, 4);
  Tensor x = randn({5, 16});
  auto run = [&] {
    a.zeroGrad();
    b.zeroGrad();
    Tensor loss = F::crossEntropy(b.forward(relu(a.forward(x))), fromVector(std::vector<int64_t>{0, 1, 2, 3, 0}, {5}));
    loss.backward();
    return std::vector<Tensor>{loss.detach().clone(), a.weight().grad().clone(), b.weight().grad().clone()};
  };
  auto plain = run();
  std::vector<Tensor> off;
  {
    Autocast guard(DeviceType::CPU, DType::BFloat16, {.enabled = false});
    off = run();
  }
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(cohort::testing::sameBits(plain[i], off[i])) << i;
}

}  // namespace
