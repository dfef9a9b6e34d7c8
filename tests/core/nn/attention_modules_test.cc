// Attention modules (core/nn/attention.h) and the fused attention in GPT's CausalSelfAttention.
// MultiheadAttention, TransformerEncoderLayer and TransformerEncoder against PyTorch 1.13's
// modules with the same weights and inputs (outputs, attention weights, gradients of inputs and
// parameters, parameter names and order): the PyTorch side is tests/parity/attention_reference.py,
// run once for every case through /usr/bin/python3 (Debian's python3-torch, as the parity test).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include <cohort/cohort.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/nn.h>

#include "core/test_util.h"

using namespace cohort;
using cohort::testing::expectError;
namespace fs = std::filesystem;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Inputs = std::map<std::string, Tensor>;

struct Case {
  std::string name;
  nlohmann::json cfg;
  std::shared_ptr<nn::Module> module;
  Inputs inputs;  // floating inputs get gradients
  // Runs the module on the given inputs: {output, attention weights or undefined}.
  std::function<std::pair<Tensor, Tensor>(nn::Module&, const Inputs&)> forward;
};

Generator& gen() {
  static Generator g(2024);
  return g;
}
Tensor randn64(const Shape& s) { return randn(s, {.dtype = DType::Float64}, &gen()); }
Tensor randBool(const Shape& s, double pTrue) {
  return rand(s, {.dtype = DType::Float64}, &gen()).lt(full({}, pTrue, {.dtype = DType::Float64}));
}
// [N, S] key padding: entry b pads its last b keys (never all of them).
Tensor paddingMask(int64_t N, int64_t S) {
  Tensor m = zeros({N, S}, {.dtype = DType::Bool});
  for (int64_t b = 0; b < N; ++b) m.select(0, b).slice(0, S - std::min(b, S - 1), S).fill_(true);
  return m;
}
// [L, S] bool, true = masked, leaving key 0 visible to every query.
Tensor boolAttnMask(int64_t L, int64_t S) {
  Tensor m = randBool({L, S}, 0.4);
  m.select(1, 0).fill_(false);
  return m;
}
Tensor causalFloat(int64_t S) {
  Tensor m = zeros({S, S}, {.dtype = DType::Float64});
  for (int64_t i = 0; i < S; ++i) m.select(0, i).slice(0, i + 1, S).fill_(-kInf);
  return m;
}

// float64, and every parameter drawn anew so that no two are alike (LayerNorm weights near 1).
void randomize(nn::Module& m) {
  m.to(DType::Float64);
  autograd::NoGradGuard ng;
  for (auto& [name, p] : m.namedParameters()) {
    Tensor r = rand(p.sizes(), {.dtype = DType::Float64}, &gen()) - 0.5;
    const bool normWeight = name.find("norm") != std::string::npos && name.ends_with("weight");
    p.detach().copy_(normWeight ? r * 0.4 + 1.0 : r);
  }
}

nlohmann::json mhaCfg(int64_t E, int64_t H, const nn::MultiheadAttentionOptions& o, bool self, bool needWeights,
                      bool average) {
  nlohmann::json c = {{"kind", "mha"},
                      {"embed_dim", E},
                      {"num_heads", H},
                      {"bias", o.bias},
                      {"add_bias_kv", o.addBiasKv},
                      {"add_zero_attn", o.addZeroAttn},
                      {"batch_first", o.batchFirst},
                      {"self", self},
                      {"need_weights", needWeights},
                      {"average_attn_weights", average}};
  if (o.kdim) c["kdim"] = *o.kdim;
  if (o.vdim) c["vdim"] = *o.vdim;
  return c;
}

