/*
 * Where a tensor's storage lives. Device::cpu() always exists; Device::cuda(i) is a valid value
 * in every build, and asking for storage on it in a build without CUDA throws NotSupportedError.
 */
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace cohort {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(const std::string& s);

  constexpr DeviceType type() const { return type_; }
  constexpr int index() const { return index_; }
  constexpr bool isCpu() const { return type_ == DeviceType::CPU; }
  constexpr bool isCuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const;

  constexpr bool operator==(const Device& o) const = default;

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

// Whether this build has CUDA and how many devices the runtime sees (0 without CUDA).
bool cudaAvailable();
int cudaDeviceCount();

}  // namespace cohort

template <>
struct fmt::formatter<cohort::Device> : fmt::formatter<std::string_view> {
  auto format(const cohort::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
