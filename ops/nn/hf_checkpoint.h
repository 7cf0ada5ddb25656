// The weights of a Hugging Face model directory, whole or sharded, for every model type:
//
//   model.safetensors                         one file
//   model.safetensors.index.json              {"metadata": {...}, "weight_map": {tensor: shard file}}
//   model-00001-of-00003.safetensors, ...     the shards it names (in the same directory)
//
// Everything is checked before use: the index's JSON, every shard it names present (plain file
// names only, nothing outside the directory), every tensor it maps found in its shard, no tensor
// in two shards. Errors are FileErrors naming the index or the shard.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace mt::nn {

class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& dir);
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }  // HF names, on the CPU
  DType dtype() const { return dtype_; }                                     // the floating dtype of the weights
  const std::string& description() const { return description_; }            // the file, or the index, for messages

 private:
  std::map<std::string, Tensor> tensors_;
  DType dtype_ = DType::f32;
  std::string description_;
};

// HfCheckpoint(dir).dtype() from the headers alone (of model.safetensors, or of the shards the
// index names): no weight is read. Throws as HfCheckpoint does for a directory without either.
DType hf_checkpoint_dtype(const std::string& dir);

// Writes `state` (HF names) as dir/model.safetensors, or, when larger than max_shard_bytes, as
// shards and their index (each file atomic). Tensors are placed in name order. An FP8 tensor (a
// frozen base from quantize_linears_fp8) is refused before anything is written: a Hugging Face
// checkpoint holds the high-precision weights, which such a model no longer has (the directory may
// already exist; no file is written).
void save_hf_checkpoint(const std::string& dir, const std::map<std::string, Tensor>& state, int64_t max_shard_bytes);

}  // namespace mt::nn
