#include <cohort/core/optim/optimizer.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <unordered_set>
#include <variant>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/profiler.h>

namespace cohort::optim {

// ---- groups ----------------------------------------------------------------------------------

double ParamGroup::option(const std::string& key) const {
  auto it = options.find(key);
  if (it == options.end()) throw ValueError(fmt::format("optimizer: the parameter group has no option '{}'", key));
  return it->second;
}

double ParamGroup::lr() const { return option("lr"); }

Optimizer::Optimizer(std::string type, GroupOptions defaults)
    : type_(std::move(type)), defaults_(std::move(defaults)) {}

void Optimizer::addParamGroup(ParamGroup group) {
  for (const auto& [k, v] : group.options)
    if (!defaults_.count(k)) {
      std::vector<std::string> known;
      for (const auto& [dk, dv] : defaults_) known.push_back(dk);
      throw ValueError(
          fmt::format("{}: unknown option '{}' in a parameter group (known: {})", type_, k, fmt::join(known, ", ")));
    }
  for (const auto& [k, v] : defaults_) group.options.emplace(k, v);
  checkOptions(group.options);
  std::unordered_set<const TensorImpl*> existing;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) existing.insert(p.impl());
  std::unordered_set<const TensorImpl*> mine;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    if (!p.defined()) throw ValueError(fmt::format("{}: parameter {} of the new group is undefined", type_, i));
    if (!p.isFloatingPoint())
      throw ValueError(fmt::format("{}: parameter {} of the new group is {}, not floating point", type_, i, p.dtype()));
    if (const std::string* owner = autograd::managedBy(p))
      throw ValueError(
          fmt::format("{}: parameter {} of the new group (shape {}) {}", type_, i, shapeStr(p.sizes()), *owner));
    if (!p.isLeaf())
      throw ValueError(fmt::format("{}: parameter {} of the new group (shape {}) is not a leaf tensor", type_, i,
                                   shapeStr(p.sizes())));
    if (existing.count(p.impl()) || !mine.insert(p.impl()).second)
      throw ValueError(fmt::format("{}: parameter {} of the new group (shape {}) appears in more than one place; a "
                                   "parameter may be optimized by only one group, once",
                                   type_, i, shapeStr(p.sizes())));
  }
  groups_.push_back(std::move(group));
}

void Optimizer::setLr(double lr) {
  for (ParamGroup& g : groups_) g.setLr(lr);
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it == state_.end() ? nullptr : &it->second;
}

void Optimizer::step() {
  autograd::NoGradGuard ng;
  // State made on the first step is the optimizer's (the memory profiler's categories).
  MemoryCategoryScope stateMemory(MemoryCategory::OptimizerState);
  profiler::detail::SpanHandle span;
  if (profiler::detail::active()) [[unlikely]]
    span = profiler::detail::beginSpan(profiler::EventKind::Range, fmt::format("Optimizer.step#{}.step", type_));
  // A parameter a wrapper took over after this optimizer was built (FSDP routes its gradient to
  // a flat shard) would otherwise be skipped silently, every step, as one without a gradient.
  int64_t index = 0;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) {
      if (const std::string* owner = autograd::managedBy(p))
        throw ValueError(fmt::format("{}.step: parameter {} (shape {}) {}", type_, index, shapeStr(p.sizes()), *owner));
      ++index;
    }
  for (ParamGroup& g : groups_) {
    if (masterWeights_) stepWithMasters(g);
    else stepGroup(g);
  }
  if (span.id >= 0) profiler::detail::endSpan(span);
  profiler::markStep();
}

namespace {
bool isHalf(const Tensor& t) { return t.dtype() == DType::BFloat16 || t.dtype() == DType::Float16; }
}  // namespace

void Optimizer::setMasterWeights(bool enabled) {
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params)
      if (isHalf(p) && state(p) != nullptr && enabled != masterWeights_)
        throw ValueError(fmt::format("{}.setMasterWeights: a {} parameter of shape {} has stepped already; turn master "
                                     "weights on or off before the first step",
                                     type_, p.dtype(), shapeStr(p.sizes())));
  masterWeights_ = enabled;
}

