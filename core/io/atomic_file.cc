#include <cohort/core/io/atomic_file.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::io {
namespace {

std::string osError(int err) { return std::strerror(err); }

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

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(
          fmt::format("writing '{}': write failed after {} bytes: {}", path_, written_, osError(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void writeFileAtomically(const std::string& path, const std::function<void(AtomicWriter&)>& fill) {
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
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    throw CheckpointError(
        fmt::format("writing '{}': cannot open folder '{}' to fsync it: {}", path, dir.string(), osError(errno)));
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL)  // some file systems cannot fsync a folder
    throw CheckpointError(
        fmt::format("writing '{}': fsync of folder '{}' failed: {}", path, dir.string(), osError(err)));
}

}  // namespace cohort::io
