// LoRA: low-rank adapters on Linear layers (Hu et al. 2021), compatible with HF PEFT.
//
//   y = x W^T + b + scale * dropout(x) A^T B^T,   scale = alpha / r  (rsLoRA: alpha / sqrt(r))
//     W [out, in], b [out]   the base layer's tensors, frozen
//     A [r, in]              U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform, a = sqrt(5), as PEFT)
//     B [out, r]             zeros, so a fresh adapter leaves the model's output unchanged
//
// apply_lora() puts a LoRALinear in place of every targeted Linear. The LoRALinear
// takes over the base layer's weight and bias (same storage, same names "weight" and
// "bias"), so the model's state_dict names of base weights do not change, and adds the
// children "lora_A" and "lora_B": the trainable parameters are "<path>.lora_A.weight"
// and "<path>.lora_B.weight", which are PEFT's adapter-file keys once prefixed with
// "base_model.model.". Every other parameter of the model is frozen (PEFT, bias="none").
//
// Targets follow PEFT: with a list, a module is targeted when its dotted path equals a
// name in the list or ends with "." + name; with a regex string, when the whole path
// matches it. Only Linear layers can be targeted.
//
// Note [LoRA merge precision]: merge() computes W + scale * (B A) in f32 (f64 for f64
// weights) and rounds once into W's dtype; unmerge() subtracts the same product. Doing
// the product or the sum in bf16 would round twice and shift the loss (peft issue 1388).
//
// Adapters are saved and loaded as PEFT writes them: <dir>/adapter_config.json and
// <dir>/adapter_model.safetensors. load_adapter() validates both files against the
// model before it changes anything, so a failed load leaves the model as it was.
// LoRAOptions and the adapter_config.json reader live in ops/nn/adapter_config.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/random.h"
#include "ops/matmul/matmul.h"
#include "ops/nn/adapter_config.h"
#include "ops/nn/layers.h"

namespace mt::nn {

class LoRALinear : public Linear {
 public:
  // Takes over base's weight and bias (shared storage, frozen). A and B are made in f32
  // (f64 over an f64 weight), whatever the base's dtype, on its device; A is drawn from `generator` (default: the
  // CPU generator or the device's). `path` names the layer in error messages.
  LoRALinear(const Linear& base, const LoRAOptions& options, std::string path, Generator* generator = nullptr);

  Tensor forward(const Tensor& x) const override;  // [..., in] -> [..., out]
  Tensor forward_unread(const Tensor& x) const override;

  // See Note [LoRA merge precision]. Merging a merged layer, or unmerging an
  // unmerged one, is an error; so is merging into an FP8 base (check_mergeable).
  void merge();
  void unmerge();
  bool merged() const { return merged_; }
  // Throws, naming `who` and the layer, when the base is FP8 (Note [FP8 frozen base],
  // ops/fp8/fp8_rowwise.h): its update would be rounded to FP8 with it, and the model is then no
  // longer the high-precision one its adapter was trained for. Merge a saved adapter into the
  // high-precision base instead (mt_merge).
  void check_mergeable(const char* who) const;

  const LoRAOptions& options() const { return options_; }
  const std::string& path() const { return path_; }
  double scale() const { return scale_; }

  std::shared_ptr<Linear> lora_A;  // weight [r, in], no bias
  std::shared_ptr<Linear> lora_B;  // weight [out, r], no bias

 private:
  Tensor delta() const;  // scale * (B A) [out, in] in the merge dtype, on W's device
  Tensor forward_as(const Tensor& x, OutputValues values) const;

  LoRAOptions options_;
  std::string path_;
  double scale_;
  bool merged_ = false;
};

// Replaces every targeted Linear of `model` by a LoRALinear and freezes every
// parameter except the lora_A / lora_B weights. A Linear with an FP8 weight (quantize_linears_fp8,
// ops/nn/fp8_base.h) keeps it: its LoRALinear runs fp8_lora_linear. Returns the replaced paths in
// traversal order. Errors (the model unchanged): invalid options, no module matching,
// a match that is not a plain Linear, a model that already has LoRA layers.
std::vector<std::string> apply_lora(Module& model, const LoRAOptions& options, Generator* generator = nullptr);

// Every LoRALinear below `model`, with its path, in traversal order.
std::vector<std::pair<std::string, std::shared_ptr<LoRALinear>>> lora_layers(const Module& model);

// Merge or unmerge every LoRALinear of `model`; all must be in the opposite state
// and none over an FP8 base (checked before any is changed), and there must be at least one.
void merge_lora(Module& model);
void unmerge_lora(Module& model);

// PEFT's merge_and_unload: merges every LoRA layer (those not merged yet) and puts a
// plain Linear holding the merged weight and the bias back in its place, so `model` is
// the base architecture again, with the base layers' names and (frozen) state; its
// state_dict then saves and loads like the base model's. An FP8 base is refused before any layer
// changes (LoRALinear::check_mergeable).
void merge_and_unload(Module& model);

// PEFT's print_trainable_parameters line:
//   "trainable params: 294,912 || all params: 124,734,720 || trainable%: 0.2364"
std::string trainable_parameters_summary(const Module& model);

struct AdapterSaveOptions {
  std::string task_type = "CAUSAL_LM";                 // empty: written as null
  bool fan_in_fan_out = false;                         // true for GPT-2's HF Conv1D layers
  std::optional<std::string> base_model_name_or_path;  // null when unset
};

// Writes <dir>/adapter_model.safetensors ("base_model.model.<path>.lora_A.weight" and
// "...lora_B.weight", dtype kept) and <dir>/adapter_config.json, each atomically;
// creates `dir` when missing. The model must have unmerged LoRA layers that all share
// one configuration.
void save_adapter(const Module& model, const std::string& dir, const AdapterSaveOptions& options = {});

// Reads an adapter written by save_adapter() or by PEFT. A model without LoRA gets it
// applied with the file's configuration (A drawn from `generator`, then overwritten);
// a model with LoRA must have the same r, alpha, rsLoRA and targets, and no merged
// layer. Values are converted to each parameter's dtype. Every failure is a FileError
// naming the file and the problem, raised before the model is changed.
void load_adapter(Module& model, const std::string& dir, Generator* generator = nullptr);

}  // namespace mt::nn