// One group's update with every half parameter that has a gradient replaced by its float32
// master (the state and gradient lookups map the master back to the parameter), then the masters
// rounded into the parameters.
void Optimizer::stepWithMasters(ParamGroup& group) {
  ParamGroup shadow{.params = {}, .options = group.options};
  std::vector<std::pair<Tensor, Tensor>> updated;  // (parameter, master)
  for (Tensor& p : group.params) {
    if (!isHalf(p) || !gradFor(p).defined()) {
      shadow.params.push_back(p);
      continue;
    }
    ParamState& st = state_[p.impl()];
    auto it = st.tensors.find("master");
    if (it == st.tensors.end() || it->second.sizes() != p.sizes() || it->second.dtype() != DType::Float32 ||
        it->second.device() != p.device())
      it = st.tensors.insert_or_assign("master", p.detach().to(DType::Float32).clone()).first;
    masterOf_.emplace(it->second.impl(), p);
    shadow.params.push_back(it->second);
    updated.emplace_back(p, it->second);
  }
  try {
    stepGroup(shadow);
  } catch (...) {
    masterOf_.clear();
    throw;
  }
  masterOf_.clear();
  for (auto& [p, master] : updated) {
    p.copy_(master);
    p.bumpVersion();
  }
}

void Optimizer::step(const GradientLookup& gradOf) {
  if (!gradOf) throw ValueError(fmt::format("{}.step: the gradient lookup is empty", type_));
  gradOf_ = &gradOf;
  try {
    step();
  } catch (...) {
    gradOf_ = nullptr;
    throw;
  }
  gradOf_ = nullptr;
}

void Optimizer::zeroGrad(bool setToNone) {
  autograd::NoGradGuard ng;
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (setToNone) {
        p.setGrad(Tensor());
      } else {
        if (grad.gradFn()) {
          grad = grad.detach();
          p.setGrad(grad);
        }
        grad.zero_();
      }
    }
  }
}

Tensor updateGrad(const Tensor& param, Tensor grad, const char* op, bool readsHalf) {
  Tensor g = std::move(grad);
  if (g.sizes() != param.sizes())
    throw ValueError(fmt::format("{}: gradient of shape {} for a parameter of shape {}", op, shapeStr(g.sizes()),
                                 shapeStr(param.sizes())));
  const bool readHalf = readsHalf && param.dtype() == DType::Float32 && g.device() == param.device() && isHalf(g);
  if (g.dtype() != param.dtype() && !readHalf) g = g.to(param.dtype());
  return g.detach().contiguous();
}

// ---- state dicts -----------------------------------------------------------------------------

OptimizerStateDict Optimizer::stateDict() const {
  OptimizerStateDict out;
  out.type = type_;
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    OptimizerStateDict::Group sg;
    sg.options = g.options;
    for (const Tensor& p : g.params) {
      sg.params.push_back(index);
      if (const ParamState* s = state(p)) {
        const std::string prefix = fmt::format("state.{}.", index);
        out.tensors.emplace(prefix + "step", scalarTensor(static_cast<double>(s->step), {.dtype = DType::Float32}));
        for (const auto& [k, t] : s->tensors) out.tensors.emplace(prefix + k, t);
      }
      ++index;
    }
    out.groups.push_back(std::move(sg));
  }
  return out;
}

