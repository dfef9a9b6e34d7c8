/*
 * FileStore: a Store shared by the processes of one host through a file path (a shared
 * filesystem that honours flock works too).
 *
 * Layout. `<path>` is an append-only log: a 12-byte header ("COHORTFS" + u32 format version)
 * then records [u8 type][u32 key length][u32 value length][key][value], native byte order:
 * 'S' sets a key, 'D' deletes one, 'R' adds its 8-byte value to the user count. Every operation
 * takes flock(LOCK_EX) on `<path>.lock`, reads the records appended since its last visit (each
 * object caches the replayed map and its file offset), then appends at most one record. flock
 * is per open file, so two FileStore objects in one process exclude each other like two
 * processes do; threads sharing one object are serialised by a mutex as well.
 *
 * Waits (get, wait) poll: a cheap fstat of the log, and the lock only when the log grew, sleeping
 * 1 ms growing to 20 ms between looks, and never past the caller's deadline. Taking the lock
 * also polls (LOCK_NB), so a process stopped while holding it cannot block anyone past a deadline.
 *
 * Cleanup. The log holds a count of open FileStore objects ('R' records): the constructor adds 1,
 * the destructor subtracts 1, and the one that brings it to 0 unlinks `<path>` and `<path>.lock`
 * while still holding the lock. A process that opens the lock file just before it is unlinked
 * notices (the inode at the path changed or vanished) and starts again with fresh files.
 *
 * After a crash. A process killed while it has a FileStore open never subtracts its 1, so the
 * files stay after the others close: a later FileStore at the same path joins that old log and
 * sees its keys. Remove `<path>` and `<path>.lock` (or use a fresh path per job) before reuse.
 * A process killed mid-append leaves a partial record at the end of the log; readers ignore it
 * and the next writer truncates it, so no complete record is lost.
 *
 * Fork. An object belongs to the process that made it (its pid is recorded): a forked child must
 * open its own FileStore; calling the parent's object from the child throws StoreError, and its
 * destructor in the child only closes the descriptors.
 * Any thread may call any method.
 */
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <utility>

#include <cohort/distributed/store/store.h>

namespace cohort::dist {

class FileStore : public Store {
 public:
  // Opens (creating if needed) the store at `path`. Throws StoreError naming the path when the
  // file cannot be created or is not a FileStore log, TimeoutError when the lock stays taken
  // for `timeout`.
  explicit FileStore(std::string path, Millis timeout = kDefaultStoreTimeout);
  ~FileStore() override;

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string describe() const override { return "FileStore(" + path_ + ")"; }

  const std::string& path() const { return path_; }
  // The number of FileStore objects (in any process) that have this path open, as the log says.
  int64_t numUsers();

 private:
  void checkOwner() const;
  // This object's turn: one thread at a time inside the file lock. Taken with a deadline, so a
  // thread queued behind one that waits for the file lock still leaves at its own deadline.
  // (A flag under a mutex rather than std::timed_mutex, whose timed lock ThreadSanitizer does not
  // understand.)
  class Turn {
   public:
    explicit Turn(FileStore* s) : s_(s) {}
    Turn(Turn&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    Turn(const Turn&) = delete;
    ~Turn();

   private:
    FileStore* s_;
  };
  Turn takeTurn(std::chrono::steady_clock::time_point deadline);
  void openLockFile(std::chrono::steady_clock::time_point deadline);
  void lockFile(std::chrono::steady_clock::time_point deadline);
  void unlockFile();
  void refreshLocked();
  void appendLocked(char type, const std::string& key, const Bytes& value);
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const;
  // Blocks until `keys` all exist or the deadline passes; returns the keys still missing. With
  // `value`, copies the first key's value when all were found (read in the same look).
  std::vector<std::string> pollUntil(const std::vector<std::string>& keys,
                                     std::chrono::steady_clock::time_point deadline, Bytes* value = nullptr);
  // Runs f() holding the mutex and the file lock, after replaying the log's new records.
  template <typename F>
  auto withLock(F&& f);
  [[noreturn]] void throwErrno(const std::string& what, int err) const;

  std::string path_;
  std::string lockPath_;
  pid_t pid_;
  std::mutex turnMu_;
  std::condition_variable turnCv_;
  bool busy_ = false;  // a thread has the turn (takeTurn), which guards everything below

  int lockFd_ = -1;
  int dataFd_ = -1;
  off_t offset_ = 0;  // end of the last complete record replayed into data_
  std::map<std::string, Bytes> data_;
  int64_t users_ = 0;
};

}  // namespace cohort::dist
