#include <cohort/fsdp/training_checkpoint.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cohort/core/io/atomic_file.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/fsdp/state_dict.h>

namespace cohort::fsdp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kVersion = 1;
// Metadata every part carries, so a part of another checkpoint is told apart from a damaged one.
constexpr const char* kPartStep = "training_step";
constexpr const char* kPartId = "training_checkpoint";

std::string folderName(int64_t step, uint64_t id) { return fmt::format("step-{}-{:016x}", step, id); }
std::string stateFileName(int rank, int world) { return fmt::format("state-{}-of-{}.safetensors", rank, world); }
std::string shardFileBase(int index, int count) { return fmt::format("shard-{}-of-{}.safetensors", index, count); }
const std::regex& folderPattern() {
  static const std::regex kFolder(R"(step-\d+-[0-9a-f]{16})");
  return kFolder;
}

uint64_t newId() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  return v ^ static_cast<uint64_t>(::getpid());
}

// Every rank's row of `row.size()` integers (each rank passes the same length). Collective.
std::vector<std::vector<int64_t>> allgatherRows(dist::ProcessGroup& pg, const std::vector<int64_t>& row) {
  const int64_t n = static_cast<int64_t>(row.size());
  Tensor mine = fromVector(row);
  Tensor all = empty({n * pg.size()}, {.dtype = DType::Int64});
  pg.allgatherIntoTensor(all, mine)->wait();
  std::vector<int64_t> flat = all.toVector<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(pg.size()));
  for (int r = 0; r < pg.size(); ++r) out[r].assign(flat.begin() + r * n, flat.begin() + (r + 1) * n);
  return out;
}

// After an agreement round whose rows start with each rank's ok flag: rethrows this rank's own error,
// or throws a CheckpointError naming the ranks that failed when another rank did.
void throwIfAnyFailed(const std::vector<std::vector<int64_t>>& rows, const std::exception_ptr& own,
                      const std::string& what, const std::string& doing, const std::string& consequence) {
  if (own) std::rethrow_exception(own);
  std::vector<int> failed;
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r][0] == 0) failed.push_back(static_cast<int>(r));
  if (!failed.empty())
    throw CheckpointError(fmt::format("{}: {} failed on rank{} [{}] (the error there says why); {}", what, doing,
                                      failed.size() == 1 ? "" : "s", fmt::join(failed, ", "), consequence));
}

std::string readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("'{}': cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw CheckpointError(fmt::format("'{}': read failed", path));
  return ss.str();
}

// ---- the manifest ---------------------------------------------------------------------------

struct Part {
  std::string file;  // inside the step folder
  bool shard = false;
  int index = 0;  // shard index, or the rank of a state part
  io::FileDigest digest;
};

struct Manifest {
  std::string path;
  int64_t step = 0;
  uint64_t id = 0;
  std::string folder;
  int worldSize = 1, numShards = 1;
  bool identicalStates = false;
  std::vector<Part> parts;
};

// The JSON's checksum covers its compact dump without the "checksum" field (keys sorted).
std::string manifestChecksum(json j) {
  j.erase("checksum");
  const std::string body = j.dump();
  io::Xxh64 h;
  h.update(body.data(), body.size());
  return io::checksumHex(h.digest());
}

void writeManifest(const Manifest& m) {
  json j;
  j["format"] = kTrainingCheckpointFormat;
  j["version"] = kVersion;
  j["step"] = m.step;
  j["id"] = fmt::format("{:016x}", m.id);
  j["folder"] = m.folder;
  j["world_size"] = m.worldSize;
  j["num_shards"] = m.numShards;
  j["rank_states"] = m.identicalStates ? "identical" : "per-rank";
  j["parts"] = json::array();
  for (const Part& p : m.parts) {
    j["parts"].push_back({{"file", p.file},
                          {"kind", p.shard ? "shard" : "state"},
                          {p.shard ? "index" : "rank", p.index},
                          {"bytes", p.digest.size},
                          {"xxh64", io::checksumHex(p.digest.checksum)}});
  }
  j["checksum"] = manifestChecksum(j);
  const std::string text = j.dump(1) + "\n";
  io::writeFileAtomically(m.path, [&](io::AtomicWriter& w) { w.write(text.data(), text.size()); });
}

[[noreturn]] void badManifest(const std::string& path, const std::string& msg) {
  throw CheckpointError(fmt::format("FSDP training checkpoint manifest '{}': {}", path, msg));
}