// A MultiheadAttention case: query [.., L, .., E]; key/value as given (self: all three are query).
Case mhaCase(const std::string& name, int64_t E, int64_t H, nn::MultiheadAttentionOptions o, const Tensor& query,
             const Tensor& key, const Tensor& value, const Tensor& kpm, const Tensor& attnMask, bool needWeights,
             bool average) {
  Case c;
  c.name = name;
  const bool self = !key.defined();
  c.cfg = mhaCfg(E, H, o, self, needWeights, average);
  c.module = std::make_shared<nn::MultiheadAttention>(E, H, o);
  randomize(*c.module);
  c.inputs["query"] = query;
  if (!self) {
    c.inputs["key"] = key;
    c.inputs["value"] = value;
  }
  if (kpm.defined()) c.inputs["key_padding_mask"] = kpm;
  if (attnMask.defined()) c.inputs["attn_mask"] = attnMask;
  c.forward = [self, needWeights, average](nn::Module& m, const Inputs& in) {
    auto& mha = dynamic_cast<nn::MultiheadAttention&>(m);
    auto get = [&](const char* k) { return in.contains(k) ? in.at(k) : Tensor(); };
    const Tensor q = in.at("query");
    auto r = mha.forward(q, self ? q : in.at("key"), self ? q : in.at("value"),
                         {.keyPaddingMask = get("key_padding_mask"),
                          .needWeights = needWeights,
                          .attnMask = get("attn_mask"),
                          .averageAttnWeights = average});
    return std::pair<Tensor, Tensor>{r.output, r.weights};
  };
  return c;
}

nlohmann::json layerCfg(const char* kind, int64_t d, int64_t nhead, const nn::TransformerEncoderLayerOptions& o) {
  return {{"kind", kind},
          {"d_model", d},
          {"nhead", nhead},
          {"dim_feedforward", o.dimFeedforward},
          {"activation", o.activation == nn::TransformerActivation::Gelu ? "gelu" : "relu"},
          {"layer_norm_eps", o.layerNormEps},
          {"batch_first", o.batchFirst},
          {"norm_first", o.normFirst}};
}

Case encoderCase(const std::string& name, int64_t layers, bool finalNorm, nn::TransformerEncoderLayerOptions o,
                 const Tensor& src, const Tensor& mask, const Tensor& kpm) {
  const int64_t d = 16, nhead = 4;
  o.dimFeedforward = 24;
  o.dropout = 0.0;
  o.layerNormEps = 1e-6;
  o.generator = &gen();
  Case c;
  c.name = name;
  nn::TransformerEncoderLayer layer(d, nhead, o);
  if (layers == 0) {
    c.cfg = layerCfg("layer", d, nhead, o);
    c.module = std::make_shared<nn::TransformerEncoderLayer>(d, nhead, o);
  } else {
    c.cfg = layerCfg("encoder", d, nhead, o);
    c.cfg["num_layers"] = layers;
    c.cfg["final_norm"] = finalNorm;
    c.module = std::make_shared<nn::TransformerEncoder>(layer, layers,
                                                        finalNorm ? std::make_shared<nn::LayerNorm>(d, o.layerNormEps)
                                                                  : nullptr);
  }
  randomize(*c.module);
  c.inputs["src"] = src;
  if (mask.defined()) c.inputs["mask"] = mask;
  if (kpm.defined()) c.inputs["key_padding_mask"] = kpm;
  const bool isLayer = layers == 0;
  c.forward = [isLayer](nn::Module& m, const Inputs& in) {
    auto get = [&](const char* k) { return in.contains(k) ? in.at(k) : Tensor(); };
    Tensor out =
        isLayer
            ? dynamic_cast<nn::TransformerEncoderLayer&>(m).forward(in.at("src"), get("mask"), get("key_padding_mask"))
            : dynamic_cast<nn::TransformerEncoder&>(m).forward(in.at("src"), get("mask"), get("key_padding_mask"));
    return std::pair<Tensor, Tensor>{out, Tensor()};
  };
  return c;
}

