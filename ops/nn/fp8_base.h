// The FP8 frozen base of a LoRA model (Note [FP8 frozen base], ops/fp8/fp8_rowwise.h): every frozen
// Linear's weight stored once in E4M3 with a scale per output channel, read by FP8 GEMMs in forward
// and for the input gradient; the adapters stay f32.
//
//   auto model = nn::load_causal_lm(dir);    // bf16 on the CPU, as the checkpoint
//   nn::quantize_linears_fp8(*model, gpu);   // layer by layer onto the GPU, in FP8
//   nn::apply_lora(*model, options);         // before or after: the base keeps its FP8
//
// Saving: an adapter saves as ever (save_adapter holds only A and B). A model's state_dict holds each
// FP8 weight as "<layer>.weight" (f8e4m3) beside "<layer>.weight_scale_inv" (f32 [out]), and loads
// back only into a model quantized the same way (Module::load_state_dict refuses to convert between
// FP8 and other dtypes); a Hugging Face checkpoint (save_pretrained) is refused, as is merging an
// adapter into the FP8 base (LoRALinear::check_mergeable): both want the high-precision weights.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/nn/module.h"

namespace mt::nn {

// Stores the weight of every Linear of `model` in FP8 (Linear::quantize_weight_fp8, which freezes
// it), except layers marked fp8_excluded (LM heads), LoRA's own factors (lora_A, lora_B) and layers
// already in FP8. A layer whose sides are not multiples of 16 keeps its weight, and a warning on
// stderr names it. With `device`, each layer moves there before its cast and the whole model after
// the last one: a checkpoint loaded on the CPU reaches the GPU in FP8, with at most one layer's
// high-precision weight there at a time. Returns the quantized layers' paths, in traversal order.
std::vector<std::string> quantize_linears_fp8(Module& model, std::optional<Device> device = std::nullopt);

// The bytes of model's parameters and buffers: what holding the base in FP8 halves.
int64_t weight_bytes(const Module& model);

}  // namespace mt::nn