template <typename T>
T manifestField(const std::string& path, const json& obj, const char* key, const std::string& where = "") {
  if (!obj.is_object() || !obj.contains(key)) badManifest(path, fmt::format("no \"{}\"{}", key, where));
  const json& v = obj.at(key);
  bool ok;
  if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
  else if constexpr (std::is_unsigned_v<T>) ok = v.is_number_unsigned();
  else ok = v.is_number_integer();
  if (!ok) badManifest(path, fmt::format("\"{}\"{} has the wrong type: {}", key, where, v.dump()));
  return v.get<T>();
}

uint64_t parseHex64(const std::string& path, const std::string& s, const std::string& what) {
  static const std::regex kHex64("[0-9a-f]{16}");
  if (!std::regex_match(s, kHex64)) badManifest(path, fmt::format("{} '{}' is not 16 hex digits", what, s));
  return std::stoull(s, nullptr, 16);
}

Manifest readManifest(const std::string& dir) {
  Manifest m;
  m.path = (fs::path(dir) / kManifestFileName).string();
  std::error_code ec;
  if (!fs::exists(m.path, ec)) {
    if (!fs::is_directory(dir, ec))
      throw CheckpointError(fmt::format("FSDP training checkpoint '{}': no such folder", dir));
    throw CheckpointError(fmt::format("FSDP training checkpoint '{}': no {} in it, so no checkpoint was committed "
                                      "there (parts of a save that did not finish are not a checkpoint)",
                                      dir, kManifestFileName));
  }
  const std::string text = readWholeFile(m.path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    badManifest(m.path, fmt::format("not valid JSON ({} bytes; truncated or corrupt?): {}", text.size(), e.what()));
  }
  if (!j.is_object()) badManifest(m.path, "not a JSON object");
  const std::string sum = manifestField<std::string>(m.path, j, "checksum");
  if (sum != manifestChecksum(j))
    badManifest(m.path, fmt::format("its checksum {} does not match its contents ({}): it was changed or damaged "
                                    "after it was written",
                                    sum, manifestChecksum(j)));
  const std::string format = manifestField<std::string>(m.path, j, "format");
  if (format != kTrainingCheckpointFormat)
    badManifest(m.path, fmt::format("format '{}', expected '{}'", format, kTrainingCheckpointFormat));
  const int64_t version = manifestField<int64_t>(m.path, j, "version");
  if (version != kVersion)
    badManifest(m.path, fmt::format("version {} (this build reads version {})", version, kVersion));
  m.step = manifestField<int64_t>(m.path, j, "step");
  m.id = parseHex64(m.path, manifestField<std::string>(m.path, j, "id"), "the id");
  m.folder = manifestField<std::string>(m.path, j, "folder");
  if (m.folder != folderName(m.step, m.id))
    badManifest(m.path, fmt::format("folder '{}' is not the one of step {} and id {:016x}", m.folder, m.step, m.id));
  m.worldSize = static_cast<int>(manifestField<int64_t>(m.path, j, "world_size"));
  m.numShards = static_cast<int>(manifestField<int64_t>(m.path, j, "num_shards"));
  if (m.worldSize < 1 || m.numShards < 1 || m.numShards > m.worldSize)
    badManifest(m.path, fmt::format("world_size {} and num_shards {} are impossible", m.worldSize, m.numShards));
  const std::string states = manifestField<std::string>(m.path, j, "rank_states");
  if (states != "identical" && states != "per-rank")
    badManifest(m.path, fmt::format("rank_states '{}' is neither 'identical' nor 'per-rank'", states));
  m.identicalStates = states == "identical";
  if (!j.contains("parts") || !j["parts"].is_array()) badManifest(m.path, "no \"parts\" array");
  std::map<std::string, int> seen;
  for (const json& e : j["parts"]) {
    const std::string where = fmt::format(" in part {}", seen.size());
    Part p;
    p.file = manifestField<std::string>(m.path, e, "file", where);
    const std::string kind = manifestField<std::string>(m.path, e, "kind", where);
    if (kind != "shard" && kind != "state") badManifest(m.path, fmt::format("part '{}' has kind '{}'", p.file, kind));
    p.shard = kind == "shard";
    p.index = static_cast<int>(manifestField<int64_t>(m.path, e, p.shard ? "index" : "rank", where));
    p.digest.size = manifestField<uint64_t>(m.path, e, "bytes", where);
    p.digest.checksum = parseHex64(m.path, manifestField<std::string>(m.path, e, "xxh64", where),
                                   fmt::format("the checksum of part '{}'", p.file));
    const std::string expected = p.shard ? shardFileBase(p.index, m.numShards) : stateFileName(p.index, m.worldSize);
    if (p.file != expected || p.index < 0 || p.index >= (p.shard ? m.numShards : m.worldSize))
      badManifest(m.path, fmt::format("part '{}' ({} {}) does not belong to a checkpoint of {} ranks and {} shards",
                                      p.file, kind, p.index, m.worldSize, m.numShards));
    if (seen.count(p.file)) badManifest(m.path, fmt::format("part '{}' is listed twice", p.file));
    seen[p.file] = 1;
    m.parts.push_back(std::move(p));
  }
  if (static_cast<int>(m.parts.size()) != m.numShards + m.worldSize)
    badManifest(m.path, fmt::format("{} parts listed; a checkpoint of {} ranks and {} shards has {}", m.parts.size(),
                                    m.worldSize, m.numShards, m.numShards + m.worldSize));
  return m;
}