std::vector<Case> buildCases() {
  std::vector<Case> cs;
  const int64_t E = 16, H = 4, L = 7, S = 9, N = 3;
  using MO = nn::MultiheadAttentionOptions;
  cs.push_back(mhaCase("mha_self_seq_first", E, H, {}, randn64({L, N, E}), {}, {}, {}, {}, true, true));
  cs.push_back(mhaCase("mha_self_batch_first_padding_fused", E, H, MO{.batchFirst = true}, randn64({N, L, E}), {}, {},
                       paddingMask(N, L), {}, false, true));
  cs.push_back(mhaCase("mha_cross_bool_masks_per_head_weights", E, H, {}, randn64({L, N, E}), randn64({S, N, E}),
                       randn64({S, N, E}), paddingMask(N, S), boolAttnMask(L, S), true, false));
  cs.push_back(mhaCase("mha_cross_float_mask_3d_fused", E, H, MO{.batchFirst = true}, randn64({N, L, E}),
                       randn64({N, S, E}), randn64({N, S, E}), paddingMask(N, S), randn64({N * H, L, S}), false, true));
  cs.push_back(mhaCase("mha_kdim_vdim", E, H, MO{.kdim = 6, .vdim = 10, .batchFirst = true}, randn64({N, L, E}),
                       randn64({N, S, 6}), randn64({N, S, 10}), paddingMask(N, S), {}, true, true));
  cs.push_back(mhaCase("mha_kdim_vdim_fused", E, H, MO{.kdim = 6, .vdim = 10}, randn64({L, N, E}), randn64({S, N, 6}),
                       randn64({S, N, 10}), {}, boolAttnMask(L, S), false, true));
  cs.push_back(mhaCase("mha_bias_kv_zero_attn_fused", E, H, MO{.addBiasKv = true, .addZeroAttn = true},
                       randn64({L, N, E}), randn64({S, N, E}), randn64({S, N, E}), paddingMask(N, S),
                       boolAttnMask(L, S), false, true));
  cs.push_back(mhaCase("mha_bias_kv_zero_attn_weights", E, H,
                       MO{.addBiasKv = true, .addZeroAttn = true, .batchFirst = true}, randn64({N, L, E}),
                       randn64({N, S, E}), randn64({N, S, E}), paddingMask(N, S), randn64({L, S}), true, false));
  cs.push_back(mhaCase("mha_no_bias_float_mask_fused", E, H, MO{.bias = false}, randn64({L, N, E}), randn64({S, N, E}),
                       randn64({S, N, E}), {}, randn64({L, S}), false, true));
  cs.push_back(mhaCase("mha_unbatched_weights", E, H, {}, randn64({L, E}), randn64({S, E}), randn64({S, E}),
                       paddingMask(1, S).select(0, 0).clone(), {}, true, true));
  cs.push_back(mhaCase("mha_unbatched_fused", E, H, MO{.batchFirst = true}, randn64({L, E}), randn64({S, E}),
                       randn64({S, E}), {}, randn64({H, L, S}), false, true));
  Tensor kv = randn64({S, N, E});
  cs.push_back(mhaCase("mha_key_is_value", E, H, {}, randn64({L, N, E}), kv, kv, {}, {}, false, true));

  using LO = nn::TransformerEncoderLayerOptions;
  using A = nn::TransformerActivation;
  const int64_t T = 10;
  cs.push_back(encoderCase("layer_relu_post_norm_causal", 0, false, LO{.activation = A::Relu}, randn64({T, N, 16}),
                           causalFloat(T), {}));
  cs.push_back(encoderCase("layer_gelu_pre_norm_batch_first_padding", 0, false,
                           LO{.activation = A::Gelu, .batchFirst = true, .normFirst = true}, randn64({N, T, 16}), {},
                           paddingMask(N, T)));
  cs.push_back(encoderCase("layer_relu_pre_norm_bool_mask", 0, false, LO{.activation = A::Relu, .normFirst = true},
                           randn64({T, N, 16}), boolAttnMask(T, T), paddingMask(N, T)));
  cs.push_back(
      encoderCase("layer_gelu_post_norm_unbatched", 0, false, LO{.activation = A::Gelu}, randn64({T, 16}), {}, {}));
  cs.push_back(encoderCase("encoder_post_norm_final_norm_batch_first", 2, true,
                           LO{.activation = A::Relu, .batchFirst = true}, randn64({N, T, 16}), causalFloat(T),
                           paddingMask(N, T)));
  cs.push_back(encoderCase("encoder_pre_norm_gelu", 3, false, LO{.activation = A::Gelu, .normFirst = true},
                           randn64({T, N, 16}), {}, {}));
  return cs;
}

