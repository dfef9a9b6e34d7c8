#include <cohort/core/io/checkpoint.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace cohort::io {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "cohort-checkpoint";
constexpr const char* kVersion = "1";

[[noreturn]] void fail(const std::string& file, const std::string& msg) {
  throw CheckpointError(fmt::format("checkpoint '{}': {}", file, msg));
}

json parseJsonText(const std::string& file, const std::string& what, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(file, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

// Typed field access with errors naming the file and the field.
template <typename T>
T field(const std::string& file, const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) fail(file, fmt::format("the state has no \"{}\" in {}", key, where));
  const json& v = obj.at(key);
  bool ok = false;
  if constexpr (std::is_same_v<T, int64_t>) ok = v.is_number_integer();
  else if constexpr (std::is_same_v<T, uint64_t>)
    ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  else if constexpr (std::is_same_v<T, double>) ok = v.is_number();
  if (!ok) fail(file, fmt::format("\"{}\" in {} has the wrong type: {}", key, where, v.dump()));
  return v.get<T>();
}

}  // namespace

std::string checkpointFile(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && (path.back() == '/' || std::filesystem::is_directory(path, ec)))
    return (std::filesystem::path(path) / kCheckpointFileName).string();
  return path;
}

SafetensorsContents encodeCheckpoint(const TrainingState& st, const std::string& file) {
  TensorDict all;
  for (const auto& [k, t] : st.model) all.insert("model/" + k, t);
  json state = json::object();
  state["step"] = st.step;
  state["data_position"] = {{"epoch", st.dataPosition.epoch}, {"batch", st.dataPosition.batch}};
  json gens = json::object();
  for (const auto& [name, g] : st.generators) gens[name] = {{"seed", g.seed}, {"offset", g.offset}};
  state["generators"] = std::move(gens);
  if (st.optimizer) {
    for (const auto& [k, t] : st.optimizer->tensors) all.insert("optimizer/" + k, t);
    state["optimizer"] = parseJsonText(file, "the optimizer metadata", st.optimizer->metadataJson());
  } else {
    state["optimizer"] = nullptr;
  }
  if (st.scheduler) state["scheduler"] = {{"last_step", st.scheduler->lastStep}, {"base_lrs", st.scheduler->baseLrs}};
  else state["scheduler"] = nullptr;
  if (st.gradScaler) {
    json scaler = json::object();  // {} for a disabled scaler's empty state
    for (const auto& [k, v] : *st.gradScaler) {
      if (!std::isfinite(v))
        throw ValueError(
            fmt::format("saveCheckpoint '{}': the grad scaler state's \"{}\" is {}, not a finite number", file, k, v));
      scaler[k] = v;
    }
    state["grad_scaler"] = std::move(scaler);
  } else {
    state["grad_scaler"] = nullptr;
  }
  json extraGroups = json::array();
  for (const auto& [group, dict] : st.extraTensors) {
    if (group.empty() || group.find('/') != std::string::npos)
      throw ValueError(
          fmt::format("saveCheckpoint '{}': extra tensor group name '{}' must be non-empty and free of '/'", file,
                      group));
    extraGroups.push_back(group);
    for (const auto& [k, t] : dict) all.insert("extra/" + group + "/" + k, t);
  }
  state["extra_groups"] = std::move(extraGroups);
  if (!st.extraJson.empty()) {
    try {
      state["extra"] = json::parse(st.extraJson);
    } catch (const json::exception& e) {
      throw ValueError(fmt::format("saveCheckpoint '{}': extraJson is not valid JSON: {}", file, e.what()));
    }
  } else {
    state["extra"] = nullptr;
  }
  Metadata meta{{"format", kFormat}, {"version", kVersion}, {"state", state.dump()}};
  return {std::move(all), std::move(meta)};
}

std::string saveCheckpoint(const std::string& path, const TrainingState& st) {
  const std::string file = checkpointFile(path);
  SafetensorsContents c = encodeCheckpoint(st, file);  // bad arguments fail before anything is created
  if (!path.empty() && path.back() == '/') {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) fail(file, fmt::format("cannot create folder '{}': {}", path, ec.message()));
  }
  saveSafetensors(file, c.tensors, c.metadata);
  return file;
}

TrainingState loadCheckpoint(const std::string& path) {
  const std::string file = checkpointFile(path);
  return decodeCheckpoint(loadSafetensors(file), file);  // CheckpointError naming the file on any damage
}

