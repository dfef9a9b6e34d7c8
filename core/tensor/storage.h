/*
 * Storage: a reference-counted block of device memory that tensors view. Views share one
 * Storage through shared_ptr. A storage can be released (FSDP frees a unit's full parameters
 * between uses) or given new memory (FSDP re-gathers them): tensors that view it stay valid
 * objects, and touching the data of a released storage is a clear error, never a dangling read.
 */
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include <cohort/core/tensor/allocator.h>

namespace cohort {

class Storage {
 public:
  // Allocates nbytes on `device` (uninitialised).
  Storage(size_t nbytes, Device device);
  // Wraps memory the caller owns; `deleter` (may be empty) runs when the storage lets it go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool released() const { return released_; }
  // Why this storage may be released and what to use instead: appended to the error a tensor
  // raises when its data is touched while released (FSDP names the unit and SummonFullParams).
  const std::string& releasedNote() const { return releasedNote_; }
  void setReleasedNote(std::string note) { releasedNote_ = std::move(note); }

  // What the memory is for (allocator.h); changing it moves the bytes between categories.
  MemoryCategory category() const { return category_; }
  void setCategory(MemoryCategory c);

  // Frees the memory; views stay valid objects but their data may not be touched until
  // reallocate(). Idempotent.
  void release();
  // Gives the storage fresh (uninitialised) memory of nbytes.
  void reallocate(size_t nbytes);

 private:
  void free();
  void acquire(size_t nbytes, MemoryCategory c);  // allocates, counts and reports to the profiler

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;      // null when wrapping external memory
  std::function<void(void*)> deleter_;  // for external memory
  bool released_ = false;
  MemoryCategory category_ = MemoryCategory::Other;
  std::string releasedNote_;
};

}  // namespace cohort
