#include <cohort/distributed/store/file_store.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/store/detail/store_util.h>

namespace cohort::dist {
namespace {

using detail::Clock;

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'F', 'S'};
constexpr uint32_t kFormatVersion = 1;
constexpr off_t kHeaderSize = sizeof(kMagic) + sizeof(uint32_t);
constexpr size_t kRecordHeader = 1 + 2 * sizeof(uint32_t);
constexpr char kSet = 'S', kDelete = 'D', kUsers = 'R';

// The sleep between polls: 1 ms doubling to 20 ms, never past the deadline.
class Backoff {
 public:
  // False when the deadline has passed (nothing slept).
  bool sleep(Clock::time_point deadline) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    auto d = std::min<Clock::duration>(step_, deadline - now);
    std::this_thread::sleep_for(d);
    step_ = std::min<Clock::duration>(step_ * 2, std::chrono::milliseconds(20));
    return true;
  }

 private:
  Clock::duration step_ = std::chrono::milliseconds(1);
};

Bytes int64Bytes(int64_t v) {
  Bytes b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

}  // namespace

FileStore::FileStore(std::string path, Millis timeout)
    : Store(timeout), path_(std::move(path)), lockPath_(path_ + ".lock"), pid_(getpid()) {
  if (path_.empty()) throw StoreError("FileStore: the path is empty");
  auto deadline = detail::deadlineAfter(timeout);
  Turn turn = takeTurn(deadline);
  openLockFile(deadline);  // returns holding the lock on the current lock file
  try {
    dataFd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (dataFd_ < 0) throwErrno("cannot open", errno);
    refreshLocked();
    appendLocked(kUsers, "", int64Bytes(1));
  } catch (...) {
    unlockFile();
    if (dataFd_ >= 0) ::close(dataFd_);
    ::close(lockFd_);
    throw;
  }
  unlockFile();
}