TrainingState decodeCheckpoint(SafetensorsContents c, const std::string& file) {
  auto fmtIt = c.metadata.find("format");
  if (fmtIt == c.metadata.end() || fmtIt->second != kFormat)
    fail(file, fmt::format("not a cohort training checkpoint (__metadata__ \"format\" is {}, expected \"{}\"); a plain "
                           "safetensors file loads with io::loadSafetensors",
                           fmtIt == c.metadata.end() ? "missing" : "\"" + fmtIt->second + "\"", kFormat));
  auto verIt = c.metadata.find("version");
  if (verIt == c.metadata.end() || verIt->second != kVersion)
    fail(file, fmt::format("unsupported checkpoint version {} (this build reads version {})",
                           verIt == c.metadata.end() ? "missing" : "\"" + verIt->second + "\"", kVersion));
  auto stIt = c.metadata.find("state");
  if (stIt == c.metadata.end()) fail(file, "the __metadata__ has no \"state\"");
  json state = parseJsonText(file, "the \"state\" metadata", stIt->second);
  if (!state.is_object()) fail(file, "the \"state\" metadata is not a JSON object");

  TrainingState st;
  st.step = field<int64_t>(file, state, "step", "the state");
  if (!state.contains("data_position")) fail(file, "the state has no \"data_position\"");
  st.dataPosition.epoch = field<int64_t>(file, state["data_position"], "epoch", "data_position");
  st.dataPosition.batch = field<int64_t>(file, state["data_position"], "batch", "data_position");
  if (!state.contains("generators") || !state["generators"].is_object())
    fail(file, "the state has no \"generators\" object");
  for (auto& [name, g] : state["generators"].items()) {
    std::string where = fmt::format("generators.{}", name);
    st.generators[name] = {field<uint64_t>(file, g, "seed", where), field<uint64_t>(file, g, "offset", where)};
  }

  const json& opt = state.value("optimizer", json());
  if (!opt.is_null()) {
    optim::OptimizerStateDict sd;
    try {
      sd.setMetadataFromJson(opt.dump());
    } catch (const Error& e) {
      fail(file, fmt::format("the optimizer metadata is malformed: {}", e.what()));
    }
    st.optimizer = std::move(sd);
  }
  const json& sch = state.value("scheduler", json());
  if (!sch.is_null()) {
    optim::SchedulerState ss;
    ss.lastStep = field<int64_t>(file, sch, "last_step", "scheduler");
    if (!sch.contains("base_lrs") || !sch["base_lrs"].is_array()) fail(file, "scheduler.base_lrs is not an array");
    for (const json& v : sch["base_lrs"]) {
      if (!v.is_number()) fail(file, fmt::format("scheduler.base_lrs holds a non-number: {}", v.dump()));
      ss.baseLrs.push_back(v.get<double>());
    }
    st.scheduler = std::move(ss);
  }
  const json& scaler = state.value("grad_scaler", json());
  if (!scaler.is_null()) {
    if (!scaler.is_object()) fail(file, fmt::format("grad_scaler is not a JSON object: {}", scaler.dump()));
    amp::GradScalerState gs;
    for (const auto& [k, v] : scaler.items()) {
      if (!v.is_number()) fail(file, fmt::format("grad_scaler.{} is not a number: {}", k, v.dump()));
      gs[k] = v.get<double>();
    }
    st.gradScaler = std::move(gs);
  }
  std::set<std::string> groups;
  if (state.contains("extra_groups")) {
    if (!state["extra_groups"].is_array()) fail(file, "extra_groups is not an array");
    for (const json& g : state["extra_groups"]) {
      if (!g.is_string()) fail(file, "extra_groups holds a non-string");
      groups.insert(g.get<std::string>());
      st.extraTensors[g.get<std::string>()];
    }
  }
  if (state.contains("extra") && !state["extra"].is_null()) st.extraJson = state["extra"].dump();

  for (auto& [name, t] : c.tensors) {
    if (name.starts_with("model/")) {
      st.model.insert(name.substr(6), t);
    } else if (name.starts_with("optimizer/")) {
      if (!st.optimizer) fail(file, fmt::format("tensor '{}' belongs to an optimizer, but the state has none", name));
      st.optimizer->tensors[name.substr(10)] = t;
    } else if (name.starts_with("extra/")) {
      size_t slash = name.find('/', 6);
      std::string group = slash == std::string::npos ? "" : name.substr(6, slash - 6);
      if (!groups.count(group))
        fail(file, fmt::format("tensor '{}' names an extra group that the state does not list", name));
      st.extraTensors[group].insert(name.substr(slash + 1), t);
    } else {
      fail(file, fmt::format("tensor '{}' has no known group prefix (model/, optimizer/, extra/)", name));
    }
  }
  st.model.describeAs(fmt::format("the model state of checkpoint '{}'", file), "tensor");
  for (auto& [group, dict] : st.extraTensors)
    dict.describeAs(fmt::format("extra tensor group '{}' of checkpoint '{}'", group, file), "tensor");
  return st;
}

namespace {

void checkModel(const std::string& file, const nn::Module& model, const TensorDict& saved) {
  nn::StateDict own = model.stateDict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [k, t] : own) {
    const Tensor* s = saved.find(k);
    if (!s) missing.push_back(k);
    else if (s->sizes() != t.sizes())
      mismatched.push_back(
          fmt::format("{}: {} in the checkpoint, {} in the model", k, shapeStr(s->sizes()), shapeStr(t.sizes())));
    else if (s->isFloatingPoint() != t.isFloatingPoint())
      mismatched.push_back(fmt::format("{}: dtype {} in the checkpoint, {} in the model", k, s->dtype(), t.dtype()));
  }
  for (const auto& [k, t] : saved)
    if (!own.contains(k)) unexpected.push_back(k);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("missing in the checkpoint: [{}]", fmt::join(missing, ", ")));
  if (!unexpected.empty()) parts.push_back(fmt::format("not in the model: [{}]", fmt::join(unexpected, ", ")));
  if (!mismatched.empty()) parts.push_back(fmt::format("mismatched: [{}]", fmt::join(mismatched, "; ")));
  fail(file, fmt::format("the model does not match the checkpoint ({}); nothing was restored", fmt::join(parts, "; ")));
}

