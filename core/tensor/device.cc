#include <cohort/core/tensor/device.h>

#include <cohort/core/tensor/allocator.h>
#include <cohort/core/util/check.h>

namespace cohort {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t pos = 0;
      int i = std::stoi(s.substr(5), &pos);
      if (pos == s.size() - 5 && i >= 0) return cuda(i);
    } catch (const std::exception&) {
    }
  }
  throw ValueError(fmt::format("'{}' is not a device (expected cpu, cuda or cuda:N)", s));
}

std::string Device::str() const { return isCpu() ? "cpu" : fmt::format("cuda:{}", index_); }

bool cudaAvailable() { return cudaDeviceCount() > 0; }
int cudaDeviceCount() {
  DeviceRuntime* rt = deviceRuntime(DeviceType::CUDA);
  return rt ? rt->deviceCount() : 0;
}

}  // namespace cohort