FileStore::~FileStore() {
  if (getpid() != pid_) {  // a forked child's copy: the count belongs to the parent
    if (dataFd_ >= 0) ::close(dataFd_);
    if (lockFd_ >= 0) ::close(lockFd_);
    return;
  }
  try {
    Turn turn = takeTurn(detail::deadlineAfter(std::min<Millis>(timeout_, Millis(60'000))));
    // Destructors must not hang: give up after the store's timeout, capped at a minute, and
    // leave the files behind (as after a crash) with a warning.
    lockFile(detail::deadlineAfter(std::min<Millis>(timeout_, Millis(60'000))));
    try {
      refreshLocked();
      appendLocked(kUsers, "", int64Bytes(-1));
      if (users_ <= 0) {
        ::unlink(path_.c_str());
        ::unlink(lockPath_.c_str());
      }
    } catch (...) {
      unlockFile();
      throw;
    }
    unlockFile();
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "{}: could not unregister on close, the files may stay behind: {}", describe(), e.what());
  }
  ::close(dataFd_);
  ::close(lockFd_);
}

void FileStore::throwErrno(const std::string& what, int err) const {
  throw StoreError(fmt::format("{}: {}: {}", describe(), what, std::strerror(err)));
}

void FileStore::checkOwner() const {
  if (getpid() != pid_) {
    throw StoreError(fmt::format("{} was opened by process {} and used in process {} (a forked child?): "
                                 "open a new FileStore in the child",
                                 describe(), pid_, getpid()));
  }
}

FileStore::Turn FileStore::takeTurn(Clock::time_point deadline) {
  auto start = Clock::now();
  std::unique_lock<std::mutex> lock(turnMu_);
  if (!turnCv_.wait_until(lock, deadline, [&] { return !busy_; })) {
    throw TimeoutError(fmt::format("{}: another thread of this process held the store for {} ms, past the deadline",
                                   describe(), std::chrono::duration_cast<Millis>(Clock::now() - start).count()));
  }
  busy_ = true;
  return Turn(this);
}

FileStore::Turn::~Turn() {
  if (!s_) return;
  {
    std::lock_guard<std::mutex> lock(s_->turnMu_);
    s_->busy_ = false;
  }
  s_->turnCv_.notify_one();
}

void FileStore::openLockFile(Clock::time_point deadline) {
  // The last user unlinks the lock file while holding it: whoever opened the old file and then
  // got its lock must notice the path now names another file (or none) and start again.
  Backoff backoff;
  for (;;) {
    lockFd_ = ::open(lockPath_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lockFd_ < 0) throwErrno("cannot open the lock file " + lockPath_, errno);
    try {
      lockFile(deadline);
    } catch (...) {
      ::close(lockFd_);
      lockFd_ = -1;
      throw;
    }
    struct stat held {
    }, named{};
    if (::fstat(lockFd_, &held) == 0 && ::stat(lockPath_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      return;
    }
    unlockFile();
    ::close(lockFd_);
    lockFd_ = -1;
    if (Clock::now() >= deadline) {
      throw TimeoutError(
          fmt::format("{}: the lock file {} kept being replaced; gave up at the deadline", describe(), lockPath_));
    }
    backoff.sleep(deadline);
  }
}

void FileStore::lockFile(Clock::time_point deadline) {
  auto start = Clock::now();
  Backoff backoff;
  for (;;) {
    if (::flock(lockFd_, LOCK_EX | LOCK_NB) == 0) return;
    int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) throwErrno("cannot lock " + lockPath_, err);
    if (!backoff.sleep(deadline)) {
      auto waited = std::chrono::duration_cast<Millis>(Clock::now() - start);
      throw TimeoutError(fmt::format("{}: could not lock {} within {} ms: another process holds it", describe(),
                                     lockPath_, waited.count()));
    }
  }
}

void FileStore::unlockFile() { ::flock(lockFd_, LOCK_UN); }

void FileStore::refreshLocked() {
  struct stat st {};
  if (::fstat(dataFd_, &st) != 0) throwErrno("cannot stat", errno);
  off_t size = st.st_size;
  if (offset_ == 0) {
    if (size < kHeaderSize) {
      // A new file, or one whose creator died while writing the header: (re)write the header,
      // unless the bytes there are someone else's.
      Bytes existing(static_cast<size_t>(size));
      if (size > 0 && ::pread(dataFd_, existing.data(), existing.size(), 0) != size) throwErrno("cannot read", errno);
      if (!std::equal(existing.begin(), existing.end(), kMagic,
                      kMagic + std::min<size_t>(existing.size(), sizeof kMagic)))
        throw StoreError(fmt::format("{}: the file exists and is not a FileStore log", describe()));
      char header[kHeaderSize];
      std::memcpy(header, kMagic, sizeof kMagic);
      std::memcpy(header + sizeof kMagic, &kFormatVersion, sizeof kFormatVersion);
      if (::ftruncate(dataFd_, 0) != 0) throwErrno("cannot truncate", errno);
      if (::pwrite(dataFd_, header, kHeaderSize, 0) != kHeaderSize) throwErrno("cannot write the header", errno);
      offset_ = kHeaderSize;
      return;
    }
    char header[kHeaderSize];
    if (::pread(dataFd_, header, kHeaderSize, 0) != kHeaderSize) throwErrno("cannot read the header", errno);
    uint32_t version;
    std::memcpy(&version, header + sizeof kMagic, sizeof version);
    if (std::memcmp(header, kMagic, sizeof kMagic) != 0)
      throw StoreError(fmt::format("{}: the file exists and is not a FileStore log", describe()));
    if (version != kFormatVersion)
      throw StoreError(fmt::format("{}: the log has format version {}, this build reads version {}", describe(),
                                   version, kFormatVersion));
    offset_ = kHeaderSize;
  }
  if (size <= offset_) return;

  Bytes buf(static_cast<size_t>(size - offset_));
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::pread(dataFd_, buf.data() + got, buf.size() - got, offset_ + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throwErrno("cannot read", errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  while (got - pos >= kRecordHeader) {
    char type = static_cast<char>(buf[pos]);
    uint32_t klen, vlen;
    std::memcpy(&klen, &buf[pos + 1], sizeof klen);
    std::memcpy(&vlen, &buf[pos + 1 + sizeof klen], sizeof vlen);
    if (type != kSet && type != kDelete && type != kUsers)
      throw StoreError(fmt::format("{}: the log is corrupt at offset {} (record type {})", describe(),
                                   offset_ + static_cast<off_t>(pos), static_cast<int>(type)));
    size_t end = pos + kRecordHeader + size_t{klen} + size_t{vlen};
    if (end > got) break;  // a partial record: its writer is still at it (impossible under the lock) or died
    const char* k = reinterpret_cast<const char*>(&buf[pos + kRecordHeader]);
    const uint8_t* v = &buf[pos + kRecordHeader + klen];
    if (type == kSet) {
      data_[std::string(k, klen)] = Bytes(v, v + vlen);
    } else if (type == kDelete) {
      data_.erase(std::string(k, klen));
    } else {
      int64_t delta = 0;
      if (vlen == sizeof delta) std::memcpy(&delta, v, sizeof delta);
      users_ += delta;
    }
    pos = end;
  }
  offset_ += static_cast<off_t>(pos);
}

void FileStore::appendLocked(char type, const std::string& key, const Bytes& value) {
  if (key.size() > UINT32_MAX || value.size() > UINT32_MAX)
    throw ValueError(fmt::format("{}: a key or value over 4 GiB cannot be stored", describe()));
  // Whatever lies past the last complete record is a dead writer's partial record: drop it.
  struct stat st {};
  if (::fstat(dataFd_, &st) != 0) throwErrno("cannot stat", errno);
  if (st.st_size > offset_ && ::ftruncate(dataFd_, offset_) != 0) throwErrno("cannot truncate a partial record", errno);

  Bytes rec(kRecordHeader + key.size() + value.size());
  uint32_t klen = static_cast<uint32_t>(key.size()), vlen = static_cast<uint32_t>(value.size());
  rec[0] = static_cast<uint8_t>(type);
  std::memcpy(&rec[1], &klen, sizeof klen);
  std::memcpy(&rec[1 + sizeof klen], &vlen, sizeof vlen);
  if (!key.empty()) std::memcpy(&rec[kRecordHeader], key.data(), key.size());
  if (!value.empty()) std::memcpy(&rec[kRecordHeader + key.size()], value.data(), value.size());
  size_t put = 0;
  while (put < rec.size()) {
    ssize_t n = ::pwrite(dataFd_, rec.data() + put, rec.size() - put, offset_ + static_cast<off_t>(put));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      if (::ftruncate(dataFd_, offset_) != 0) { /* the next writer truncates it */
      }
      throwErrno("cannot append to the log", err);
    }
    put += static_cast<size_t>(n);
  }
  offset_ += static_cast<off_t>(rec.size());
  if (type == kSet) {
    data_[key] = value;
  } else if (type == kDelete) {
    data_.erase(key);
  } else {
    int64_t delta;
    std::memcpy(&delta, value.data(), sizeof delta);
    users_ += delta;
  }
}

std::vector<std::string> FileStore::missingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing.push_back(k);
  return missing;
}

std::vector<std::string> FileStore::pollUntil(const std::vector<std::string>& keys, Clock::time_point deadline,
                                              Bytes* value) {
  Backoff backoff;
  std::vector<std::string> missing;
  bool first = true;
  for (;;) {
    {
      Turn turn = takeTurn(deadline);
      struct stat st {};
      // Only a grown log can hold news: skip the lock while nothing was appended.
      bool grown = ::fstat(dataFd_, &st) != 0 || st.st_size > offset_;
      if (first || grown) {
        lockFile(deadline);
        try {
          refreshLocked();
        } catch (...) {
          unlockFile();
          throw;
        }
        unlockFile();
      }
      missing = missingLocked(keys);
      if (missing.empty() && value != nullptr) *value = data_.at(keys.front());
    }
    first = false;
    if (missing.empty()) return missing;
    if (!backoff.sleep(deadline)) return missing;
  }
}

template <typename F>
auto FileStore::withLock(F&& f) {
  checkOwner();
  auto deadline = detail::deadlineAfter(timeout_);
  Turn turn = takeTurn(deadline);
  lockFile(deadline);
  struct Unlock {
    FileStore* self;
    ~Unlock() { self->unlockFile(); }
  } unlock{this};
  refreshLocked();
  return f();
}

void FileStore::set(const std::string& key, const Bytes& value) {
  withLock([&] { appendLocked(kSet, key, value); });
}

Bytes FileStore::get(const std::string& key) {
  checkOwner();
  Millis timeout = timeout_;
  Bytes value;
  if (!pollUntil({key}, detail::deadlineAfter(timeout), &value).empty())
    detail::throwGetTimeout(describe(), timeout, key);
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return withLock([&] {
    auto it = data_.find(key);
    int64_t current = it == data_.end() ? 0 : detail::parseStoredInt(it->second, describe() + " key \"" + key + "\"");
    int64_t result = current + delta;
    appendLocked(kSet, key, detail::formatStoredInt(result));
    return result;
  });
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return withLock([&] {
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      appendLocked(kSet, key, desired);
    } else if (it->second == expected) {
      appendLocked(kSet, key, desired);
    } else {
      return it->second;
    }
    return desired;
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return withLock([&] { return missingLocked(keys).empty(); });
}

bool FileStore::deleteKey(const std::string& key) {
  return withLock([&] {
    bool existed = data_.count(key) > 0;
    if (existed) appendLocked(kDelete, key, {});
    return existed;
  });
}

int64_t FileStore::numKeys() {
  return withLock([&] { return static_cast<int64_t>(data_.size()); });
}

int64_t FileStore::numUsers() {
  return withLock([&] { return users_; });
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  checkOwner();
  auto missing = pollUntil(keys, detail::deadlineAfter(timeout));
  if (!missing.empty()) detail::throwWaitTimeout(describe(), timeout, missing, keys.size());
}

}  // namespace cohort::dist