// Reads one part, checks it against the manifest (its step and id first: a part of another
// checkpoint is named as such, then its size and checksum) and returns its contents.
io::SafetensorsContents readPart(const Manifest& m, const std::string& path, const Part& part) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw CheckpointError(fmt::format("'{}' is missing: the manifest '{}' of step {} lists it as a part of the "
                                      "checkpoint",
                                      path, m.path, m.step));
  const std::string bytes = readWholeFile(path);
  io::Xxh64 h;
  h.update(bytes.data(), bytes.size());
  const io::FileDigest digest{bytes.size(), h.digest()};
  const std::string digestMismatch =
      fmt::format("it has {} bytes with checksum {}, the manifest '{}' says {} bytes with checksum {}", digest.size,
                  io::checksumHex(digest.checksum), m.path, part.digest.size, io::checksumHex(part.digest.checksum));
  io::SafetensorsContents c;
  try {
    c = io::parseSafetensors(bytes, path);
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("'{}' is damaged: {} ({})", path, digestMismatch, e.what()));
  }
  auto stepIt = c.metadata.find(kPartStep);
  auto idIt = c.metadata.find(kPartId);
  if (stepIt == c.metadata.end() || idIt == c.metadata.end())
    throw CheckpointError(fmt::format("'{}' is not a part of an FSDP training checkpoint (its metadata has no '{}' "
                                      "and '{}'); the manifest '{}' is from step {}",
                                      path, kPartStep, kPartId, m.path, m.step));
  if (stepIt->second != std::to_string(m.step))
    throw CheckpointError(fmt::format("'{}' is from step {}, the manifest '{}' from step {}: the folder mixes files "
                                      "of two checkpoints",
                                      path, stepIt->second, m.path, m.step));
  if (idIt->second != fmt::format("{:016x}", m.id))
    throw CheckpointError(fmt::format("'{}' is from another save of step {} (checkpoint id {}, the manifest '{}' has "
                                      "{:016x}): the folder mixes files of two checkpoints",
                                      path, m.step, idIt->second, m.path, m.id));
  if (digest != part.digest)
    throw CheckpointError(fmt::format("'{}' does not match the manifest: {} (changed or damaged after it was saved)",
                                      path, digestMismatch));
  return c;
}

void removeOlderFolders(const std::string& dir, const std::string& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool staleFolder = name != keep && std::regex_match(name, folderPattern()) && entry.is_directory(ec);
    const bool staleTemp = name.starts_with(fmt::format(".{}.tmp.", kManifestFileName));  // of a killed save
    if (!staleFolder && !staleTemp) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (rm)
      COHORT_LOG(Warning, "FSDP training checkpoint '{}': could not remove '{}' after committing '{}': {}", dir,
                 entry.path().string(), keep, rm.message());
  }
  if (ec)
    COHORT_LOG(Warning, "FSDP training checkpoint '{}': could not list it to remove older saves: {}", dir,
               ec.message());
}

}  // namespace

const char* saveStageName(SaveStage stage) {
  switch (stage) {
    case SaveStage::BeforeParts: return "before-parts";
    case SaveStage::PartsWritten: return "parts-written";
    case SaveStage::PartsAgreed: return "parts-agreed";
    case SaveStage::ManifestWritten: return "manifest-written";
  }
  return "?";
}

