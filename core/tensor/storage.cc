#include <cohort/core/tensor/storage.h>

#include <cohort/core/profiler/record.h>

namespace cohort {

Storage::Storage(size_t nbytes, Device device) : device_(device), allocator_(allocatorFor(device)) {
  acquire(nbytes, currentMemoryCategory());
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() { free(); }

void Storage::acquire(size_t nbytes, MemoryCategory c) {
  data_ = allocator_->allocate(nbytes);
  nbytes_ = nbytes;
  category_ = c;
  detail::accountCategory(device_.type(), category_, static_cast<int64_t>(nbytes));
  if (profiler::detail::memoryActive()) [[unlikely]]
    profiler::detail::onMemory(data_, static_cast<int64_t>(nbytes), device_, category_);
}

void Storage::free() {
  if (allocator_ != nullptr) {
    if (data_ != nullptr || nbytes_ > 0) {
      allocator_->deallocate(data_, nbytes_);
      detail::accountCategory(device_.type(), category_, -static_cast<int64_t>(nbytes_));
      if (profiler::detail::memoryActive()) [[unlikely]]
        profiler::detail::onMemory(data_, -static_cast<int64_t>(nbytes_), device_, category_);
    }
  } else if (deleter_) {
    deleter_(data_);
    deleter_ = nullptr;
  }
  data_ = nullptr;
  nbytes_ = 0;
}

void Storage::setCategory(MemoryCategory c) {
  if (c == category_) return;
  if (allocator_ != nullptr && nbytes_ > 0) {
    detail::accountCategory(device_.type(), category_, -static_cast<int64_t>(nbytes_));
    detail::accountCategory(device_.type(), c, static_cast<int64_t>(nbytes_));
    if (profiler::detail::memoryActive()) [[unlikely]]
      profiler::detail::onRecategorize(data_, static_cast<int64_t>(nbytes_), device_, category_, c);
  }
  category_ = c;
}

void Storage::release() {
  if (released_) return;
  free();
  released_ = true;
}

void Storage::reallocate(size_t nbytes) {
  free();
  if (allocator_ == nullptr) allocator_ = allocatorFor(device_);  // external memory is replaced by owned memory
  acquire(nbytes, category_);                                     // a re-gathered buffer keeps what it was for
  released_ = false;
}

}  // namespace cohort