// Leaf copies of the floating inputs (so each run starts without gradients).
Inputs leafCopies(const Inputs& in) {
  Inputs out;
  for (const auto& [k, t] : in)
    out[k] = isFloating(t.dtype()) && k.find("mask") == std::string::npos ? t.detach().clone().setRequiresGrad() : t;
  return out;
}

struct Suite {
  std::vector<Case> cases;
  io::TensorDict torchOut;
  nlohmann::json torchInfo;
  std::map<std::string, Inputs> gradWeights;  // per case: "grad_out", "grad_weights"
  std::string error;
};

// Builds every case, runs PyTorch once on all of them and keeps its results.
Suite& suite() {
  static Suite s = [] {
    Suite st;
    st.cases = buildCases();
    fs::path dir = fs::temp_directory_path() / fmt::format("cohort_attention_parity_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    nlohmann::json cfgs = nlohmann::json::array();
    io::TensorDict inputs;
    for (Case& c : st.cases) {
      nlohmann::json cfg = c.cfg;
      cfg["name"] = c.name;
      cfgs.push_back(cfg);
      for (const auto& [k, v] : c.module->stateDict()) inputs.insert(c.name + "/param/" + k, v.contiguous());
      for (const auto& [k, v] : c.inputs) inputs.insert(c.name + "/" + k, v.contiguous());
      // Weights of the scalar loss, shaped like the outputs.
      auto [out, w] = c.forward(*c.module, c.inputs);
      Inputs& gw = st.gradWeights[c.name];
      gw["grad_out"] = randn64(out.sizes());
      inputs.insert(c.name + "/grad_out", gw["grad_out"]);
      if (w.defined()) {
        gw["grad_weights"] = randn64(w.sizes());
        inputs.insert(c.name + "/grad_weights", gw["grad_weights"]);
      }
      c.module->zeroGrad();
    }
    { std::ofstream(dir / "cases.json") << cfgs.dump(); }
    io::saveSafetensors((dir / "inputs.safetensors").string(), inputs);
    fs::path script = fs::path(COHORT_SOURCE_DIR) / "tests" / "parity" / "attention_reference.py";
    std::string cmd = fmt::format("/usr/bin/python3 {} {} 2>&1", script.string(), dir.string());
    if (std::system(cmd.c_str()) != 0) {
      st.error = "the PyTorch reference failed: " + cmd;
      return st;
    }
    st.torchOut = io::loadSafetensors((dir / "outputs.safetensors").string()).tensors;
    std::ifstream(dir / "outputs.json") >> st.torchInfo;
    fs::remove_all(dir);
    return st;
  }();
  return s;
}

void expectAllClose(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-9) {
  ASSERT_TRUE(got.defined()) << what << ": cohort has no value";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got.to(DType::Float64) - want.to(DType::Float64)).abs().max().item<double>();
  const double scale = want.to(DType::Float64).abs().max().item<double>();
  EXPECT_LE(diff, tol * std::max(1.0, scale)) << what << " differs from PyTorch by " << diff;
}