void Optimizer::loadStateDict(const OptimizerStateDict& dict) {
  std::vector<std::string> problems;
  if (dict.type != type_) problems.push_back(fmt::format("the state is for a {} optimizer", dict.type));
  if (dict.groups.size() != groups_.size())
    problems.push_back(
        fmt::format("it has {} parameter groups, the optimizer has {}", dict.groups.size(), groups_.size()));
  std::vector<Tensor> params = parameters();
  for (size_t i = 0; i < dict.groups.size() && i < groups_.size(); ++i) {
    if (dict.groups[i].params.size() != groups_[i].params.size())
      problems.push_back(fmt::format("group {} has {} parameters in the state, {} in the optimizer", i,
                                     dict.groups[i].params.size(), groups_[i].params.size()));
    for (const auto& [k, v] : dict.groups[i].options)
      if (!defaults_.count(k)) problems.push_back(fmt::format("group {} has unknown option '{}'", i, k));
  }
  // Parse "state.<index>.<key>" names and check shapes.
  std::map<int64_t, ParamState> loaded;
  for (const auto& [name, t] : dict.tensors) {
    const std::string pre = "state.";
    size_t dot = name.find('.', pre.size());
    char* end = nullptr;
    long long idx = -1;
    if (name.compare(0, pre.size(), pre) == 0 && dot != std::string::npos)
      idx = std::strtoll(name.c_str() + pre.size(), &end, 10);
    if (idx < 0 || end != name.c_str() + dot || dot + 1 >= name.size()) {
      problems.push_back(fmt::format("tensor '{}' is not named state.<index>.<key>", name));
      continue;
    }
    if (idx >= static_cast<long long>(params.size())) {
      problems.push_back(fmt::format("tensor '{}' is for parameter {}, but there are {}", name, idx, params.size()));
      continue;
    }
    const std::string key = name.substr(dot + 1);
    const Tensor& p = params[static_cast<size_t>(idx)];
    if (!t.defined()) {
      problems.push_back(fmt::format("tensor '{}' is undefined", name));
    } else if (key == "step") {
      if (t.numel() != 1)
        problems.push_back(fmt::format("'{}' has shape {}, expected one element", name, shapeStr(t.sizes())));
      else loaded[idx].step = static_cast<int64_t>(std::llround(t.itemDouble()));
    } else if (key == "master" && !masterWeights_) {
      problems.push_back(fmt::format("'{}' is a float32 master weight, but this optimizer keeps none (call "
                                     "setMasterWeights() before loading)",
                                     name));
    } else if (t.sizes() != p.sizes()) {
      problems.push_back(fmt::format("'{}' has shape {}, parameter {} has shape {}", name, shapeStr(t.sizes()), idx,
                                     shapeStr(p.sizes())));
    } else {
      loaded[idx].tensors[key] = t;
    }
  }
  if (problems.empty()) {
    for (size_t i = 0; i < groups_.size(); ++i) {
      GroupOptions opts = groups_[i].options;
      for (const auto& [k, v] : dict.groups[i].options) opts[k] = v;
      try {
        checkOptions(opts);
      } catch (const Error& e) {
        problems.push_back(fmt::format("group {}: {}", i, e.what()));
      }
    }
  }
  if (!problems.empty())
    throw ValueError(fmt::format("{}.loadStateDict: {} problem{} (nothing was loaded): {}", type_, problems.size(),
                                 problems.size() == 1 ? "" : "s", fmt::join(problems, "; ")));

  autograd::NoGradGuard ng;
  state_.clear();
  for (auto& [idx, s] : loaded) {
    const Tensor& p = params[static_cast<size_t>(idx)];
    ParamState& dst = state_[p.impl()];
    dst.step = s.step;
    for (auto& [k, t] : s.tensors) {
      // A private, contiguous copy in the parameter's dtype (torch casts floating state the same way);
      // float32 for a half parameter's state under master weights.
      DType dt = t.isFloatingPoint() ? (masterWeights_ && isHalf(p) ? DType::Float32 : p.dtype()) : t.dtype();
      Tensor c = empty(p.sizes(), {.dtype = dt, .device = p.device()});
      c.copy_(t);
      dst.tensors[k] = c;
    }
  }
  for (size_t i = 0; i < groups_.size(); ++i)
    for (const auto& [k, v] : dict.groups[i].options) groups_[i].options[k] = v;
}

// ---- JSON metadata ---------------------------------------------------------------------------

