// nn::Module mechanics (names, state dicts, hooks, modes, dtype conversion), layer defaults and
// forward values against PyTorch 1.13, and the GPT model.
//
// Reference values: /usr/bin/python3 with torch 1.13, filling every state-dict tensor (in
// state_dict order, k = 0, 1, ...) with fill(n, k)[i] = ((i*7 + k*13) % 23 - 11) / 40 and feeding
// inputs made the same way; the GPT and attention modules are tests/parity/torch_reference.py's.
// Printed with 9 significant digits.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include <cohort/cohort.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/optim/optim.h>

using namespace cohort;

namespace {

Tensor fill(const Shape& shape, int64_t k) {
  int64_t n = shapeNumel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>((i * 7 + k * 13) % 23 - 11) / 40.0);
  return fromVector<float>(v, shape);
}

// Loads fill(.., k) into the k-th state-dict entry, as the Python side does.
void fillModule(nn::Module& m) {
  nn::StateDict sd = m.stateDict();
  nn::StateDict values;
  int64_t k = 0;
  for (const auto& [name, t] : sd) values.insert(name, fill(t.sizes(), k++));
  // Tied tensors: the later key wins, in both implementations (they copy in order).
  autograd::NoGradGuard ng;
  for (auto& [name, t] : sd) {
    Tensor dst = t;
    dst.copy_(values[name]);
  }
}

void expectClose(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  std::vector<double> got = t.toVector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
}

