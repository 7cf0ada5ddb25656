#include "core/device.h"

#include <cctype>

#include "core/error.h"

namespace mt {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    *this = Device(DeviceType::cpu, 0);
    return;
  }
  if (spec == "cuda") {
    *this = Device(DeviceType::cuda, 0);
    return;
  }
  const std::string prefix = "cuda:";
  bool ok =
      spec.size() > prefix.size() && spec.compare(0, prefix.size(), prefix) == 0 && spec.size() <= prefix.size() + 4;
  for (size_t i = prefix.size(); ok && i < spec.size(); ++i) ok = std::isdigit(static_cast<unsigned char>(spec[i]));
  MT_CHECK_T(DeviceError, ok, "Device: cannot parse '", spec, "'; expected 'cpu', 'cuda' or 'cuda:N'");
  *this = Device(DeviceType::cuda, std::stoi(spec.substr(prefix.size())));
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

}  // namespace mt
