// Byte-level tokenizer: one token per byte, token id = byte value, vocabulary 256.
//
// No merges and no normalisation, so any string survives a round trip byte for byte:
// decode(encode(s)) == s for all s, including invalid UTF-8 and embedded '\0'. Multi-byte
// UTF-8 characters become several tokens, which is the price of never being lossy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;
  int64_t vocab_size() const { return kVocabSize; }

  // Each byte of `text` becomes one token in [0, 256).
  std::vector<uint16_t> encode(const std::string& text) const;

  // The bytes of `ids`; throws mt::Error naming the first id outside [0, 256) and its position.
  std::string decode(const std::vector<int64_t>& ids) const;
  // ids: [N], an integer dtype (i64, i32 or u8) on any device.
  std::string decode(const Tensor& ids) const;
};

}  // namespace mt::data
