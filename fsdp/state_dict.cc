#include <cohort/fsdp/state_dict.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>

namespace cohort::fsdp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int numShards(const FullyShardedDataParallel& f) { return f.groups().shard ? f.groups().shard->size() : 1; }
int shardIndex(const FullyShardedDataParallel& f) { return f.groups().shard ? f.groups().shard->rank() : 0; }

// The unit's whole flat parameter (padded) in the shard dtype: an all-gather over the shard group.
Tensor gatherMaster(FullyShardedDataParallel& f, FlatParamHandle& h) {
  if (h.shardSize() == 1) return h.shard().detach();
  Tensor out = empty({h.paddedNumel()}, {.dtype = h.shard().dtype(), .device = h.shard().device()});
  f.groups().shard->allgatherIntoTensor(out, h.shard().detach())->wait();
  return out;
}

// Copies the part of `src` (elements [srcStart, srcStart + src.numel()) of a parameter at `paramOffset`
// in the flat buffer) that falls into the shard [lo, lo + shard.numel()).
void copyIntoShard(Tensor& shard, int64_t lo, int64_t paramOffset, int64_t srcStart, const Tensor& src) {
  const int64_t hi = lo + shard.numel();
  const int64_t b = std::max(lo, paramOffset + srcStart), e = std::min(hi, paramOffset + srcStart + src.numel());
  if (b >= e) return;
  shard.narrow(0, b - lo, e - b).copy_(src.narrow(0, b - paramOffset - srcStart, e - b));
}

std::set<std::string> parameterNames(FullyShardedDataParallel& f) {
  std::set<std::string> out;
  for (size_t u = 0; u < f.numUnits(); ++u)
    for (const auto& p : f.unit(u).params())
      for (const auto& n : p.names) out.insert(n);
  return out;
}

void checkOptimizer(FullyShardedDataParallel& f, const optim::Optimizer& opt, const char* op) {
  std::vector<Tensor> ps = opt.parameters();
  bool ok = ps.size() == f.numUnits();
  for (size_t u = 0; ok && u < ps.size(); ++u) ok = ps[u].isSameAs(f.unit(u).shard());
  if (!ok) {
    throw ValueError(fmt::format("{}: the optimizer holds {} parameters that are not this FSDP model's {} shards in "
                                 "order; build it over fsdp.parameters()",
                                 op, ps.size(), f.numUnits()));
  }
}

// FNV-1a over every tensor's name and bytes, in name order: safetensors has no checksum of its
// own, and a flipped bit in the data must not load silently.
std::string checksum(const io::TensorDict& tensors) {
  std::vector<std::pair<std::string, Tensor>> sorted;
  for (const auto& [name, t] : tensors) sorted.emplace_back(name, t);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  };
  for (const auto& [name, t] : sorted) {
    mix(reinterpret_cast<const unsigned char*>(name.data()), name.size() + 1);
    if (t.numel() == 0) continue;
    Tensor c = t.to(Device::cpu()).contiguous();  // a shard on a GPU is read on the host
    mix(static_cast<const unsigned char*>(c.dataPtr()), c.nbytes());
  }
  return fmt::format("{:016x}", h);
}

std::string joinProblems(const std::vector<std::string>& problems) {
  std::string s;
  for (size_t i = 0; i < problems.size() && i < 8; ++i) s += (i ? "; " : "") + problems[i];
  if (problems.size() > 8) s += fmt::format("; and {} more", problems.size() - 8);
  return s;
}

}  // namespace

nn::StateDict fullStateDict(FullyShardedDataParallel& f, FullStateDictOptions options) {
  autograd::NoGradGuard noGrad;
  std::map<std::string, Tensor> byName;
  for (size_t u = 0; u < f.numUnits(); ++u) {
    FlatParamHandle& h = f.unit(u);
    Tensor flat = gatherMaster(f, h);
    for (const auto& p : h.params()) {
      Tensor v = flat.narrow(0, p.offset, p.numel).view(p.shape).clone();
      for (const auto& n : p.names) byName[n] = v;
    }
  }
  nn::StateDict out;
  if (options.rank0Only && f.processGroup().rank() != 0) return out;
  for (const auto& [key, t] : f.module().stateDict()) {
    auto it = byName.find(key);
    out.insert(key, it != byName.end() ? it->second : t.detach().clone());
  }
  return out;
}

