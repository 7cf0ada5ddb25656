// safetensors I/O (https://github.com/huggingface/safetensors), the one file
// format mixtrain reads and writes: checkpoints, LoRA adapters, HF weights.
//
// Layout of a file:
//   [0, 8)          N, the header length: unsigned 64-bit little-endian
//   [8, 8 + N)      JSON object: name -> {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                   plus an optional "__metadata__": {string: string}
//   [8 + N, EOF)    the data section: each tensor's bytes, row-major, little-endian; the offsets are
//                   relative to the start of this section
// dtype names: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 U8 BOOL.
//
// The reader validates everything before it trusts anything (Note [safetensors validation] in
// safetensors.cpp); every failure throws FileError whose message starts with the file's path.
// The writer produces what the reference implementation does (tensors in name order, data
// contiguous in that order, the header padded with spaces to a multiple of 8 bytes) and writes
// atomically: a temporary file in the same directory, flushed, fsynced and renamed over `path`,
// so a crash never leaves a half-written file under that name.
#pragma once

#include <map>
#include <string>

#include "core/device.h"
#include "core/tensor.h"

namespace mt {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // contiguous tensors on the device asked for
  std::map<std::string, std::string> metadata;
};

// Reads and validates `path`; the tensors are created on `device`.
SafetensorsFile load_safetensors(const std::string& path, Device device = kCPU);

struct SafetensorsHeader {
  std::map<std::string, std::pair<DType, Shape>> tensors;  // name -> dtype and shape
  std::map<std::string, std::string> metadata;
};

// `path`'s header alone, validated as load_safetensors validates it; no tensor's bytes are read.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Writes `tensors` (any device, any layout; copied to contiguous host bytes) and `metadata`.
// Atomic: on failure nothing named `path` is created or changed, and no temporary file is left.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace mt