// A two-level module for the mechanics tests.
class Inner : public nn::Module {
 public:
  Inner() : Module("Inner") {
    registerParameter("w", ones({2, 2}));
    registerBuffer("count", zeros({1}));
    registerBuffer("scratch", zeros({3}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return matmul(x, parameter("w")); }
};

class Outer : public nn::Module {
 public:
  Outer() : Module("Outer") {
    registerParameter("scale", full({2}, 2.0));
    registerModule("first", Inner());
    registerModule("second", std::make_shared<Inner>());
    registerParameter("bias", zeros({2}));
  }
  Tensor forward(const Tensor& x) override {
    return (*child("second"))((*child("first"))(x)) * parameter("scale") + parameter("bias");
  }
};

std::vector<std::string> keysOf(const nn::OrderedDict<Tensor>& d) { return d.keys(); }

}  // namespace

// ---- registration, names and traversal -------------------------------------------------------

TEST(Module, NamesFollowRegistrationOrder) {
  Outer m;
  EXPECT_EQ(keysOf(m.namedParameters()), (std::vector<std::string>{"scale", "bias", "first.w", "second.w"}));
  EXPECT_EQ(keysOf(m.namedParameters(false)), (std::vector<std::string>{"scale", "bias"}));
  EXPECT_EQ(keysOf(m.namedBuffers()),
            (std::vector<std::string>{"first.count", "first.scratch", "second.count", "second.scratch"}));
  // State dict: own parameters, own persistent buffers, then children in order.
  EXPECT_EQ(keysOf(m.stateDict()),
            (std::vector<std::string>{"scale", "bias", "first.w", "first.count", "second.w", "second.count"}));
  auto mods = m.namedModules();
  ASSERT_EQ(mods.size(), 3u);
  EXPECT_EQ(mods[0].first, "");
  EXPECT_EQ(mods[1].first, "first");
  EXPECT_EQ(mods[2].first, "second");
  EXPECT_EQ(m.children().size(), 2u);
  EXPECT_EQ(m.numParameters(), 2 + 2 + 4 + 4);
  for (const Tensor& p : m.parameters()) EXPECT_TRUE(p.requiresGrad());
  // apply visits children first, then the module itself.
  std::vector<std::string> visited;
  m.apply([&](nn::Module& x) { visited.push_back(x.name()); });
  EXPECT_EQ(visited, (std::vector<std::string>{"Inner", "Inner", "Outer"}));
}

TEST(Module, RegistrationErrors) {
  Outer m;
  EXPECT_THROW(m.registerParameter("scale", zeros({1})), ValueError);  // taken
  EXPECT_THROW(m.registerParameter("a.b", zeros({1})), ValueError);    // dot
  EXPECT_THROW(m.registerParameter("", zeros({1})), ValueError);
  EXPECT_THROW(m.registerParameter("i", zeros({1}, {.dtype = DType::Int64})), ValueError);
  EXPECT_THROW(m.registerModule("first", nn::ReLU()), ValueError);
  EXPECT_THROW(m.parameter("nope"), ValueError);
  EXPECT_THROW(m.replaceParameter("scale", zeros({3})), ValueError);
}

TEST(Module, GPTNamesAndWeightTying) {
  manualSeed(0);
  nn::GPT gpt({.vocabSize = 11, .blockSize = 8, .nLayer = 2, .nHead = 2, .nEmbd = 8});
  auto names = keysOf(gpt.namedParameters());
  std::vector<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      want.push_back("transformer.h." + std::to_string(i) + "." + s);
  want.push_back("transformer.ln_f.weight");
  want.push_back("transformer.ln_f.bias");
  EXPECT_EQ(names, want);  // lm_head.weight is the tied wte weight: listed once
  auto sd = gpt.stateDict();
  ASSERT_TRUE(sd.contains("lm_head.weight"));
  EXPECT_EQ(sd.size(), want.size() + 1);
  EXPECT_EQ(sd["lm_head.weight"].storage(), sd["transformer.wte.weight"].storage());
  EXPECT_FALSE(sd.contains("transformer.h.0.attn.mask"));  // non-persistent

  nn::GPT untied({.vocabSize = 11, .blockSize = 8, .nLayer = 1, .nHead = 2, .nEmbd = 8, .tieWeights = false});
  EXPECT_TRUE(untied.namedParameters().contains("lm_head.weight"));
}

TEST(Module, GPTInitialisationFollowsNanoGPT) {
  manualSeed(1);
  const int64_t nLayer = 3;
  nn::GPT gpt({.vocabSize = 64, .blockSize = 32, .nLayer = nLayer, .nHead = 4, .nEmbd = 64});
  auto stddev = [](const Tensor& t) {
    std::vector<double> v = t.toVector<double>();
    double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    double s = 0;
    for (double x : v) s += (x - mean) * (x - mean);
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  auto params = gpt.namedParameters();
  EXPECT_NEAR(stddev(params["transformer.h.0.attn.c_attn.weight"]), 0.02, 0.002);
  EXPECT_NEAR(stddev(params["transformer.h.1.mlp.c_fc.weight"]), 0.02, 0.002);
  EXPECT_NEAR(stddev(params["transformer.wte.weight"]), 0.02, 0.002);
  EXPECT_NEAR(stddev(params["transformer.h.2.mlp.c_proj.weight"]), 0.02 / std::sqrt(2.0 * nLayer), 0.002);
  EXPECT_NEAR(stddev(params["transformer.h.0.attn.c_proj.weight"]), 0.02 / std::sqrt(2.0 * nLayer), 0.002);
  for (double b : params["transformer.h.0.attn.c_attn.bias"].toVector<double>()) EXPECT_EQ(b, 0.0);
  for (double w : params["transformer.ln_f.weight"].toVector<double>()) EXPECT_EQ(w, 1.0);
  // Same seed, same model.
  manualSeed(1);
  nn::GPT again({.vocabSize = 64, .blockSize = 32, .nLayer = nLayer, .nHead = 4, .nEmbd = 64});
  auto p2 = again.namedParameters();
  for (const auto& [k, t] : params) EXPECT_EQ(t.toVector<float>(), p2[k].toVector<float>()) << k;
}

// ---- state dicts -----------------------------------------------------------------------------

TEST(Module, StateDictRoundTripCopiesInPlace) {
  manualSeed(3);
  nn::Sequential a(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  manualSeed(4);
  nn::Sequential b(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  EXPECT_EQ(keysOf(a.stateDict()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  std::vector<Tensor> handles = b.parameters();
  std::vector<const TensorImpl*> impls;
  for (const Tensor& t : handles) impls.push_back(t.impl());
  optim::SGD opt(b.parameters(), {.lr = 0.1});

  auto res = b.loadStateDict(a.stateDict());
  EXPECT_TRUE(res.ok());
  auto pa = a.namedParameters(), pb = b.namedParameters();
  for (const auto& [k, t] : pa) EXPECT_EQ(t.toVector<float>(), pb[k].toVector<float>()) << k;
  // Same tensors as before (the optimizer's handles see the loaded values).
  std::vector<Tensor> after = b.parameters();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].impl(), impls[i]);
  EXPECT_EQ(opt.parameters()[0].toVector<float>(), pa["0.weight"].toVector<float>());
  // The loaded values are copies: changing a does not change b.
  {
    autograd::NoGradGuard ng;
    Tensor w = a.namedParameters()["0.weight"];
    w.fill_(7.0);
  }
  EXPECT_NE(b.namedParameters()["0.weight"].toVector<float>()[0], 7.0f);
}

TEST(Module, StrictLoadListsEveryOffenderAndWritesNothing) {
  Outer m;
  nn::StateDict sd = m.stateDict();
  nn::StateDict bad;
  for (const auto& [k, t] : sd) {
    if (k == "first.w") continue;                // missing
    if (k == "bias") bad.insert(k, zeros({3}));  // wrong shape
    else bad.insert(k, full(t.sizes(), 5.0, {.dtype = t.dtype()}));
  }
  bad.insert("third.w", zeros({2, 2}));  // unexpected
  bad.insert("extra", zeros({1}));       // unexpected
  try {
    m.loadStateDict(bad);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    for (const char* s : {"first.w", "bias", "[3]", "[2]", "third.w", "extra", "missing", "unexpected", "Outer"})
      EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
  }
  // Nothing was written.
  EXPECT_EQ(m.parameter("scale").toVector<float>(), (std::vector<float>{2, 2}));
  // Non-strict still refuses a mis-shaped key ...
  EXPECT_THROW(m.loadStateDict(bad, /*strict=*/false), ValueError);
  EXPECT_EQ(m.parameter("scale").toVector<float>(), (std::vector<float>{2, 2}));
  // ... and reports missing and unexpected keys when shapes agree.
  bad.set("bias", full({2}, 5.0));
  auto res = m.loadStateDict(bad, /*strict=*/false);
  EXPECT_EQ(res.missingKeys, (std::vector<std::string>{"first.w"}));
  EXPECT_EQ(res.unexpectedKeys, (std::vector<std::string>{"third.w", "extra"}));
  EXPECT_EQ(m.parameter("scale").toVector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(m.parameter("bias").toVector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(std::dynamic_pointer_cast<Inner>(m.child("first"))->parameter("w").toVector<float>(),
            (std::vector<float>{1, 1, 1, 1}));
}

TEST(Module, LoadConvertsDtype) {
  nn::Linear lin(2, 2);
  nn::StateDict sd;
  sd.insert("weight", fromVector<double>({1, 2, 3, 4}, {2, 2}));
  sd.insert("bias", fromVector<double>({0.5, -0.5}));
  lin.loadStateDict(sd);
  EXPECT_EQ(lin.weight().dtype(), DType::Float32);
  EXPECT_EQ(lin.weight().toVector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

// ---- hooks -----------------------------------------------------------------------------------

TEST(Module, ForwardHooksRunInOrderAndAreRemovable) {
  nn::Linear lin(2, 2);
  {
    nn::StateDict sd;
    sd.insert("weight", fromVector<float>({1, 0, 0, 1}, {2, 2}));
    sd.insert("bias", zeros({2}));
    lin.loadStateDict(sd);
  }
  std::vector<std::string> log;
  auto h1 = lin.registerForwardPreHook([&](nn::Module& m, nn::TensorList& in) {
    log.push_back("pre1:" + m.name());
    in[0] = in[0] * 2.0;  // replace the input
  });
  auto h2 = lin.registerForwardPreHook([&](nn::Module&, nn::TensorList&) { log.push_back("pre2"); });
  auto h0 = lin.registerForwardPreHook([&](nn::Module&, nn::TensorList&) { log.push_back("pre0"); },
                                       /*prepend=*/true);
  auto p1 = lin.registerForwardHook([&](nn::Module&, const nn::TensorList& in, nn::TensorList& out) {
    log.push_back("post1");
    EXPECT_EQ(in[0].toVector<float>(), (std::vector<float>{2, 4}));  // sees the replaced input
    out[0] = out[0] + 1.0;                                           // replace the output
  });
  Tensor y = lin(fromVector<float>({1, 2}, {1, 2}));
  EXPECT_EQ(y.toVector<float>(), (std::vector<float>{3, 5}));
  EXPECT_EQ(log, (std::vector<std::string>{"pre0", "pre1:Linear", "pre2", "post1"}));

  EXPECT_TRUE(h1.active());
  h1.remove();
  h1.remove();  // twice is harmless
  EXPECT_FALSE(h1.active());
  p1.remove();
  log.clear();
  y = lin(fromVector<float>({1, 2}, {1, 2}));
  EXPECT_EQ(y.toVector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(log, (std::vector<std::string>{"pre0", "pre2"}));

  // Hooks on children run when a container calls them; handles survive moving the module.
  nn::Sequential seq;
  nn::ReLU relu;
  int calls = 0;
  auto hr = relu.registerForwardHook([&](nn::Module&, const nn::TensorList&, nn::TensorList&) { ++calls; });
  seq.push_back(std::move(relu));
  seq(fromVector<float>({-1, 1}));
  EXPECT_EQ(calls, 1);
  hr.remove();
  seq(fromVector<float>({-1, 1}));
  EXPECT_EQ(calls, 1);
  h0.remove();
  h2.remove();
}

TEST(Module, MultiInputModulesAndMissingForward) {
  class Add : public nn::Module {
   public:
    Add() : Module("Add") {}
    nn::TensorList forwardMulti(const nn::TensorList& in) override { return {in[0] + in[1], in[0] - in[1]}; }
  };
  Add add;
  int pre = 0;
  add.registerForwardPreHook([&](nn::Module&, nn::TensorList& in) { pre += static_cast<int>(in.size()); });
  auto out = add.call({fromVector<float>({3}), fromVector<float>({1})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].item<float>(), 4.0f);
  EXPECT_EQ(out[1].item<float>(), 2.0f);
  EXPECT_EQ(pre, 2);
  nn::Module bare("Bare");
  EXPECT_THROW(bare(zeros({1})), NotSupportedError);
}

// ---- modes, zeroGrad, dtype ------------------------------------------------------------------

TEST(Module, TrainEvalControlsDropout) {
  nn::Sequential seq(nn::Linear(4, 4), nn::Dropout(0.5));
  EXPECT_TRUE(seq.isTraining());
  seq.eval();
  EXPECT_FALSE(seq.isTraining());
  EXPECT_FALSE(seq[1]->isTraining());
  Tensor x = ones({64, 4});
  Tensor a = seq(x), b = seq(x);
  EXPECT_EQ(a.toVector<float>(), b.toVector<float>());  // eval: deterministic, no dropout
  seq.train();
  EXPECT_TRUE(seq[1]->isTraining());
  nn::Dropout drop(0.5);
  Tensor y = drop(ones({1000}));
  int zerosCount = 0;
  for (float v : y.toVector<float>()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    zerosCount += v == 0.0f;
  }
  EXPECT_GT(zerosCount, 400);
  EXPECT_LT(zerosCount, 600);
  drop.eval();
  EXPECT_EQ(drop(ones({10})).toVector<float>(), std::vector<float>(10, 1.0f));
}

TEST(Module, ZeroGrad) {
  nn::Linear lin(3, 2);
  lin(ones({1, 3})).sum().backward();
  ASSERT_TRUE(lin.weight().grad().defined());
  lin.zeroGrad(/*setToNone=*/false);
  EXPECT_EQ(lin.weight().grad().toVector<float>(), std::vector<float>(6, 0.0f));
  lin.zeroGrad();
  EXPECT_FALSE(lin.weight().grad().defined());
  EXPECT_FALSE(lin.bias().grad().defined());
}

TEST(Module, ToDtypeKeepsHandles) {
  manualSeed(5);
  nn::Sequential seq(nn::Linear(3, 4), nn::LayerNorm(4));
  std::vector<Tensor> params = seq.parameters();
  std::vector<std::vector<float>> before;
  for (const Tensor& p : params) before.push_back(p.toVector<float>());
  seq.to(DType::Float64);
  std::vector<Tensor> after = seq.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(after[i].impl(), params[i].impl());  // the same tensors ...
    EXPECT_EQ(params[i].dtype(), DType::Float64);  // ... seen through the old handles too
    EXPECT_TRUE(params[i].requiresGrad());
    std::vector<double> now = params[i].toVector<double>();
    for (size_t j = 0; j < now.size(); ++j) EXPECT_EQ(now[j], static_cast<double>(before[i][j]));
  }
  Tensor y = seq(ones({2, 3}, {.dtype = DType::Float64}));
  EXPECT_EQ(y.dtype(), DType::Float64);
  seq.to(DType::BFloat16);
  EXPECT_EQ(params[0].dtype(), DType::BFloat16);
  EXPECT_THROW(seq.to(DType::Int32), ValueError);
  // An optimizer made before the conversion steps the converted tensors.
  nn::Linear lin(2, 2);
  optim::SGD opt(lin.parameters(), {.lr = 1.0});
  lin.to(DType::Float64);
  lin(ones({1, 2}, {.dtype = DType::Float64})).sum().backward();
  std::vector<double> w = lin.weight().toVector<double>();
  opt.step();
  std::vector<double> w2 = lin.weight().toVector<double>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_DOUBLE_EQ(w2[i], w[i] - 1.0);
}

// ---- default initialisation ------------------------------------------------------------------

namespace {
void expectUniform(const Tensor& t, double bound) {
  std::vector<double> v = t.toVector<double>();
  double mean = 0, sq = 0, lo = 1e9, hi = -1e9;
  for (double x : v) {
    mean += x;
    sq += x * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  mean /= static_cast<double>(v.size());
  sq /= static_cast<double>(v.size());
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_GT(hi, 0.95 * bound);  // fills the range
  EXPECT_LT(lo, -0.95 * bound);
  EXPECT_NEAR(mean, 0.0, 0.05 * bound);
  EXPECT_NEAR(sq, bound * bound / 3.0, 0.05 * bound * bound);  // variance of U(-b, b)
}
}  // namespace

TEST(Init, DefaultsMatchTorchBounds) {
  manualSeed(7);
  nn::Linear lin(100, 300);  // torch: kaiming_uniform(a=sqrt(5)) -> U(-1/sqrt(100), 1/sqrt(100)); bias the same
  expectUniform(lin.weight(), 0.1);
  EXPECT_EQ(lin.weight().sizes(), (Shape{300, 100}));
  nn::Linear lin2(100, 3000);
  expectUniform(lin2.bias(), 0.1);
  nn::Conv2d conv(8, 64, 3);  // fan_in = 8 * 3 * 3 = 72
  EXPECT_EQ(conv.weight().sizes(), (Shape{64, 8, 3, 3}));
  expectUniform(conv.weight(), 1.0 / std::sqrt(72.0));
  nn::Conv2d conv2(8, 4000, 3, {.groups = 2});  // fan_in = 4 * 9 = 36
  expectUniform(conv2.bias(), 1.0 / std::sqrt(36.0));
  nn::Embedding emb(200, 50);  // N(0, 1)
  std::vector<double> e = emb.weight().toVector<double>();
  double mean = std::accumulate(e.begin(), e.end(), 0.0) / e.size(), sq = 0;
  for (double x : e) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(sq / e.size()), 1.0, 0.03);
  nn::LayerNorm ln(6);
  EXPECT_EQ(ln.weight().toVector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(ln.bias().toVector<float>(), std::vector<float>(6, 0.0f));
  // The same seed gives the same layer.
  manualSeed(9);
  nn::Linear a(5, 5);
  manualSeed(9);
  nn::Linear b(5, 5);
  EXPECT_EQ(a.weight().toVector<float>(), b.weight().toVector<float>());
  Generator g(42);
  nn::Linear c(5, 5, true, &g);
  Generator g2(42);
  nn::Linear d(5, 5, true, &g2);
  EXPECT_EQ(c.weight().toVector<float>(), d.weight().toVector<float>());
}

// ---- layer forwards against torch ------------------------------------------------------------

TEST(Layers, LinearAndLayerNormMatchTorch) {
  Tensor x = fill({2, 4}, 5);
  nn::Linear lin(4, 3);
  fillModule(lin);
  expectClose(lin(x), {0.0506249964, 0.155000001, -0.215000004, 0.202500001, 0.225624993, -0.225625008});
  nn::LayerNorm ln(4);
  fillModule(ln);
  expectClose(ln(x), {-0.244592726, 0.371800423, -0.201781154, 0.188460007, 0.418903083, 0.269715518, -0.141463354,
                      0.335366428});
  EXPECT_THROW(lin(zeros({2, 5})), ValueError);
  EXPECT_THROW(ln(zeros({2, 5})), ValueError);
  try {
    lin(zeros({2, 5}));
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
}

TEST(Layers, ConvAndPoolMatchTorch) {
  Tensor x = fill({1, 2, 3, 3}, 3);
  nn::Conv2d conv(2, 3, 2, {.padding = {1, 1}});
  fillModule(conv);
  Tensor y = conv(x);
  EXPECT_EQ(y.sizes(), (Shape{1, 3, 4, 4}));
  expectClose(y, {0.0862499997, -0.0443750061, 0.0843750015, -0.0075000003, 0.0706249997, 0.0837500095, 0.0531249978,
                  0.158749998,  0.0718749985,  0.0350000001, -0.0818750113, 0.0799999982, 0.0443750024, 0.0431249999,
                  0.0131249949, 0.0712500066,  0.214374989,  0.224999994,   0.269999981,  0.28125,      0.227499992,
                  0.196250007,  0.113124996,   0.205624998,  0.207499996,   0.277500004,  0.251875013,  0.278124988,
                  0.194374993,  0.25562501,    0.256874979,  0.252499998,   -0.146249995, -0.267499983, -0.104999997,
                  -0.206249997, -0.161874995,  -0.09375,     -0.329999983,  -0.106875002, -0.145624995, -0.184375003,
                  -0.219374999, -0.242499992,  -0.173124999, -0.178749993,  -0.117499992, -0.270624995});
  // Conv2d(2, 2, (2, 1), stride=(2, 1), padding=(0, 1), bias=False, groups=2)
  nn::Conv2d grouped(2, 2, {2, 1}, {.stride = {2, 1}, .padding = {0, 1}, .groups = 2}, /*bias=*/false);
  fillModule(grouped);
  expectClose(grouped(x),
              {0, -0.041875001, 0.0506250039, 0.0425000042, 0, 0, -0.0206250008, 0.0362500027, 0.0500000007, 0});
  EXPECT_EQ(conv(fill({2, 3, 3}, 3)).sizes(), (Shape{3, 4, 4}));  // unbatched input
  EXPECT_THROW(conv(zeros({1, 3, 3, 3})), ValueError);            // wrong channel count
  EXPECT_THROW(conv(zeros({3, 3})), ValueError);

  Tensor xp = fill({2, 1, 4, 4}, 4);
  expectClose(nn::MaxPool2d(2)(xp),
              {0.174999997, 0.224999994, 0.25, 0.200000003, 0.100000001, 0.275000006, 0.224999994, 0.125});
  // AvgPool2d(3, stride=2, padding=1), count_include_pad=True
  expectClose(nn::AvgPool2d(3, 2, 1)(xp), {0.0111111104, 1.24176347e-09, 0.013888889, -0.036111109, -0.0222222246,
                                           0.013888889, 0.0277777817, 0.0166666694});
  EXPECT_EQ(nn::Flatten()(xp).sizes(), (Shape{2, 16}));
  EXPECT_THROW(nn::MaxPool2d(2)(zeros({4, 4})), ValueError);
}

TEST(Layers, ActivationsMatchTorch) {
  Tensor x = fill({6}, 9) * 4.0;
  expectClose(nn::GELU()(x), {-0.165654078, -0.0841480494, 0.345731199, -0.149232715, -0.137831345, 0.185373425});
  expectClose(nn::GELU(true)(x), {-0.165771484, -0.0841485709, 0.345714003, -0.14941895, -0.137838826, 0.185370937});
  expectClose(nn::SiLU()(x), {-0.260145456, -0.0900332034, 0.311229676, -0.274713874, -0.160524949, 0.172332764});
  expectClose(nn::Tanh()(x), {-0.716297865, -0.197375327, 0.462117165, -0.800499022, -0.379948974, 0.291312635});
  std::vector<float> r = nn::ReLU()(x).toVector<float>();
  std::vector<float> xv = x.toVector<float>();
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i], std::max(0.0f, xv[i]));
}

TEST(Layers, EmbeddingLooksUpRows) {
  nn::Embedding emb(5, 3);
  fillModule(emb);
  Tensor idx = fromVector<int64_t>({4, 0, 4, 2}, {2, 2});
  Tensor y = emb(idx);
  EXPECT_EQ(y.sizes(), (Shape{2, 2, 3}));
  std::vector<float> w = emb.weight().toVector<float>(), out = y.toVector<float>();
  std::vector<int> rows = {4, 0, 4, 2};
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(out[i * 3 + j], w[static_cast<size_t>(rows[i]) * 3 + j]);
  EXPECT_THROW(emb(fromVector<int64_t>({5})), IndexError);
  EXPECT_THROW(emb(zeros({2})), ValueError);  // float indices
}

TEST(Layers, SequentialAndModuleList) {
  nn::Sequential seq(nn::Linear(4, 3), nn::ReLU());
  seq.push_back(std::make_shared<nn::Linear>(3, 2));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq(ones({5, 4})).sizes(), (Shape{5, 2}));
  EXPECT_EQ(seq.at<nn::Linear>(2)->outFeatures(), 2);
  EXPECT_EQ(seq.at<nn::Linear>(-1)->outFeatures(), 2);
  EXPECT_THROW(seq.at<nn::Linear>(1), ValueError);
  EXPECT_THROW(seq[3], IndexError);
  EXPECT_EQ(keysOf(seq.namedParameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  nn::ModuleList list(nn::Linear(2, 2), nn::Tanh());
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.toString().find("ModuleList("), 0u);
  // A layer shared by two containers is the same object.
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential s1(shared), s2(shared, nn::ReLU());
  EXPECT_EQ(s1[0].get(), s2[0].get());
}

// ---- attention and GPT -----------------------------------------------------------------------

TEST(Transformer, AttentionMatchesTorch) {
  nn::CausalSelfAttention att(4, 2, 4);
  fillModule(att);
  expectClose(att(fill({1, 3, 4}, 2)),
              {0.16573438, -0.247078121, -0.195578128, 0.0819687545, 0.168582588, -0.245609164, -0.187408298,
               0.0735697448, 0.150454134, -0.262166709, -0.174720719, 0.078148216});
  EXPECT_THROW(att(zeros({1, 5, 4})), ValueError);  // longer than the block
  EXPECT_THROW(att(zeros({1, 3, 6})), ValueError);
  EXPECT_THROW(nn::CausalSelfAttention(6, 4, 8), ValueError);
}

TEST(Transformer, GPTForwardMatchesTorch) {
  Tensor idx = fromVector<int64_t>({1, 2, 3, 6, 0, 5}, {2, 3});
  {
    // tests/parity/torch_reference.py GPT(vocab 7, block 4, layers 2, heads 2, embd 4, bias, tied)
    nn::GPT gpt({.vocabSize = 7, .blockSize = 4, .nLayer = 2, .nHead = 2, .nEmbd = 4});
    fillModule(gpt);
    Tensor logits = gpt(idx);
    EXPECT_EQ(logits.sizes(), (Shape{2, 3, 7}));
    expectClose(logits,
                {-0.141088456, 0.00347758643, 0.0944301188, 0.0467732139, -0.164366424, -0.12556982,  0.0711521581,
                 -0.142183989, -0.0501560345, 0.0884985849, 0.0692152306, -0.167374343, -0.125390396, 0.0633082241,
                 -0.141539156, 0.00186450465, 0.094330363,  0.0478100367, -0.165352583, -0.125663519, 0.070516929,
                 -0.128834009, -0.0524908304, 0.0852990076, 0.0589435287, -0.13746804,  -0.123077996, 0.0766649842,
                 -0.134484664, -0.0487885177, 0.0951702371, 0.0552194789, -0.175759852, -0.106967866, 0.0538950562,
                 -0.143972501, -0.0193299968, 0.0939960703, 0.0570214503, -0.175938115, -0.12266209,  0.062030457});
  }
  {
    // The same with layers 1, no biases, untied.
    nn::GPT gpt(
        {.vocabSize = 7, .blockSize = 4, .nLayer = 1, .nHead = 2, .nEmbd = 4, .bias = false, .tieWeights = false});
    EXPECT_EQ(keysOf(gpt.stateDict()),
              (std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight",
                                        "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                                        "transformer.h.0.attn.c_proj.weight", "transformer.h.0.ln_2.weight",
                                        "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight",
                                        "transformer.ln_f.weight", "lm_head.weight"}));
    fillModule(gpt);
    expectClose(gpt(idx), {-0.0246934053, 0.0136182485,  0.0606555827,   -0.0694598854, -0.0311482437,   -0.00936874282,
                           0.0376685932,  0.0388850234,  0.0760348067,   -0.066850327,  -0.0144900559,   0.0226597227,
                           0.0537449345,  -0.0891401991, 0.0258971974,   0.0520137623,  -0.000481151073, -0.0515707955,
                           -0.0254542306, 0.0363438204,  -0.0161510892,  -0.0246933978, 0.0136182504,    0.0606555678,
                           -0.0694598779, -0.0311482344, -0.00936873816, 0.0376685783,  0.0222231075,    -0.0177828092,
                           -0.0451062955, 0.0593092404,  0.0193033256,   0.0062207398,  -0.0211027469,   -0.0212133396,
                           -0.0637960956, 0.0457920618,  0.0216383263,   -0.0209444314, -0.0382464416,   0.0713417158});
  }
}

TEST(Transformer, GPTIsCausalAndTrains) {
  manualSeed(11);
  nn::GPT gpt({.vocabSize = 13, .blockSize = 8, .nLayer = 2, .nHead = 2, .nEmbd = 16});
  Tensor a = fromVector<int64_t>({1, 2, 3, 4, 5, 6}, {1, 6});
  Tensor b = fromVector<int64_t>({1, 2, 3, 9, 12, 0}, {1, 6});  // differs from position 3 on
  std::vector<float> la = gpt(a).toVector<float>(), lb = gpt(b).toVector<float>();
  for (size_t i = 0; i < 3 * 13; ++i) EXPECT_EQ(la[i], lb[i]) << i;  // positions 0..2 unchanged
  bool differs = false;
  for (size_t i = 3 * 13; i < la.size(); ++i) differs |= la[i] != lb[i];
  EXPECT_TRUE(differs);
  EXPECT_THROW(gpt(zeros({1, 9}, {.dtype = DType::Int64})), ValueError);  // longer than the block
  EXPECT_THROW(gpt(zeros({1, 3})), ValueError);                           // float ids

  // A few AdamW steps on a fixed batch lower the loss; the tied weight gets one gradient.
  optim::AdamW opt(gpt.parameters(), {.lr = 1e-2, .weightDecay = 0.0});
  Tensor x = fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  Tensor y = fromVector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9}, {8});
  double first = 0, last = 0;
  for (int s = 0; s < 20; ++s) {
    Tensor loss = nn::functional::crossEntropy(gpt(x).view({8, 13}), y);
    if (s == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zeroGrad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, first * 0.5);
}

TEST(Transformer, GenerateIsReproducible) {
  manualSeed(12);
  nn::GPT gpt({.vocabSize = 10, .blockSize = 4, .nLayer = 1, .nHead = 2, .nEmbd = 8});
  gpt.eval();
  Tensor start = fromVector<int64_t>({1, 2, 3, 4}, {2, 2});
  Generator g1(5), g2(5);
  Tensor a = gpt.generate(start, 6, 1.0, 3, &g1);
  Tensor b = gpt.generate(start, 6, 1.0, 3, &g2);
  EXPECT_EQ(a.sizes(), (Shape{2, 8}));  // context cropped to the block size internally
  EXPECT_EQ(a.toVector<int64_t>(), b.toVector<int64_t>());
  std::vector<int64_t> v = a.toVector<int64_t>();
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[1], 2);
  for (int64_t t : v) EXPECT_TRUE(t >= 0 && t < 10);
  // Greedy decoding picks the argmax of the last position's logits.
  Tensor greedy = gpt.generate(start, 1, 0.0);
  std::vector<float> logits = gpt(start).toVector<float>();
  for (int row = 0; row < 2; ++row) {
    const float* l = logits.data() + (row * 2 + 1) * 10;
    EXPECT_EQ(greedy.toVector<int64_t>()[static_cast<size_t>(row * 3 + 2)], std::max_element(l, l + 10) - l);
  }
  // top-k = 1 is greedy too.
  Generator g3(1);
  EXPECT_EQ(gpt.generate(start, 1, 1.0, 1, &g3).toVector<int64_t>(), greedy.toVector<int64_t>());
}

#include "core/gradcheck.h"

TEST(Transformer, GradientsThroughTheWholeModelAreRight) {
  // float64 GPT with tied weights: the analytic gradients of wte (used twice), attention, layer
  // norm and position parameters equal central differences.
  manualSeed(13);
  nn::GPT gpt({.vocabSize = 5, .blockSize = 3, .nLayer = 1, .nHead = 2, .nEmbd = 4});
  gpt.to(DType::Float64);
  auto p = gpt.namedParameters();
  Tensor idx = fromVector<int64_t>({1, 4, 2, 0, 3, 3}, {2, 3});
  EXPECT_TRUE(cohort::testing::gradcheck([&](const std::vector<Tensor>&) { return gpt(idx); },
                                         {p["transformer.wte.weight"], p["transformer.wpe.weight"],
                                          p["transformer.h.0.attn.c_attn.weight"], p["transformer.h.0.ln_1.bias"],
                                          p["transformer.h.0.mlp.c_proj.weight"]}));
  // The attention's input gradient, for a non-contiguous (transposed) input.
  nn::CausalSelfAttention att(4, 2, 4);
  att.to(DType::Float64);
  Tensor x = cohort::testing::randArg({3, 2, 4});
  EXPECT_TRUE(
      cohort::testing::gradcheck([&](const std::vector<Tensor>& in) { return att(in[0].transpose(0, 1)); }, {x}));
}
