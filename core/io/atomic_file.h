/*
 * Crash-safe file replacement. writeFileAtomically(path, fill) creates a temporary file in the
 * same folder, lets `fill` write it through an AtomicWriter, fsyncs it, renames it over `path`
 * and fsyncs the folder. Whatever happens before the rename (fill throws, the disk fills up,
 * the process dies) the previous file at `path` is untouched; after the rename the new one is
 * durable. A failed write removes its temporary file. Errors are CheckpointError naming the
 * path, the step and the OS reason. Called on any one thread; concurrent writers to one path
 * each get their own temporary file and the last rename wins.
 *
 * Every write also returns the file's digest (its size and XXH64 checksum, computed from the
 * bytes as they were written, so it costs no second read); digestFile computes the same for a
 * file on disk. Checkpoints made of several files (fsdp/training_checkpoint.h) record each
 * part's digest in a manifest and check it before they load the part.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cohort::io {

// XXH64 (the xxHash 64-bit algorithm, seed 0), fed in pieces of any size.
class Xxh64 {
 public:
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t v_[4] = {0x60ea27eeadc0b5d6ull, 0xc2b2ae3d27d4eb4full, 0, 0x61c8864e7a143579ull};  // seed 0
  unsigned char buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

struct FileDigest {
  uint64_t size = 0;      // bytes
  uint64_t checksum = 0;  // XXH64 of those bytes
  bool operator==(const FileDigest&) const = default;
};
// The checksum as 16 lower-case hex digits (how manifests write it).
std::string checksumHex(uint64_t checksum);

class AtomicWriter {
 public:
  // Appends bytes; CheckpointError naming the final path on failure (ENOSPC, EIO, ...).
  void write(const void* data, size_t n);
  uint64_t bytesWritten() const { return written_; }
  const std::string& path() const { return path_; }  // the final path

 private:
  friend FileDigest writeFileAtomically(const std::string&, const std::function<void(AtomicWriter&)>&);
  AtomicWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  uint64_t written_ = 0;
  Xxh64 hash_;
};

// Returns the digest of the bytes written.
FileDigest writeFileAtomically(const std::string& path, const std::function<void(AtomicWriter&)>& fill);

// Reads the file through; CheckpointError naming it when it cannot be read.
FileDigest digestFile(const std::string& path);

// fsyncs a folder, so that entries created or renamed in it are durable (file systems that cannot
// fsync a folder are accepted). CheckpointError naming it on failure.
void syncDirectory(const std::string& dir);

}  // namespace cohort::io
