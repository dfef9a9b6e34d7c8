/*
 * Crash-safe file replacement. writeFileAtomically(path, fill) creates a temporary file in the
 * same folder, lets `fill` write it through an AtomicWriter, fsyncs it, renames it over `path`
 * and fsyncs the folder. Whatever happens before the rename (fill throws, the disk fills up,
 * the process dies) the previous file at `path` is untouched; after the rename the new one is
 * durable. A failed write removes its temporary file. Errors are CheckpointError naming the
 * path, the step and the OS reason. Called on any one thread; concurrent writers to one path
 * each get their own temporary file and the last rename wins.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cohort::io {

class AtomicWriter {
 public:
  // Appends bytes; CheckpointError naming the final path on failure (ENOSPC, EIO, ...).
  void write(const void* data, size_t n);
  uint64_t bytesWritten() const { return written_; }
  const std::string& path() const { return path_; }  // the final path

 private:
  friend void writeFileAtomically(const std::string&, const std::function<void(AtomicWriter&)>&);
  AtomicWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  uint64_t written_ = 0;
};

void writeFileAtomically(const std::string& path, const std::function<void(AtomicWriter&)>& fill);

}  // namespace cohort::io
