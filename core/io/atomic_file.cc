#include <cohort/core/io/atomic_file.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::io {
namespace {

std::string osError(int err) { return std::strerror(err); }

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                   kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
uint64_t xxRound(uint64_t acc, uint64_t input) { return rotl(acc + input * kP2, 31) * kP1; }
uint64_t mergeRound(uint64_t acc, uint64_t v) { return (acc ^ xxRound(0, v)) * kP1 + kP4; }

// Closes an fd and removes the temporary file unless disarmed.
struct TempFile {
  int fd = -1;
  std::string path;
  bool keep = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!keep && !path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

void Xxh64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ > 0) {
    size_t take = std::min(n, sizeof buf_ - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < sizeof buf_) return;
    for (int i = 0; i < 4; ++i) v_[i] = xxRound(v_[i], read64(buf_ + 8 * i));
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32)
    for (int i = 0; i < 4; ++i) v_[i] = xxRound(v_[i], read64(p + 8 * i));
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (uint64_t v : v_) h = mergeRound(h, v);
  } else {
    h = v_[2] + kP5;  // v_[2] is the seed until the first stripe
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ xxRound(0, read64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string checksumHex(uint64_t checksum) { return fmt::format("{:016x}", checksum); }

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(
          fmt::format("writing '{}': write failed after {} bytes: {}", path_, written_, osError(errno)));
    }
    hash_.update(p, static_cast<size_t>(w));
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

FileDigest writeFileAtomically(const std::string& path, const std::function<void(AtomicWriter&)>& fill) {
  namespace fs = std::filesystem;
  if (path.empty()) throw CheckpointError("writing a file: the path is empty");
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw CheckpointError(fmt::format("writing '{}': the path names a folder, not a file", path));
  std::error_code ec;
  if (fs::is_directory(target, ec))
    throw CheckpointError(fmt::format("writing '{}': a folder of that name exists", path));

  static std::atomic<uint64_t> counter{0};
  TempFile tmp;
  tmp.path = (dir / fmt::format(".{}.tmp.{}.{}", name, ::getpid(), counter.fetch_add(1))).string();
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    int err = errno;
    tmp.path.clear();  // not ours to remove
    throw CheckpointError(
        fmt::format("writing '{}': cannot create a temporary file in '{}': {}", path, dir.string(), osError(err)));
  }

  AtomicWriter writer(tmp.fd, path);
  fill(writer);

  if (::fsync(tmp.fd) != 0)
    throw CheckpointError(fmt::format("writing '{}': fsync of the temporary file failed: {}", path, osError(errno)));
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0)
    throw CheckpointError(fmt::format("writing '{}': close of the temporary file failed: {}", path, osError(errno)));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    throw CheckpointError(fmt::format("writing '{}': rename from '{}' failed: {}", path, tmp.path, osError(errno)));
  tmp.keep = true;  // it is `path` now

  // Make the rename itself durable.
  try {
    syncDirectory(dir.string());
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("writing '{}': {}", path, e.what()));
  }
  return {writer.bytesWritten(), writer.hash_.digest()};
}

FileDigest digestFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("'{}': cannot open: {}", path, osError(errno)));
  TempFile closer{fd, "", true};
  Xxh64 hash;
  uint64_t size = 0;
  std::vector<unsigned char> buf(size_t{1} << 20);
  while (true) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("'{}': read failed after {} bytes: {}", path, size, osError(errno)));
    }
    if (r == 0) break;
    hash.update(buf.data(), static_cast<size_t>(r));
    size += static_cast<uint64_t>(r);
  }
  return {size, hash.digest()};
}

void syncDirectory(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw CheckpointError(fmt::format("cannot open folder '{}' to fsync it: {}", dir, osError(errno)));
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL)  // some file systems cannot fsync a folder
    throw CheckpointError(fmt::format("fsync of folder '{}' failed: {}", dir, osError(err)));
}

}  // namespace cohort::io