void checkCase(const std::string& name) {
  Suite& s = suite();
  ASSERT_TRUE(s.error.empty()) << s.error;
  Case* found = nullptr;
  for (Case& c : s.cases)
    if (c.name == name) found = &c;
  ASSERT_NE(found, nullptr) << name;
  Case& c = *found;
  // Parameter names in PyTorch's order.
  std::vector<std::string> mine;
  for (const auto& [k, v] : c.module->namedParameters()) mine.push_back(k);
  EXPECT_EQ(mine, s.torchInfo[name]["parameters"].get<std::vector<std::string>>()) << name;

  c.module->zeroGrad();
  Inputs in = leafCopies(c.inputs);
  auto [out, w] = c.forward(*c.module, in);
  const Inputs& gw = s.gradWeights.at(name);
  Tensor loss = (out * gw.at("grad_out")).sum();
  expectAllClose(out, s.torchOut.at(name + "/out"), name + " output");
  if (s.torchOut.contains(name + "/weights")) {
    expectAllClose(w, s.torchOut.at(name + "/weights"), name + " attention weights");
    loss = loss + (w * gw.at("grad_weights")).sum();
  } else {
    EXPECT_FALSE(w.defined()) << name;
  }
  loss.backward();
  for (const auto& [k, t] : in)
    if (t.requiresGrad()) expectAllClose(t.grad(), s.torchOut.at(name + "/grad/" + k), name + " gradient of " + k);
  for (const auto& [k, p] : c.module->namedParameters())
    expectAllClose(p.grad(), s.torchOut.at(name + "/grad/param/" + k), name + " gradient of " + k);
}

}  // namespace

// ---- against PyTorch 1.13 ---------------------------------------------------------------------

TEST(AttentionModulesParity, MhaSelfSeqFirst) { checkCase("mha_self_seq_first"); }
TEST(AttentionModulesParity, MhaSelfBatchFirstPaddingFused) { checkCase("mha_self_batch_first_padding_fused"); }
TEST(AttentionModulesParity, MhaCrossBoolMasksPerHeadWeights) { checkCase("mha_cross_bool_masks_per_head_weights"); }
TEST(AttentionModulesParity, MhaCrossFloatMask3dFused) { checkCase("mha_cross_float_mask_3d_fused"); }
TEST(AttentionModulesParity, MhaKdimVdim) {
  checkCase("mha_kdim_vdim");
  checkCase("mha_kdim_vdim_fused");
}
TEST(AttentionModulesParity, MhaBiasKvZeroAttn) {
  checkCase("mha_bias_kv_zero_attn_fused");
  checkCase("mha_bias_kv_zero_attn_weights");
}
TEST(AttentionModulesParity, MhaNoBiasFloatMaskFused) { checkCase("mha_no_bias_float_mask_fused"); }
TEST(AttentionModulesParity, MhaUnbatched) {
  checkCase("mha_unbatched_weights");
  checkCase("mha_unbatched_fused");
}
TEST(AttentionModulesParity, MhaKeyIsValue) { checkCase("mha_key_is_value"); }
TEST(AttentionModulesParity, EncoderLayerReluPostNormCausal) { checkCase("layer_relu_post_norm_causal"); }
TEST(AttentionModulesParity, EncoderLayerGeluPreNormBatchFirstPadding) {
  checkCase("layer_gelu_pre_norm_batch_first_padding");
}
TEST(AttentionModulesParity, EncoderLayerReluPreNormBoolMask) { checkCase("layer_relu_pre_norm_bool_mask"); }
TEST(AttentionModulesParity, EncoderLayerGeluPostNormUnbatched) { checkCase("layer_gelu_post_norm_unbatched"); }
TEST(AttentionModulesParity, EncoderPostNormFinalNormBatchFirst) {
  checkCase("encoder_post_norm_final_norm_batch_first");
}
TEST(AttentionModulesParity, EncoderPreNormGelu) { checkCase("encoder_pre_norm_gelu"); }

// ---- module behaviour -----------------------------------------------------------------------------

