// core/cuda/cuda.h in a build without CUDA: nothing is available, and what needs a device says why.
#include <cohort/core/cuda/cuda.h>
#include <cohort/core/util/check.h>

namespace cohort::cuda {
namespace {
[[noreturn]] void unavailable(const char* what) {
  throw NotSupportedError(fmt::format("{}: this build of cohort has no CUDA support (configure with the CUDA "
                                      "toolkit installed, or -DCOHORT_USE_CUDA=ON to require it)",
                                      what));
}
}  // namespace

bool isAvailable() { return false; }
int deviceCount() { return 0; }
int currentDevice() { unavailable("currentDevice"); }
void setDevice(int) { unavailable("setDevice"); }
void synchronize(int) { unavailable("synchronize"); }
bool Stream::query() const { unavailable("Stream::query"); }
void Stream::synchronize() const { unavailable("Stream::synchronize"); }
std::string Stream::str() const { return fmt::format("cuda:{} stream {}", device_, handle_); }
Stream defaultStream(int) { unavailable("defaultStream"); }
Stream currentStream(int) { unavailable("currentStream"); }
void setCurrentStream(const Stream&) { unavailable("setCurrentStream"); }
Stream streamFromPool(int, bool) { unavailable("streamFromPool"); }
StreamGuard::StreamGuard(const Stream&) : prevDevice_(0) { unavailable("StreamGuard"); }
StreamGuard::~StreamGuard() = default;
DeviceGuard::DeviceGuard(int) : prev_(0) { unavailable("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
Event::Event(bool timing) : timing_(timing) {}
Event::~Event() = default;
Event::Event(Event&& o) noexcept : timing_(o.timing_), device_(o.device_), handle_(o.handle_) {}
Event& Event::operator=(Event&& o) noexcept {
  timing_ = o.timing_;
  return *this;
}
void Event::record() { unavailable("Event::record"); }
void Event::record(const Stream&) { unavailable("Event::record"); }
void Event::block(const Stream&) const { unavailable("Event::block"); }
bool Event::query() const { return true; }
void Event::synchronize() const {}
float Event::elapsedMs(const Event&) const { unavailable("Event::elapsedMs"); }
void recordStream(const Tensor&, const Stream&) { unavailable("recordStream"); }
CachingAllocatorStats allocatorStats(int) { unavailable("allocatorStats"); }
Tensor pinnedEmpty(const Shape&, DType) { unavailable("pinnedEmpty"); }
bool isPinned(const Tensor&) { return false; }
Tensor copyTo(const Tensor& t, Device device, bool) { return t.to(device); }
void setAllowTf32(bool) {}
bool allowTf32() { return false; }

}  // namespace cohort::cuda