std::string saveTrainingCheckpoint(FullyShardedDataParallel& f, const std::string& dir,
                                   const optim::Optimizer* optimizer, const io::TrainingState& state,
                                   const TrainingCheckpointOptions& options) {
  const std::string what = fmt::format("FSDP training checkpoint '{}'", dir);
  dist::ProcessGroup& pg = f.processGroup();
  const int rank = pg.rank(), world = pg.size();
  auto reach = [&](SaveStage s) {
    if (options.onStage) options.onStage(s);
  };

  // 1. The step and the new folder's id, agreed; bad arguments fail every rank before any write.
  std::exception_ptr error;
  uint64_t proposedId = 0;
  try {
    if (dir.empty()) throw ValueError("saveTrainingCheckpoint: the folder name is empty");
    if (!state.model.empty() || state.optimizer)
      throw ValueError(fmt::format("saveTrainingCheckpoint '{}': state.model and state.optimizer must be empty (the "
                                   "FSDP model and its optimizer are saved from their shards)",
                                   dir));
    if (state.step < 0) throw ValueError(fmt::format("saveTrainingCheckpoint '{}': step {} < 0", dir, state.step));
    if (rank == 0) proposedId = newId();
  } catch (...) {
    error = std::current_exception();
  }
  auto rows = allgatherRows(pg, {error ? 0 : 1, state.step, static_cast<int64_t>(proposedId)});
  throwIfAnyFailed(rows, error, what, "saving", "nothing was written");
  for (int r = 1; r < world; ++r)
    if (rows[r][1] != rows[0][1])
      throw ValueError(fmt::format("{}: the ranks save different steps (rank 0 step {}, rank {} step {}); every rank "
                                   "must save the same step; nothing was written",
                                   what, rows[0][1], r, rows[r][1]));
  const int64_t step = state.step;
  const uint64_t id = static_cast<uint64_t>(rows[0][2]);
  const std::string folderBase = folderName(step, id);
  const std::string folder = (fs::path(dir) / folderBase).string();
  const std::string idHex = fmt::format("{:016x}", id);

  // 2. This rank's parts, durable.
  reach(SaveStage::BeforeParts);
  std::optional<WrittenShard> shard;
  io::FileDigest stateDigest;
  try {
    std::error_code ec;
    const fs::path parent = fs::path(dir).has_parent_path() ? fs::path(dir).parent_path() : fs::path(".");
    if (fs::create_directories(dir, ec)) io::syncDirectory(parent.string());
    if (ec) throw CheckpointError(fmt::format("{}: cannot create the folder: {}", what, ec.message()));
    if (fs::create_directories(folder, ec)) io::syncDirectory(dir);
    if (ec) throw CheckpointError(fmt::format("{}: cannot create '{}': {}", what, folder, ec.message()));
    shard = writeShardFile(f, folder, optimizer, {{kPartStep, std::to_string(step)}, {kPartId, idHex}});
    const std::string statePath = (fs::path(folder) / stateFileName(rank, world)).string();
    io::SafetensorsContents c = io::encodeCheckpoint(state, statePath);
    c.metadata[kPartStep] = std::to_string(step);
    c.metadata[kPartId] = idHex;
    stateDigest = io::saveSafetensors(statePath, c.tensors, c.metadata);
  } catch (...) {
    error = std::current_exception();
  }
  if (!error) reach(SaveStage::PartsWritten);

  // 3. The barrier: every rank's parts are durable, and rank 0 learns their digests.
  rows = allgatherRows(pg, {error ? 0 : 1, shard ? 1 : 0, shard ? shard->index : 0, shard ? shard->count : 0,
                            static_cast<int64_t>(shard ? shard->digest.size : 0),
                            static_cast<int64_t>(shard ? shard->digest.checksum : 0),
                            static_cast<int64_t>(stateDigest.size), static_cast<int64_t>(stateDigest.checksum)});
  throwIfAnyFailed(rows, error, what, fmt::format("writing the parts of step {}", step),
                   "no checkpoint was committed, the previous one stays");
  reach(SaveStage::PartsAgreed);

  // 4. Rank 0 commits: the manifest, written last. 5. Then the older folders go.
  Manifest m;
  m.path = (fs::path(dir) / kManifestFileName).string();
  if (rank == 0) {
    try {
      m.step = step;
      m.id = id;
      m.folder = folderBase;
      m.worldSize = world;
      std::map<int, Part> shards;
      int count = 0;
      for (const auto& row : rows) {
        if (row[1] == 0) continue;
        count = static_cast<int>(row[3]);
        Part p{shardFileBase(static_cast<int>(row[2]), count),
               true,
               static_cast<int>(row[2]),
               {static_cast<uint64_t>(row[4]), static_cast<uint64_t>(row[5])}};
        if (!shards.emplace(p.index, p).second)
          throw CheckpointError(fmt::format("{}: two ranks wrote shard {} of {}", what, p.index, count));
      }
      if (count == 0 || static_cast<int>(shards.size()) != count)
        throw CheckpointError(fmt::format("{}: {} shard files were written for {} shards", what, shards.size(), count));
      m.numShards = count;
      for (auto& [i, p] : shards) m.parts.push_back(p);
      m.identicalStates = true;
      for (int r = 0; r < world; ++r) {
        const io::FileDigest d{static_cast<uint64_t>(rows[r][6]), static_cast<uint64_t>(rows[r][7])};
        m.parts.push_back({stateFileName(r, world), false, r, d});
        if (!(d == io::FileDigest{static_cast<uint64_t>(rows[0][6]), static_cast<uint64_t>(rows[0][7])}))
          m.identicalStates = false;
      }
      writeManifest(m);
    } catch (...) {
      error = std::current_exception();
    }
    if (!error) {
      reach(SaveStage::ManifestWritten);
      removeOlderFolders(dir, folderBase);
    }
  }

  // 6. Every rank learns whether the commit happened.
  Tensor committed = fromVector(std::vector<int64_t>{error ? 0 : 1});
  pg.broadcast(committed, {.root = 0})->wait();
  if (error) std::rethrow_exception(error);
  if (committed.toVector<int64_t>()[0] == 0)
    throw CheckpointError(fmt::format("{}: rank 0 could not write the manifest of step {} (the error there says why); "
                                      "no checkpoint was committed, the previous one stays",
                                      what, step));
  return m.path;
}