TEST(MultiheadAttention, FusedAndWeightPathsAgree) {
  Generator g(1);
  nn::MultiheadAttention m(32, 4, {.batchFirst = true, .generator = &g});
  Tensor x = randn({2, 50, 32}, {}, &g), kpm = paddingMask(2, 50);
  auto fused = m.forward(x, x, x, {.keyPaddingMask = kpm, .needWeights = false});
  auto full = m.forward(x, x, x, {.keyPaddingMask = kpm});
  EXPECT_FALSE(fused.weights.defined());
  EXPECT_EQ(full.weights.sizes(), (Shape{2, 50, 50}));
  EXPECT_LE((fused.output - full.output).abs().max().item<double>(), 1e-5);
  // Averaged weights are a distribution over the keys, and padded keys get none.
  EXPECT_LE((full.weights.sum({-1}) - 1.0).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(full.weights.select(0, 1).slice(-1, 49, 50).abs().sum().item<double>(), 0.0);
  // forward(x) is self-attention without weights; forwardMulti returns {output, weights}.
  EXPECT_LE((m(x) - m.forward(x, x, x, {.needWeights = false}).output).abs().max().item<double>(), 0.0);
  nn::TensorList r = m.call({x, x, x, kpm});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_LE((r[0] - full.output).abs().max().item<double>(), 0.0);
}

TEST(MultiheadAttention, ParametersAndInitialisation) {
  Generator g(3);
  nn::MultiheadAttention m(64, 8, {.addBiasKv = true, .generator = &g});
  auto p = m.namedParameters();
  EXPECT_EQ(p["in_proj_weight"].sizes(), (Shape{192, 64}));
  EXPECT_EQ(p["in_proj_bias"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(p["out_proj.bias"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(p["bias_k"].sizes(), (Shape{1, 1, 64}));
  // xavier_uniform_: U(-b, b), b = sqrt(6 / (64 + 192)).
  const double bound = std::sqrt(6.0 / 256.0);
  EXPECT_LE(p["in_proj_weight"].abs().max().item<double>(), bound);
  EXPECT_GE(p["in_proj_weight"].abs().max().item<double>(), 0.9 * bound);
  nn::MultiheadAttention sep(64, 8, {.bias = false, .kdim = 16, .vdim = 24});
  std::vector<std::string> names;
  for (const auto& [k, v] : sep.namedParameters()) names.push_back(k);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"}));
  EXPECT_EQ(sep.namedParameters()["k_proj_weight"].sizes(), (Shape{64, 16}));
}

TEST(MultiheadAttention, DropoutOnlyInTrainingAndReproducible) {
  Generator init(4);
  Tensor x = randn({6, 2, 16}, {}, &init);
  auto run = [&](uint64_t seed, bool training, bool needWeights) {
    Generator g(seed);
    nn::MultiheadAttention m(16, 2, {.dropout = 0.5, .generator = &g});
    m.train(training);
    return m.forward(x, x, x, {.needWeights = needWeights}).output;
  };
  for (bool needWeights : {false, true}) {
    EXPECT_EQ((run(1, true, needWeights) - run(1, true, needWeights)).abs().max().item<double>(), 0.0);
    EXPECT_GT((run(1, true, needWeights) - run(1, false, needWeights)).abs().max().item<double>(), 1e-3);
  }
  // In eval mode the generator only drew the initialisation: both paths agree.
  EXPECT_LE((run(1, false, true) - run(1, false, false)).abs().max().item<double>(), 1e-5);
}

TEST(MultiheadAttention, Errors) {
  expectError<ValueError>([] { nn::MultiheadAttention(10, 3); }, {"embed_dim (10)", "num_heads (3)"});
  expectError<ValueError>([] { nn::MultiheadAttention(8, 2, {.dropout = 1.0}); }, {"dropout must be in [0, 1)"});
  nn::MultiheadAttention m(8, 2);
  Tensor x = zeros({5, 3, 8});
  expectError<ValueError>([&] { m.forward(zeros({5, 3, 7}), x, x); }, {"MultiheadAttention(embed_dim=8", "[5, 3, 7]"});
  expectError<ValueError>([&] { m.forward(x, zeros({5, 3}), x); }, {"expected query, key and value all"});
  expectError<ValueError>([&] { m.forward(x, zeros({6, 3, 8}), x); }, {"sequence length"});
  expectError<ValueError>(
      [&] {
        m.forward(x, x, x, {.keyPaddingMask = zeros({3, 4}, {.dtype = DType::Bool})});
      },
      {"keyPaddingMask must be [N, S] = [3, 5]", "[3, 4]"});
  expectError<ValueError>(
      [&] {
        m.forward(x, x, x, {.attnMask = zeros({5, 4})});
      },
      {"attnMask must be [L, S] = [5, 5] or [N * num_heads, L, S] = [6, 5, 5]"});
  expectError<ValueError>(
      [&] {
        m.forward(x, x, x, {.attnMask = zeros({5, 5}, {.dtype = DType::Int64})});
      },
      {"attnMask must be bool or floating-point", "int64"});
  expectError<ValueError>([&] { m.call({x, x}); }, {"takes {query, key, value"});
  nn::TransformerEncoderLayer layer(8, 2, {.dimFeedforward = 16});
  expectError<ValueError>(
      [&] {
        layer(zeros({4, 2, 6}));
      },
      {"TransformerEncoderLayer(d_model=8, nhead=2)", "[4, 2, 6]"});
  expectError<ValueError>([] { nn::TransformerEncoderLayer(8, 2, {.dimFeedforward = 0}); }, {"dimFeedforward"});
  expectError<ValueError>([&] { nn::TransformerEncoder(layer, -1); }, {"numLayers must be >= 0"});
}

TEST(TransformerEncoder, CopiesTheLayerAndCallsLayersThroughHooks) {
  Generator g(5);
  nn::TransformerEncoderLayer layer(16, 4, {.dimFeedforward = 32, .dropout = 0.0, .generator = &g});
  nn::TransformerEncoder enc(layer, 3, std::make_shared<nn::LayerNorm>(16));
  auto sd = enc.stateDict();
  EXPECT_TRUE(sd.contains("layers.2.self_attn.in_proj_weight"));
  EXPECT_TRUE(sd.contains("layers.0.linear2.bias"));
  EXPECT_TRUE(sd.contains("norm.weight"));
  // Every layer starts from the given layer's weights, in tensors of its own.
  for (const char* k : {"self_attn.in_proj_weight", "linear1.weight", "norm2.bias"}) {
    EXPECT_EQ((sd[fmt::format("layers.1.{}", k)] - layer.stateDict()[k]).abs().max().item<double>(), 0.0) << k;
    EXPECT_NE(sd[fmt::format("layers.1.{}", k)].dataPtr(), sd[fmt::format("layers.2.{}", k)].dataPtr()) << k;
  }
  EXPECT_EQ(enc.numParameters(), 3 * layer.numParameters() + 32);
  // Masks reach every layer through call(), so the layers' hooks run.
  int calls = 0;
  for (const auto& [n, l] : enc.layers()->namedChildren())
    l->registerForwardHook([&](nn::Module&, const nn::TensorList& in, nn::TensorList&) {
      ++calls;
      EXPECT_EQ(in.size(), 3u);
    });
  Tensor x = randn({7, 2, 16}, {}, &g);
  Tensor y = enc.forward(x, causalFloat(7).to(DType::Float32), paddingMask(2, 7));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(y.sizes(), x.sizes());
}

// ---- GPT's CausalSelfAttention on the fused op ----------------------------------------------------

TEST(CausalSelfAttentionFused, MatchesTheUnfusedFormula) {
  Generator g(6);
  nn::CausalSelfAttention attn(48, 4, 40, 0.0, true, &g);
  attn.to(DType::Float64);
  Tensor x = randn({2, 33, 48}, {.dtype = DType::Float64}, &g);
  Tensor w = randn({2, 33, 48}, {.dtype = DType::Float64}, &g);
  auto params = attn.namedParameters();
  // The formula CausalSelfAttention computed before it used the fused op.
  auto unfused = [&](const Tensor& in) {
    const int64_t B = 2, T = 33, C = 48, nh = 4, hs = 12;
    Tensor qkv = linear(in, params["c_attn.weight"], params["c_attn.bias"]);
    std::vector<Tensor> parts = qkv.split(C, 2);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, nh, hs}).transpose(1, 2); };
    Tensor att = matmul(heads(parts[0]), heads(parts[1]).transpose(-2, -1)) * (1.0 / std::sqrt(12.0));
    att = att + causalFloat(T);
    att = nn::functional::softmax(att, -1);
    Tensor y = matmul(att, heads(parts[2])).transpose(1, 2).contiguous().view({B, T, C});
    return linear(y, params["c_proj.weight"], params["c_proj.bias"]);
  };
  auto grads = [&](auto&& fn) {
    attn.zeroGrad();
    Tensor xl = x.detach().clone().setRequiresGrad();
    Tensor out = fn(xl);
    (out * w).sum().backward();
    return std::vector<Tensor>{out.detach(), xl.grad(), params["c_attn.weight"].grad(), params["c_proj.bias"].grad()};
  };
  auto fused = grads([&](const Tensor& in) { return attn(in); });
  auto ref = grads(unfused);
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_LE((fused[i] - ref[i]).abs().max().item<double>(), 1e-12) << "tensor " << i;
  EXPECT_FALSE(attn.hasBuffer("mask"));  // no [block, block] buffer any more
  // fused = false (the math formula) computes the same, with the same parameters.
  Generator g2(6);
  nn::CausalSelfAttention math(48, 4, 40, 0.0, true, &g2, /*fused=*/false);
  math.to(DType::Float64);
  math.loadStateDict(attn.stateDict());
  EXPECT_NE(math.extraRepr().find("fused=false"), std::string::npos) << math.extraRepr();
  EXPECT_EQ(attn.extraRepr().find("fused"), std::string::npos) << attn.extraRepr();
  params = math.namedParameters();
  auto viaMath = [&] {
    math.zeroGrad();
    Tensor xl = x.detach().clone().setRequiresGrad();
    Tensor out = math(xl);
    (out * w).sum().backward();
    return std::vector<Tensor>{out.detach(), xl.grad(), params["c_attn.weight"].grad(), params["c_proj.bias"].grad()};
  }();
  for (size_t i = 0; i < viaMath.size(); ++i)
    EXPECT_LE((viaMath[i] - ref[i]).abs().max().item<double>(), 1e-12) << "math formula, tensor " << i;
}

// GPTConfig::fusedAttention reaches every block: same weights and names; in float32 the two
// kernels agree to rounding, under bfloat16 autocast the op-by-op formula rounds the scores.
TEST(CausalSelfAttentionFused, GptConfigChoosesTheKernelForEveryBlock) {
  nn::GPTConfig c{.vocabSize = 20, .blockSize = 16, .nLayer = 2, .nHead = 2, .nEmbd = 16};
  Generator g1(3), g2(3);
  nn::GPT fused(c, &g1);
  c.fusedAttention = false;
  nn::GPT math(c, &g2);
  EXPECT_EQ(fused.stateDict().size(), math.stateDict().size());
  int attentions = 0;
  for (const auto& [name, m] : math.namedModules()) {
    if (auto* a = dynamic_cast<nn::CausalSelfAttention*>(m)) {
      ++attentions;
      EXPECT_NE(a->extraRepr().find("fused=false"), std::string::npos) << name;
    }
  }
  EXPECT_EQ(attentions, 2);
  Generator gi(4);
  Tensor idx = randint(0, 20, {2, 16}, {.dtype = DType::Int64}, &gi);
  EXPECT_LE((fused(idx) - math(idx)).abs().max().item<double>(), 1e-5);
  amp::Autocast ac(DeviceType::CPU, DType::BFloat16);
  EXPECT_GT((fused(idx).to(DType::Float32) - math(idx).to(DType::Float32)).abs().max().item<double>(), 0.0);
}

TEST(CausalSelfAttentionFused, DropoutFollowsTrainingModeAndTheGenerator) {
  auto run = [](uint64_t seed, bool training) {
    Generator g(seed);
    nn::CausalSelfAttention attn(32, 2, 16, 0.3, true, &g);
    attn.train(training);
    Generator in(1);
    return attn(randn({2, 16, 32}, {}, &in));
  };
  EXPECT_EQ((run(1, true) - run(1, true)).abs().max().item<double>(), 0.0);
  EXPECT_GT((run(1, true) - run(1, false)).abs().max().item<double>(), 1e-4);
  EXPECT_GT((run(1, true) - run(2, true)).abs().max().item<double>(), 1e-4);
}