namespace {

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    throw ValueError(fmt::format("OptimizerStateDict: option value {} cannot be written as JSON", v));
  return fmt::format("{:.17g}", v);
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A small JSON reader: enough for metadataJson's output (objects, arrays, strings, numbers,
// true/false/null).
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>, std::vector<std::pair<std::string, Json>>>
      v;
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parseDocument() {
    Json j = parse();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw ValueError(fmt::format("OptimizerStateDict: malformed JSON metadata at offset {}: {}", i_, what));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(fmt::format("expected '{}'", c));
  }
  std::string str() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') break;
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unterminated escape");
        char e = s_[i_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': {
            if (i_ + 4 > s_.size()) fail("short \\u escape");
            long code = std::strtol(s_.substr(i_, 4).c_str(), nullptr, 16);
            i_ += 4;
            if (code > 0x7f) fail("non-ASCII \\u escapes are not supported");
            out += static_cast<char>(code);
            break;
          }
          default: fail("bad escape");
        }
      } else {
        out += c;
      }
    }
    return out;
  }
  Json parse() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      std::vector<std::pair<std::string, Json>> obj;
      if (eat('}')) return Json{obj};
      do {
        std::string k = str();
        expect(':');
        obj.emplace_back(std::move(k), parse());
      } while (eat(','));
      expect('}');
      return Json{obj};
    }
    if (c == '[') {
      ++i_;
      std::vector<Json> arr;
      if (eat(']')) return Json{arr};
      do arr.push_back(parse());
      while (eat(','));
      expect(']');
      return Json{arr};
    }
    if (c == '"') return Json{str()};
    if (s_.compare(i_, 4, "true") == 0) {
      i_ += 4;
      return Json{true};
    }
    if (s_.compare(i_, 5, "false") == 0) {
      i_ += 5;
      return Json{false};
    }
    if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
      return Json{nullptr};
    }
    char* end = nullptr;
    double d = std::strtod(s_.c_str() + i_, &end);
    if (end == s_.c_str() + i_) fail("expected a value");
    i_ = static_cast<size_t>(end - s_.c_str());
    return Json{d};
  }

  const std::string& s_;
  size_t i_ = 0;
};

const Json* member(const Json& obj, const std::string& key) {
  auto* o = std::get_if<std::vector<std::pair<std::string, Json>>>(&obj.v);
  if (!o) return nullptr;
  for (const auto& [k, v] : *o)
    if (k == key) return &v;
  return nullptr;
}

}  // namespace

std::string OptimizerStateDict::metadataJson() const {
  std::string out = "{\"type\": " + jsonString(type) + ", \"groups\": [";
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) out += ", ";
    out += "{\"params\": [";
    for (size_t j = 0; j < groups[i].params.size(); ++j) out += (j ? ", " : "") + std::to_string(groups[i].params[j]);
    out += "], \"options\": {";
    bool first = true;
    for (const auto& [k, v] : groups[i].options) {
      out += (first ? "" : ", ") + jsonString(k) + ": " + jsonNumber(v);
      first = false;
    }
    out += "}}";
  }
  return out + "]}";
}

void OptimizerStateDict::setMetadataFromJson(const std::string& json) {
  Json doc = JsonParser(json).parseDocument();
  auto bad = [](const std::string& what) {
    return ValueError(fmt::format("OptimizerStateDict: JSON metadata {}", what));
  };
  const Json* t = member(doc, "type");
  const Json* gs = member(doc, "groups");
  if (!t || !std::holds_alternative<std::string>(t->v)) throw bad("has no string \"type\"");
  if (!gs || !std::holds_alternative<std::vector<Json>>(gs->v)) throw bad("has no array \"groups\"");
  std::vector<Group> parsed;
  for (const Json& g : std::get<std::vector<Json>>(gs->v)) {
    Group out;
    const Json* ps = member(g, "params");
    const Json* os = member(g, "options");
    if (!ps || !std::holds_alternative<std::vector<Json>>(ps->v)) throw bad("has a group without a \"params\" array");
    if (!os || !std::holds_alternative<std::vector<std::pair<std::string, Json>>>(os->v))
      throw bad("has a group without an \"options\" object");
    for (const Json& p : std::get<std::vector<Json>>(ps->v)) {
      const double* d = std::get_if<double>(&p.v);
      if (!d || *d < 0 || *d != std::floor(*d)) throw bad("has a parameter index that is not a non-negative integer");
      out.params.push_back(static_cast<int64_t>(*d));
    }
    for (const auto& [k, v] : std::get<std::vector<std::pair<std::string, Json>>>(os->v)) {
      if (const double* d = std::get_if<double>(&v.v)) out.options[k] = *d;
      else if (const bool* b = std::get_if<bool>(&v.v)) out.options[k] = *b ? 1.0 : 0.0;
      else throw bad(fmt::format("option '{}' is not a number", k));
    }
    parsed.push_back(std::move(out));
  }
  type = std::get<std::string>(t->v);
  groups = std::move(parsed);
}

}  // namespace cohort::optim
