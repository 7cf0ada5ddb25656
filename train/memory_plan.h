// Planned peak device memory of a Llama-family training step, and the gradient-checkpointing
// mode that fits a budget: what --dry-run prints and --max-memory picks, from config.json alone
// (nothing is allocated).
//
// The estimate adds, in bytes:
//   weights      every parameter in its dtype (an FP8 base: the projections 1 byte, a scale per
//                output channel; embeddings, head and norms bf16)
//   trainable    per trained parameter: the f32 value, its gradient, AdamW's two moments, and the
//                bf16 copy autocast reads (18 bytes)
//   activations  what backward keeps per layer and token: a layer run as it is keeps its inputs to
//                each op that needs one (Note [Activation bytes of a Llama layer]), under
//                checkpointing but the norm and SwiGLU outputs it rebuilds; a recomputed layer
//                keeps its f32 input alone
//   transient    the larger of the LM head's chunk of logits (at the end of forward) and the
//                gradients in flight in one layer's backward (a recomputed layer's rebuilt
//                activations take the place of those the layers after it have freed)
//   reserve      cuBLASLt and cuDNN workspaces and the allocator's rounding
// It is an estimate: tools/bench/llama_step prints it beside the peak the allocator measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/nn/llama_config.h"

namespace mt::train {

struct TrainingShape {
  int64_t batch = 1;  // sequences per micro-batch
  int64_t seq_len = 2048;
  int64_t lora_r = 0;  // 0: full training (f32 weights under bf16 autocast)
  std::vector<std::string> lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::string base_dtype = "bf16";  // with LoRA: f32, bf16 or fp8
};

struct MemoryEstimate {
  std::string checkpointing;  // "off", "layers:N", "blocks:K" or "blocks"
  int64_t recomputed_layers = 0;
  int64_t weights = 0, trainable = 0, activations = 0, transient = 0, reserve = 0;
  int64_t peak() const { return weights + trainable + activations + transient + reserve; }
  std::string summary() const;  // "20.31 GiB: weights 14.96, trainable 0.70, ..."
};

MemoryEstimate estimate_training_memory(const nn::LlamaConfig& config, const TrainingShape& shape,
                                        const std::string& checkpointing);

// The mode with the fewest recomputed layers whose estimate fits `budget_bytes`: off, layers:N
// (N layers spread evenly) or blocks (all but the last). Throws, with the smallest estimate's
// parts, when not even recomputing every layer fits.
MemoryEstimate plan_checkpointing(const nn::LlamaConfig& config, const TrainingShape& shape, int64_t budget_bytes);

// "22GiB", "22 GiB", "21.5G" (binary units), "24GB" (decimal), "512MiB": bytes; anything else is
// an error naming the text.
int64_t parse_memory_size(const std::string& text);

}  // namespace mt::train