io::TrainingState loadTrainingCheckpoint(FullyShardedDataParallel& f, const std::string& dir,
                                         const TrainingCheckpointTargets& targets) {
  const std::string what = fmt::format("FSDP training checkpoint '{}'", dir);
  dist::ProcessGroup& pg = f.processGroup();
  const int rank = pg.rank(), world = pg.size();
  const io::RestoreTargets stateTargets{.scheduler = targets.scheduler,
                                        .loader = targets.loader,
                                        .generator = targets.generator,
                                        .gradScaler = targets.gradScaler};

  std::exception_ptr error;
  io::TrainingState st;
  std::string statePath;
  std::function<void()> applyShards;
  try {
    const Manifest m = readManifest(dir);
    const std::string folder = (fs::path(dir) / m.folder).string();
    // The state part this rank takes: its own on the same number of ranks, else rank 0's, which
    // stands for every rank only when all saved the same.
    int stateRank = rank;
    if (world != m.worldSize) {
      if (!m.identicalStates)
        throw CheckpointError(fmt::format("{}: it was saved by {} ranks whose training states (RNG states, data "
                                          "positions, ...) differ, and there is no right way to hand them to {} "
                                          "ranks; resume on {} ranks",
                                          what, m.worldSize, world, m.worldSize));
      stateRank = 0;
    }
    std::vector<io::SafetensorsContents> shards(static_cast<size_t>(m.numShards));
    std::optional<io::SafetensorsContents> mine;
    for (const Part& p : m.parts) {  // every part on every rank: all ranks reach the same verdict
      const std::string path = (fs::path(folder) / p.file).string();
      io::SafetensorsContents c = readPart(m, path, p);
      if (p.shard) {
        shards[static_cast<size_t>(p.index)] = std::move(c);
      } else if (p.index == stateRank) {
        mine = std::move(c);
        statePath = path;
      }
    }
    st = io::decodeCheckpoint(std::move(*mine), statePath);
    if (st.step != m.step)
      throw CheckpointError(
          fmt::format("'{}' holds step {}, the manifest '{}' step {}", statePath, st.step, m.path, m.step));
    applyShards = prepareShardedLoad(f, folder, std::move(shards), targets.optimizer);
    if (targets.scheduler && targets.optimizer && st.scheduler &&
        st.scheduler->baseLrs.size() != targets.optimizer->paramGroups().size())
      throw CheckpointError(fmt::format("'{}': the scheduler state has {} base lrs for the optimizer's {} groups",
                                        statePath, st.scheduler->baseLrs.size(),
                                        targets.optimizer->paramGroups().size()));
    io::checkRestore(statePath, st, stateTargets);
  } catch (...) {
    error = std::current_exception();
  }
  // Nothing changes on any rank unless every rank is ready.
  auto rows = allgatherRows(pg, {error ? 0 : 1});
  throwIfAnyFailed(rows, error, what, "loading", "nothing was restored on any rank");
  applyShards();
  io::applyRestore(statePath, st, stateTargets);
  return st;
}

bool hasTrainingCheckpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kManifestFileName, ec);
}

}  // namespace cohort::fsdp
