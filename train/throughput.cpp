#include "train/throughput.h"

#include <string>

#include "core/cuda_context.h"

namespace mt::train {

double transformer_flops_per_token(int64_t parameters, int64_t layers, int64_t width, int64_t context) {
  return 6.0 * static_cast<double>(parameters) +
         12.0 * static_cast<double>(layers) * static_cast<double>(width) * static_cast<double>(context);
}

std::optional<double> device_peak_flops(const Device& device, std::optional<DType> dtype) {
  if (!device.is_cuda()) return std::nullopt;
  // Dense (no sparsity) figures from the vendors' data sheets, in TFLOP/s: 16-bit tensor cores
  // with f32 accumulation, and f32 (TF32 is not used for f32 GEMMs here).
  struct Peak {
    const char* name;
    double half, single;
  };
  static const Peak kPeaks[] = {
      {"H200", 989.4, 66.9},    {"H100 PCIe", 756.5, 51.2}, {"H100", 989.4, 66.9},         {"GH200", 989.4, 66.9},
      {"A100", 312.0, 19.5},    {"A10G", 70.0, 31.2},       {"A10", 125.0, 31.2},          {"L40S", 362.1, 91.6},
      {"L40", 181.0, 90.5},     {"L4", 121.0, 30.3},        {"RTX 6000 Ada", 364.2, 91.1}, {"RTX 4090", 165.2, 82.6},
      {"RTX 3090", 71.0, 35.6}, {"A6000", 154.8, 38.7},
  };
  const std::string name = cuda::device_name(device.index);
  for (const Peak& peak : kPeaks) {
    if (name.find(peak.name) != std::string::npos) {
      const bool half = dtype == DType::bf16 || dtype == DType::f16;
      return (half ? peak.half : peak.single) * 1e12;
    }
  }
  return std::nullopt;
}

}  // namespace mt::train