void loadFullStateDict(FullyShardedDataParallel& f, const nn::StateDict& dict) {
  nn::StateDict current = f.module().stateDict();
  std::map<std::string, Shape> shapes;
  for (size_t u = 0; u < f.numUnits(); ++u)
    for (const auto& p : f.unit(u).params())
      for (const auto& n : p.names) shapes[n] = p.shape;
  std::vector<std::string> problems;
  for (const auto& [key, t] : current) {
    const Tensor* v = dict.find(key);
    const Shape want = shapes.contains(key) ? shapes[key] : t.sizes();
    if (v == nullptr) problems.push_back(fmt::format("missing key '{}'", key));
    else if (v->sizes() != want)
      problems.push_back(
          fmt::format("'{}' has shape {} in the dict, {} in the model", key, shapeStr(v->sizes()), shapeStr(want)));
  }
  for (const auto& [key, t] : dict)
    if (!current.contains(key)) problems.push_back(fmt::format("unexpected key '{}'", key));
  if (!problems.empty())
    throw ValueError(
        fmt::format("FSDP loadFullStateDict: the dict does not match the model: {}", joinProblems(problems)));

  autograd::NoGradGuard noGrad;
  for (size_t u = 0; u < f.numUnits(); ++u) {
    FlatParamHandle& h = f.unit(u);
    const int64_t lo = static_cast<int64_t>(h.shardRank()) * h.shardNumel();
    Tensor shard = h.shard().detach();
    for (const auto& p : h.params()) copyIntoShard(shard, lo, p.offset, 0, dict.at(p.name).detach().reshape({-1}));
  }
  for (const auto& [key, t] : current) {
    if (shapes.contains(key)) continue;
    Tensor dst = t.detach();
    dst.copy_(dict.at(key));
  }
}

std::string shardFileName(const std::string& dir, int index, int count) {
  return (fs::path(dir) / fmt::format("shard-{}-of-{}.safetensors", index, count)).string();
}

