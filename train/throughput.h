// Model FLOPs utilisation (MFU): the FLOPs a step must do by the model's arithmetic, divided by
// the step time and by the device's peak dense tensor-core rate. It ignores recomputation
// (gradient checkpointing) on purpose, so it compares runs of the same model fairly.
#pragma once

#include <cstdint>
#include <optional>

#include "core/device.h"
#include "core/dtype.h"

namespace mt::train {

// Training FLOPs per token of a decoder-only transformer: 6 N for the matrix products of forward
// and backward over N parameters (embeddings included, as nanoGPT and llm.c count), plus
// 12 L C T for attention's two batched products over a context of T tokens.
double transformer_flops_per_token(int64_t parameters, int64_t layers, int64_t width, int64_t context);

// The device's peak dense FLOP/s in `dtype` (bf16/f16 on tensor cores; f32 without autocast), from
// a table of data-centre and workstation GPUs by name; empty when the GPU is not in the table or
// the device is a CPU. Then pass the figure yourself (TrainerOptions::peak_flops).
std::optional<double> device_peak_flops(const Device& device, std::optional<DType> dtype);

}  // namespace mt::train
