// Where a tensor lives: the CPU or one CUDA device ("cpu", "cuda:0").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mt {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cuda", "cuda:1". Throws DeviceError for anything else.
  explicit Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT: allows t.to("cuda:0")

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;

  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

inline constexpr Device kCPU{DeviceType::cpu, 0};
inline Device cuda_device(int index = 0) { return Device(DeviceType::cuda, index); }

}  // namespace mt