std::optional<WrittenShard> writeShardFile(FullyShardedDataParallel& f, const std::string& dir,
                                           const optim::Optimizer* optimizer, const io::Metadata& extraMetadata) {
  const char* op = "FSDP saveShardedCheckpoint";
  const int n = numShards(f), i = shardIndex(f);
  const bool writer = !f.groups().replicate || f.groups().replicate->rank() == 0;
  std::optional<optim::OptimizerStateDict> osd;
  if (optimizer) {
    checkOptimizer(f, *optimizer, op);
    osd = optimizer->stateDict();
  }
  if (!writer) return std::nullopt;
  {
    io::TensorDict tensors;
    json layout;
    layout["params"] = json::array();
    layout["buffers"] = json::array();
    layout["optimizer_steps"] = json::object();
    for (size_t u = 0; u < f.numUnits(); ++u) {
      FlatParamHandle& h = f.unit(u);
      const int64_t lo = static_cast<int64_t>(h.shardRank()) * h.shardNumel(), hi = lo + h.shardNumel();
      // This unit's optimizer state: "state.<u>.<key>".
      std::map<std::string, Tensor> state;
      std::optional<int64_t> step;
      if (osd) {
        const std::string prefix = fmt::format("state.{}.", u);
        for (const auto& [name, t] : osd->tensors) {
          if (name.rfind(prefix, 0) != 0) continue;
          std::string key = name.substr(prefix.size());
          if (key == "step") step = static_cast<int64_t>(std::llround(t.itemDouble()));
          else if (t.numel() == h.shardNumel()) state[key] = t.reshape({-1});
          else
            throw NotSupportedError(fmt::format("{}: optimizer state '{}' of unit {} has {} elements, not the shard's "
                                                "{}; only per-element state can be sharded",
                                                op, name, u, t.numel(), h.shardNumel()));
        }
      }
      for (const auto& p : h.params()) {
        int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
        if (b >= e) b = e = p.offset;  // this shard holds none of it: an empty range
        const int64_t at = e > b ? b - lo : 0;
        tensors.insert("param/" + p.name, h.shard().detach().narrow(0, at, e - b));
        for (const auto& [key, t] : state) tensors.insert("optim/" + key + "/" + p.name, t.narrow(0, at, e - b));
        layout["params"].push_back(
            {{"name", p.name}, {"shape", p.shape}, {"start", b - p.offset}, {"end", e - p.offset}});
        if (step) layout["optimizer_steps"][p.name] = *step;
      }
    }
    if (i == 0) {
      std::set<std::string> params = parameterNames(f);
      for (const auto& [key, t] : f.module().stateDict()) {
        if (params.contains(key)) continue;
        tensors.insert("buffer/" + key, t);
        layout["buffers"].push_back(key);
      }
    }
    io::Metadata md{{"format", kShardedFormat},
                    {"version", "1"},
                    {"num_shards", std::to_string(n)},
                    {"shard_index", std::to_string(i)},
                    {"layout", layout.dump()}};
    if (osd) md["optimizer"] = osd->metadataJson();
    md["checksum"] = checksum(tensors);
    for (const auto& [k, v] : extraMetadata) md.emplace(k, v);  // the format's own keys win
    fs::create_directories(dir);
    WrittenShard out{shardFileName(dir, i, n), i, n, {}};
    out.digest = io::saveSafetensors(out.path, tensors, md);
    return out;
  }
}

std::string saveShardedCheckpoint(FullyShardedDataParallel& f, const std::string& dir,
                                  const optim::Optimizer* optimizer) {
  const int n = numShards(f);
  std::optional<WrittenShard> written = writeShardFile(f, dir, optimizer);
  const std::string file = written ? written->path : "";
  f.processGroup().barrier()->wait();
  if (f.processGroup().rank() == 0) {
    // Shards of an older checkpoint with another count would make the folder ambiguous.
    static const std::regex kShardFile(R"(shard-(\d+)-of-(\d+)\.safetensors)");
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::smatch m;
      std::string name = entry.path().filename().string();
      if (std::regex_match(name, m, kShardFile) && std::stoi(m[2].str()) != n) fs::remove(entry.path());
    }
  }
  f.processGroup().barrier()->wait();
  return file;
}

namespace {

struct Piece {
  int64_t start = 0, end = 0;
  Tensor data;
};

// Pieces of one tensor (a parameter or one optimizer state of it) must tile [0, numel).
void checkTiling(std::vector<Piece>& pieces, int64_t numel, const std::string& what, const std::string& dir) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.start < b.start; });
  int64_t cur = 0;
  for (const Piece& p : pieces) {
    if (p.start == p.end) continue;
    if (p.start != cur)
      throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': {} elements [{}, {}) are {}", dir, what,
                                        std::min(cur, p.start), std::max(cur, p.start),
                                        p.start > cur ? "in no shard file" : "in two shard files"));
    cur = p.end;
  }
  if (cur != numel)
    throw CheckpointError(
        fmt::format("FSDP sharded checkpoint '{}': {} elements [{}, {}) are in no shard file", dir, what, cur, numel));
}

}  // namespace