void checkOptimizer(const std::string& file, const optim::Optimizer& opt, const optim::OptimizerStateDict& saved) {
  if (saved.type != opt.type())
    fail(file, fmt::format("the checkpoint holds a {} optimizer, the program has a {}; nothing was restored",
                           saved.type, opt.type()));
  const auto& groups = opt.paramGroups();
  if (saved.groups.size() != groups.size())
    fail(file, fmt::format("the checkpoint's optimizer has {} parameter groups, the program's {}; nothing was restored",
                           saved.groups.size(), groups.size()));
  std::vector<Tensor> params;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (saved.groups[g].params.size() != groups[g].params.size())
      fail(file, fmt::format(
                     "optimizer group {} has {} parameters in the checkpoint, {} in the program; nothing was restored",
                     g, saved.groups[g].params.size(), groups[g].params.size()));
    params.insert(params.end(), groups[g].params.begin(), groups[g].params.end());
  }
  for (const auto& [name, t] : saved.tensors) {
    // "state.<index>.<key>"
    int64_t idx = -1;
    size_t dot = name.find('.', 6);
    if (!name.starts_with("state.") || dot == std::string::npos ||
        std::from_chars(name.data() + 6, name.data() + dot, idx).ptr != name.data() + dot)
      fail(file, fmt::format("optimizer tensor '{}' is not named state.<index>.<key>", name));
    if (idx < 0 || idx >= static_cast<int64_t>(params.size()))
      fail(file, fmt::format("optimizer tensor '{}' refers to parameter {} of {}", name, idx, params.size()));
    std::string key = name.substr(dot + 1);
    if (key != "step" && t.sizes() != params[static_cast<size_t>(idx)].sizes())
      fail(file, fmt::format("optimizer tensor '{}' has shape {}, parameter {} has {}; nothing was restored", name,
                             shapeStr(t.sizes()), idx, shapeStr(params[static_cast<size_t>(idx)].sizes())));
  }
}

}  // namespace

TrainingState restoreCheckpoint(const std::string& path, const RestoreTargets& targets) {
  const std::string file = checkpointFile(path);
  TrainingState st = loadCheckpoint(path);
  checkRestore(file, st, targets);  // everything first, so a mismatch changes nothing
  applyRestore(file, st, targets);
  return st;
}

void checkRestore(const std::string& file, const TrainingState& st, const RestoreTargets& targets) {
  if (targets.model) checkModel(file, *targets.model, st.model);
  if (targets.optimizer) {
    if (!st.optimizer) fail(file, "an optimizer was given, but the checkpoint holds no optimizer state");
    checkOptimizer(file, *targets.optimizer, *st.optimizer);
  }
  if (targets.scheduler) {
    if (!st.scheduler) fail(file, "a scheduler was given, but the checkpoint holds no scheduler state");
    size_t groups = targets.optimizer ? targets.optimizer->paramGroups().size() : st.scheduler->baseLrs.size();
    if (st.scheduler->baseLrs.size() != groups)
      fail(file, fmt::format("the scheduler state has {} base lrs for {} optimizer groups",
                             st.scheduler->baseLrs.size(), groups));
  }
  if (targets.gradScaler) {
    if (!st.gradScaler) fail(file, "a grad scaler was given, but the checkpoint holds no grad scaler state");
    try {
      targets.gradScaler->checkStateDict(*st.gradScaler);
    } catch (const ValueError& e) {
      fail(file, fmt::format("the grad scaler state does not fit the scaler: {}; nothing was restored", e.what()));
    }
  }
  if (targets.loader) {
    const auto& p = st.dataPosition;
    if (p.epoch < 0 || p.batch < 0 || p.batch > targets.loader->numBatches())
      fail(file, fmt::format("data position (epoch {}, batch {}) does not fit the loader's {} batches per epoch",
                             p.epoch, p.batch, targets.loader->numBatches()));
  }
  if (targets.generator && !st.generators.count("cpu"))
    fail(file, "a generator was given, but the checkpoint holds no \"cpu\" generator state");
}

void applyRestore(const std::string& file, const TrainingState& st, const RestoreTargets& targets) {
  try {
    if (targets.model) targets.model->loadStateDict(st.model, /*strict=*/true);
    if (targets.optimizer) targets.optimizer->loadStateDict(*st.optimizer);
    if (targets.scheduler) targets.scheduler->loadState(*st.scheduler);
    if (targets.gradScaler) targets.gradScaler->loadStateDict(*st.gradScaler);
    if (targets.loader) targets.loader->setPosition(st.dataPosition);
    if (targets.generator) targets.generator->setState(st.generators.at("cpu"));
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    fail(file, fmt::format("restoring failed: {}", e.what()));
  }
}

}  // namespace cohort::io
