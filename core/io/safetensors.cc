#include <cohort/core/io/safetensors.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cohort/core/io/atomic_file.h>
#include <cohort/core/ops/ops.h>

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; cohort writes tensor bytes as they are in memory");

namespace cohort::io {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The reference implementation's limit; a larger "header" is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by offset
  Metadata metadata;
  uint64_t dataStart = 0;  // file offset of the tensor buffer
};

using ReadAt = std::function<void(uint64_t offset, size_t n, void* dst)>;

[[noreturn]] void fail(const std::string& what, const std::string& msg) {
  throw CheckpointError(fmt::format("safetensors '{}': {}", what, msg));
}

uint64_t readU64LE(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t jsonU64(const json& v, const std::string& what, const std::string& field) {
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
    fail(what, fmt::format("{} must be a non-negative integer, got {}", field, v.dump()));
  return v.get<uint64_t>();
}

Header parseHeader(const std::string& what, uint64_t fileSize, const ReadAt& readAt) {
  if (fileSize < 8)
    fail(what, fmt::format("the file is {} bytes, too short for the 8-byte header length (truncated?)", fileSize));
  unsigned char lenBytes[8];
  readAt(0, 8, lenBytes);
  const uint64_t n = readU64LE(lenBytes);
  if (n > fileSize - 8)
    fail(what, fmt::format("the header length field says {} bytes, but only {} bytes follow it (truncated, or not a "
                           "safetensors file)",
                           n, fileSize - 8));
  if (n > kMaxHeaderBytes)
    fail(what, fmt::format("the header length {} exceeds the {} byte limit", n, kMaxHeaderBytes));
  if (n < 2) fail(what, fmt::format("the header is {} bytes, too short for a JSON object", n));
  std::string text(n, '\0');
  readAt(8, n, text.data());
  if (text[0] != '{') fail(what, "the header does not start with '{' (garbage header, or not a safetensors file)");

  // Parse, rejecting duplicate top-level keys (nlohmann would silently keep the last one).
  std::set<std::string> seen;
  std::string duplicate;
  json h;
  try {
    h = json::parse(text, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 1 && ev == json::parse_event_t::key) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const json::exception& e) {
    fail(what, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) fail(what, fmt::format("the header names '{}' twice", duplicate));
  if (!h.is_object()) fail(what, "the header is not a JSON object");

  Header out;
  out.dataStart = 8 + n;
  const uint64_t bufferSize = fileSize - out.dataStart;
  for (auto& [key, val] : h.items()) {
    if (key == "__metadata__") {
      if (!val.is_object()) fail(what, "__metadata__ must be an object of strings");
      for (auto& [mk, mv] : val.items()) {
        if (!mv.is_string()) fail(what, fmt::format("__metadata__ value of '{}' is not a string: {}", mk, mv.dump()));
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", key);
    if (!val.is_object()) fail(what, fmt::format("{}: its entry is not an object", where));
    for (const char* f : {"dtype", "shape", "data_offsets"})
      if (!val.contains(f)) fail(what, fmt::format("{}: the entry has no \"{}\"", where, f));
    Entry e;
    e.name = key;
    const json& dt = val["dtype"];
    if (!dt.is_string()) fail(what, fmt::format("{}: dtype is not a string: {}", where, dt.dump()));
    try {
      e.dtype = dtypeFromSafetensors(dt.get<std::string>());
    } catch (const CheckpointError& err) {
      fail(what, fmt::format("{}: {}", where, err.what()));
    }
    const json& shape = val["shape"];
    if (!shape.is_array()) fail(what, fmt::format("{}: shape is not an array: {}", where, shape.dump()));
    unsigned __int128 numel = 1;
    for (const json& d : shape) {
      uint64_t v = jsonU64(d, what, where + " shape entry");
      if (v > static_cast<uint64_t>(INT64_MAX)) fail(what, fmt::format("{}: shape entry {} is too large", where, v));
      e.shape.push_back(static_cast<int64_t>(v));
      numel *= v;
      if (numel > (static_cast<unsigned __int128>(1) << 62))
        fail(what, fmt::format("{}: shape {} is too large", where, shape.dump()));
    }
    const json& off = val["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      fail(what, fmt::format("{}: data_offsets must be [begin, end], got {}", where, off.dump()));
    e.begin = jsonU64(off[0], what, where + " data_offsets[0]");
    e.end = jsonU64(off[1], what, where + " data_offsets[1]");
    if (e.begin > e.end)
      fail(what, fmt::format("{}: data_offsets [{}, {}] end before they begin", where, e.begin, e.end));
    if (e.end > bufferSize)
      fail(what, fmt::format("{}: data_offsets [{}, {}] reach past the end of the {}-byte data buffer (truncated?)",
                             where, e.begin, e.end, bufferSize));
    const unsigned __int128 expect = numel * elementSize(e.dtype);
    if (expect != e.end - e.begin)
      fail(what, fmt::format("{}: dtype {} and shape {} need {} bytes, but data_offsets [{}, {}] hold {}", where,
                             dt.get<std::string>(), shape.dump(), static_cast<uint64_t>(expect), e.begin, e.end,
                             e.end - e.begin));
    out.entries.push_back(std::move(e));
  }

  std::sort(out.entries.begin(), out.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : out.entries) {
    if (e.begin < pos)
      fail(what, fmt::format("tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", e.name, e.begin,
                             e.end, prev->name, prev->begin, prev->end));
    if (e.begin > pos)
      fail(what, fmt::format("bytes [{}, {}) of the data buffer before tensor '{}' belong to no tensor", pos, e.begin,
                             e.name));
    pos = e.end;
    prev = &e;
  }
  if (pos != bufferSize)
    fail(what, fmt::format("the data buffer is {} bytes but the tensors cover {} (trailing garbage, or a wrong header)",
                           bufferSize, pos));
  return out;
}

SafetensorsContents readAll(const std::string& what, uint64_t fileSize, const ReadAt& readAt) {
  Header h = parseHeader(what, fileSize, readAt);
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    const size_t nbytes = static_cast<size_t>(e.end - e.begin);
    if (nbytes > 0) readAt(h.dataStart + e.begin, nbytes, t.dataPtr());
    if (e.dtype == DType::Bool) {
      const unsigned char* p = static_cast<const unsigned char*>(t.dataPtr());
      for (size_t i = 0; i < nbytes; ++i)
        if (p[i] > 1)
          fail(what, fmt::format("tensor '{}': bool element {} has byte value {} (not 0 or 1)", e.name, i, p[i]));
    }
    out.tensors.insert(e.name, std::move(t));
  }
  return out;
}

// The 8-byte length and the space-padded JSON header for `tensors` in order.
std::string buildHeader(const std::string& what, const TensorDict& tensors, const Metadata& metadata) {
  ordered_json h = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail(what, "a tensor has an empty name");
    if (name == "__metadata__") fail(what, "'__metadata__' is reserved and cannot name a tensor");
    if (!t.defined()) fail(what, fmt::format("tensor '{}' is undefined", name));
    ordered_json e = ordered_json::object();
    e["dtype"] = safetensorsDType(t.dtype());
    e["shape"] = t.sizes();
    const uint64_t nbytes = t.nbytes();
    e["data_offsets"] = {offset, offset + nbytes};
    offset += nbytes;
    h[name] = std::move(e);
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const ordered_json::exception& e) {
    fail(what, fmt::format("cannot encode the header (tensor names and metadata must be valid UTF-8): {}", e.what()));
  }
  // Pad to 8 bytes so the data buffer starts aligned, as the reference writer does.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

// Emits the header, then each tensor's bytes, converting (contiguous, CPU) one tensor at a time.
void emit(const std::string& what, const TensorDict& tensors, const Metadata& metadata,
          const std::function<void(const void*, size_t)>& sink) {
  std::string header = buildHeader(what, tensors, metadata);
  sink(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    Tensor c;
    const void* p = nullptr;
    try {
      c = t.device().isCpu() ? t : t.to(Device::cpu());
      c = c.contiguous();
      p = c.dataPtr();
    } catch (const Error& e) {
      fail(what, fmt::format("cannot read the data of tensor '{}': {}", name, e.what()));
    }
    sink(p, c.nbytes());
  }
}

}  // namespace

const char* safetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::UInt8: return "U8";
    case DType::Bool: return "BOOL";
  }
  throw CheckpointError("safetensors: unknown dtype");
}

DType dtypeFromSafetensors(const std::string& name) {
  static const std::pair<const char*, DType> kTable[] = {{"F32", DType::Float32}, {"F64", DType::Float64},
                                                         {"F16", DType::Float16}, {"BF16", DType::BFloat16},
                                                         {"I64", DType::Int64},   {"I32", DType::Int32},
                                                         {"U8", DType::UInt8},    {"BOOL", DType::Bool}};
  for (const auto& [n, d] : kTable)
    if (name == n) return d;
  static const char* kKnownOther[] = {"I8", "I16", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3"};
  for (const char* o : kKnownOther)
    if (name == o)
      throw CheckpointError(
          fmt::format("dtype '{}' has no cohort equivalent (cohort reads F64 F32 F16 BF16 I64 I32 U8 BOOL)", name));
  throw CheckpointError(fmt::format("unknown dtype '{}' (cohort reads F64 F32 F16 BF16 I64 I32 U8 BOOL)", name));
}

std::string serializeSafetensors(const TensorDict& tensors, const Metadata& metadata) {
  std::string out;
  emit("<memory>", tensors, metadata, [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

SafetensorsContents parseSafetensors(std::string_view bytes, const std::string& what) {
  SafetensorsContents out =
      readAll(what, bytes.size(), [&](uint64_t off, size_t n, void* dst) { std::memcpy(dst, bytes.data() + off, n); });
  out.tensors.describeAs(fmt::format("safetensors '{}'", what), "tensor");
  return out;
}

FileDigest saveSafetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata) {
  return writeFileAtomically(path, [&](AtomicWriter& w) {
    emit(path, tensors, metadata, [&](const void* p, size_t n) { w.write(p, n); });
  });
}

SafetensorsContents loadSafetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  SafetensorsContents out = readAll(path, size, [&](uint64_t off, size_t n, void* dst) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        fail(path, fmt::format("read of {} bytes at offset {} failed: {}", n, off, std::strerror(errno)));
      }
      if (r == 0) fail(path, fmt::format("the file ended at offset {} while reading (did it shrink?)", off));
      p += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
  });
  out.tensors.describeAs(fmt::format("safetensors file '{}'", path), "tensor");
  return out;
}

}  // namespace cohort::io
