#pragma once
#include <cstdint>
#include <string>

namespace strata {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int idx = 0) { return {DeviceType::CUDA, static_cast<int16_t>(idx)}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// Parses "cpu", "cuda", "cuda:1"; throws UserError otherwise.
Device parse_device(const std::string& s);

}  // namespace strata
