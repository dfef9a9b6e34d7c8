#include <cohort/core/tensor/storage.h>

namespace cohort {

Storage::Storage(size_t nbytes, Device device) : device_(device), allocator_(allocatorFor(device)) {
  data_ = allocator_->allocate(nbytes);
  nbytes_ = nbytes;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() { free(); }

void Storage::free() {
  if (allocator_ != nullptr) {
    if (data_ != nullptr || nbytes_ > 0) allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
    deleter_ = nullptr;
  }
  data_ = nullptr;
  nbytes_ = 0;
}

void Storage::release() {
  if (released_) return;
  free();
  released_ = true;
}

void Storage::reallocate(size_t nbytes) {
  free();
  if (allocator_ == nullptr) allocator_ = allocatorFor(device_);  // external memory is replaced by owned memory
  data_ = allocator_->allocate(nbytes);
  nbytes_ = nbytes;
  released_ = false;
}

}  // namespace cohort