void loadShardedCheckpoint(FullyShardedDataParallel& f, const std::string& dir, optim::Optimizer* optimizer) {
  const char* op = "FSDP loadShardedCheckpoint";
  if (optimizer) checkOptimizer(f, *optimizer, op);
  if (!fs::is_directory(dir)) throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': no such folder", dir));

  // The shard files and their count.
  static const std::regex kShardFile(R"(shard-(\d+)-of-(\d+)\.safetensors)");
  std::map<int, std::set<int>> found;  // count -> indices
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kShardFile)) found[std::stoi(m[2].str())].insert(std::stoi(m[1].str()));
  }
  if (found.empty())
    throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': no shard-<i>-of-<n>.safetensors files", dir));
  if (found.size() > 1)
    throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': shard files of two checkpoints (of {} and of {} "
                                      "shards)",
                                      dir, found.begin()->first, std::next(found.begin())->first));
  const int n = found.begin()->first;
  for (int i = 0; i < n; ++i) {
    if (!found.begin()->second.contains(i))
      throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': shard file {} is missing ({} of {} shard files "
                                        "present)",
                                        dir, shardFileName(dir, i, n), found.begin()->second.size(), n));
  }

  std::vector<io::SafetensorsContents> files(n);
  for (int i = 0; i < n; ++i) files[i] = io::loadSafetensors(shardFileName(dir, i, n));
  prepareShardedLoad(f, dir, std::move(files), optimizer)();
}

