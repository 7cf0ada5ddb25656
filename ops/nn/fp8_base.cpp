#include "ops/nn/fp8_base.h"

#include <cstdio>
#include <set>
#include <string>

#include "autograd/grad_mode.h"
#include "ops/nn/layers.h"
#include "ops/nn/lora.h"

namespace mt::nn {

std::vector<std::string> quantize_linears_fp8(Module& model, std::optional<Device> device) {
  NoGradGuard no_grad;
  const auto modules = model.named_modules();
  std::set<const Module*> factors;  // the adapters' own Linears, which train
  for (const auto& [path, m] : modules) {
    if (const auto* layer = dynamic_cast<const LoRALinear*>(m.get())) {
      factors.insert(layer->lora_A.get());
      factors.insert(layer->lora_B.get());
    }
  }
  // A merged adapter lives inside its base weight: quantizing it would fix the sum in FP8 and leave
  // the layer unable to unmerge. Refused before any layer changes.
  for (const auto& [path, m] : modules) {
    const auto* layer = dynamic_cast<const LoRALinear*>(m.get());
    MT_CHECK(layer == nullptr || !layer->merged(), "quantize_linears_fp8: '", path,
             "' has its adapter merged into the base weight; unmerge it first (unmerge_lora), or quantize the base "
             "before merging; no layer was changed");
  }
  std::vector<std::string> quantized;
  for (const auto& [path, m] : modules) {
    auto* linear = dynamic_cast<Linear*>(m.get());
    if (linear == nullptr || linear->fp8_excluded || factors.count(linear) || linear->has_fp8_weight()) continue;
    const Shape& shape = linear->weight.shape();
    if (shape[0] % 16 != 0 || shape[1] % 16 != 0) {
      std::fprintf(stderr,
                   "mixtrain: warning: quantize_linears_fp8: '%s' %s stays %s: FP8 GEMMs need out and in features "
                   "that are multiples of 16\n",
                   path.c_str(), shape_str(shape).c_str(), dtype_name(linear->weight.dtype()));
      continue;
    }
    if (device) linear->to(*device);  // the layer's own tensors (and its adapters'), one layer at a time
    linear->quantize_weight_fp8();
    quantized.push_back(path);
  }
  if (device) model.to(*device);
  return quantized;
}

int64_t weight_bytes(const Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, t] : model.named_parameters()) bytes += static_cast<int64_t>(t.nbytes());
  for (const auto& [name, t] : model.named_buffers()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

}  // namespace mt::nn