std::function<void()> prepareShardedLoad(FullyShardedDataParallel& f, const std::string& dir,
                                         std::vector<io::SafetensorsContents> files, optim::Optimizer* optimizer) {
  const char* op = "FSDP loadShardedCheckpoint";
  if (optimizer) checkOptimizer(f, *optimizer, op);
  const int n = static_cast<int>(files.size());
  if (n == 0) throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': no shard files", dir));
  std::vector<json> layouts(n);
  for (int i = 0; i < n; ++i) {
    const std::string file = shardFileName(dir, i, n);
    const auto& md = files[i].metadata;
    auto get = [&](const char* key) -> std::string {
      auto it = md.find(key);
      if (it == md.end())
        throw CheckpointError(fmt::format("{}: not an FSDP shard file (no metadata '{}')", file, key));
      return it->second;
    };
    if (get("format") != kShardedFormat)
      throw CheckpointError(fmt::format("{}: format '{}', expected '{}'", file, get("format"), kShardedFormat));
    if (get("version") != "1") throw CheckpointError(fmt::format("{}: unsupported version '{}'", file, get("version")));
    if (get("checksum") != checksum(files[i].tensors))
      throw CheckpointError(fmt::format("{}: the tensor data does not match the checksum written with it (the file "
                                        "was changed or damaged after it was saved)",
                                        file));
    if (get("num_shards") != std::to_string(n) || get("shard_index") != std::to_string(i))
      throw CheckpointError(fmt::format("{}: its metadata says shard {} of {}, its name shard {} of {}", file,
                                        get("shard_index"), get("num_shards"), i, n));
    try {
      layouts[i] = json::parse(get("layout"));
      if (!layouts[i].contains("params") || !layouts[i]["params"].is_array()) throw std::runtime_error("no params");
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("{}: unreadable layout metadata ({})", file, e.what()));
    }
  }

  // Every parameter's pieces, checked against the model.
  struct CkParam {
    Shape shape;
    std::vector<Piece> pieces;
    std::map<std::string, std::vector<Piece>> state;  // optimizer key -> pieces
    std::optional<int64_t> step;
  };
  std::map<std::string, CkParam> ck;
  for (int i = 0; i < n; ++i) {
    const std::string file = shardFileName(dir, i, n);
    try {
      for (const auto& e : layouts[i]["params"]) {
        const std::string name = e.at("name").get<std::string>();
        Shape shape = e.at("shape").get<Shape>();
        Piece piece{e.at("start").get<int64_t>(), e.at("end").get<int64_t>(), Tensor()};
        const Tensor* t = files[i].tensors.find("param/" + name);
        if (t == nullptr || t->dim() != 1 || t->numel() != piece.end - piece.start || piece.start < 0 ||
            piece.end > shapeNumel(shape))
          throw CheckpointError(fmt::format("{}: the layout's range [{}, {}) of '{}' does not match its tensor {}",
                                            file, piece.start, piece.end, name, t ? shapeStr(t->sizes()) : "(absent)"));
        piece.data = *t;
        auto [it, fresh] = ck.try_emplace(name);
        if (fresh) it->second.shape = shape;
        else if (it->second.shape != shape)
          throw CheckpointError(fmt::format("{}: '{}' has shape {} here and {} in another shard file", file, name,
                                            shapeStr(shape), shapeStr(it->second.shape)));
        it->second.pieces.push_back(piece);
        const std::string prefixEnd = "/" + name;
        for (const auto& [tname, tv] : files[i].tensors) {
          if (tname.rfind("optim/", 0) != 0 || tname.size() <= prefixEnd.size() ||
              tname.compare(tname.size() - prefixEnd.size(), prefixEnd.size(), prefixEnd) != 0)
            continue;
          std::string key = tname.substr(6, tname.size() - 6 - prefixEnd.size());
          if (key.find('/') != std::string::npos) continue;  // belongs to a parameter whose name ends like this one
          if (tv.numel() != piece.end - piece.start)
            throw CheckpointError(fmt::format("{}: optimizer state '{}' has {} elements for a range of {}", file, tname,
                                              tv.numel(), piece.end - piece.start));
          it->second.state[key].push_back({piece.start, piece.end, tv});
        }
        if (layouts[i].contains("optimizer_steps") && layouts[i]["optimizer_steps"].contains(name))
          it->second.step = layouts[i]["optimizer_steps"][name].get<int64_t>();
      }
    } catch (const json::exception& e) {
      throw CheckpointError(fmt::format("{}: malformed layout metadata ({})", file, e.what()));
    }
  }

  std::vector<std::string> problems;
  std::set<std::string> modelNames;
  for (size_t u = 0; u < f.numUnits(); ++u) {
    for (const auto& p : f.unit(u).params()) {
      modelNames.insert(p.name);
      auto it = ck.find(p.name);
      if (it == ck.end()) problems.push_back(fmt::format("parameter '{}' is not in the checkpoint", p.name));
      else if (it->second.shape != p.shape)
        problems.push_back(fmt::format("parameter '{}' has shape {} in the checkpoint, {} in the model", p.name,
                                       shapeStr(it->second.shape), shapeStr(p.shape)));
    }
  }
  for (const auto& [name, c] : ck)
    if (!modelNames.contains(name))
      problems.push_back(fmt::format("the checkpoint's parameter '{}' is not in the model", name));
  // Buffers (file 0).
  std::set<std::string> paramNames = parameterNames(f);
  nn::StateDict current = f.module().stateDict();
  for (const auto& [key, t] : current) {
    if (paramNames.contains(key)) continue;
    const Tensor* b = files[0].tensors.find("buffer/" + key);
    if (b == nullptr) problems.push_back(fmt::format("buffer '{}' is not in the checkpoint", key));
    else if (b->sizes() != t.sizes())
      problems.push_back(fmt::format("buffer '{}' has shape {} in the checkpoint, {} in the model", key,
                                     shapeStr(b->sizes()), shapeStr(t.sizes())));
  }
  if (!problems.empty())
    throw CheckpointError(
        fmt::format("FSDP sharded checkpoint '{}' does not match this model: {}", dir, joinProblems(problems)));
  for (auto& [name, c] : ck) checkTiling(c.pieces, shapeNumel(c.shape), fmt::format("parameter '{}'", name), dir);

  // This rank's new shards, built aside.
  autograd::NoGradGuard noGrad;
  std::vector<Tensor> shards;
  for (size_t u = 0; u < f.numUnits(); ++u) {
    FlatParamHandle& h = f.unit(u);
    const int64_t lo = static_cast<int64_t>(h.shardRank()) * h.shardNumel();
    Tensor s = zeros({h.shardNumel()}, {.dtype = h.shard().dtype()});
    for (const auto& p : h.params())
      for (const Piece& piece : ck.at(p.name).pieces) copyIntoShard(s, lo, p.offset, piece.start, piece.data);
    shards.push_back(s);
  }

  std::optional<optim::OptimizerStateDict> newOptimizerState;
  if (optimizer) {
    auto it = files[0].metadata.find("optimizer");
    if (it == files[0].metadata.end())
      throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}' holds no optimizer state (saved without an "
                                        "optimizer)",
                                        dir));
    optim::OptimizerStateDict osd;
    try {
      osd.setMetadataFromJson(it->second);
    } catch (const Error& e) {
      throw CheckpointError(fmt::format("{}: unreadable optimizer metadata: {}", shardFileName(dir, 0, n), e.what()));
    }
    if (osd.type != optimizer->type())
      throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}' holds {} state; the optimizer is {}", dir,
                                        osd.type, optimizer->type()));
    size_t indices = 0;
    for (const auto& g : osd.groups) indices += g.params.size();
    if (indices != f.numUnits())
      throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': the optimizer's groups hold {} parameters; this "
                                        "model has {} units (wrap the model as it was when saved)",
                                        dir, indices, f.numUnits()));
    for (size_t u = 0; u < f.numUnits(); ++u) {
      FlatParamHandle& h = f.unit(u);
      const auto& first = ck.at(h.params().front().name);
      if (!first.step) continue;  // no state yet
      const int64_t lo = static_cast<int64_t>(h.shardRank()) * h.shardNumel();
      for (const auto& p : h.params()) {
        const auto& c = ck.at(p.name);
        if (c.step != first.step || c.state.size() != first.state.size())
          throw CheckpointError(fmt::format("FSDP sharded checkpoint '{}': parameters '{}' and '{}' (one unit here) "
                                            "have different optimizer steps or state",
                                            dir, h.params().front().name, p.name));
      }
      osd.tensors[fmt::format("state.{}.step", u)] =
          full(Shape{}, static_cast<double>(*first.step), {.dtype = DType::Float32});
      for (const auto& [key, firstPieces] : first.state) {
        // The state's own dtype, not the shard's: a bfloat16 model's float32 master weights and
        // moments stay float32.
        Tensor s = zeros({h.shardNumel()}, {.dtype = firstPieces.front().data.dtype()});
        for (const auto& p : h.params()) {
          auto pit = ck.at(p.name).state.find(key);
          if (pit == ck.at(p.name).state.end())
            throw CheckpointError(
                fmt::format("FSDP sharded checkpoint '{}': no optimizer state '{}' for '{}'", dir, key, p.name));
          std::vector<Piece> pieces = pit->second;
          checkTiling(pieces, p.numel, fmt::format("optimizer state '{}' of '{}'", key, p.name), dir);
          for (const Piece& piece : pieces) copyIntoShard(s, lo, p.offset, piece.start, piece.data);
        }
        osd.tensors[fmt::format("state.{}.{}", u, key)] = s;
      }
    }
    newOptimizerState = std::move(osd);
  }

  // Everything checked: what the returned function writes. The optimizer first: its loadStateDict
  // checks the options it holds before it writes, and a failure there leaves everything as it was.
  std::vector<std::pair<Tensor, Tensor>> buffers;  // (module buffer, value)
  for (const auto& [key, t] : current)
    if (!paramNames.contains(key)) buffers.emplace_back(t, *files[0].tensors.find("buffer/" + key));
  return [&f, optimizer, dir, shards = std::move(shards), buffers = std::move(buffers),
          osd = std::move(newOptimizerState)] {
    autograd::NoGradGuard noGrad;
    if (optimizer && osd) {
      try {
        optimizer->loadStateDict(*osd);
      } catch (const CheckpointError&) {
        throw;
      } catch (const Error& e) {
        throw CheckpointError(
            fmt::format("FSDP sharded checkpoint '{}': the optimizer does not match: {}", dir, e.what()));
      }
    }
    for (size_t u = 0; u < f.numUnits(); ++u) {
      Tensor dst = f.unit(u).shard().detach();
      dst.copy_(shards[u]);
    }
    for (const auto& [t, value] : buffers) {
      Tensor dst = t.detach();
      dst.copy_(value);
    }
  };
}

}  // namespace cohort::fsdp
