#include "core/data/byte_tokenizer.h"

#include "core/error.h"

namespace mt::data {

std::vector<uint16_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);  // not sign-extended
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] < kVocabSize, "ByteTokenizer::decode: id ", ids[i], " at position ", i,
             " is outside the vocabulary [0, ", kVocabSize, ")");
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

std::string ByteTokenizer::decode(const Tensor& ids) const {
  MT_CHECK(ids.defined(), "ByteTokenizer::decode: the ids tensor is undefined");
  MT_CHECK_T(DTypeError, ids.dtype() == DType::i64 || ids.dtype() == DType::i32 || ids.dtype() == DType::u8,
             "ByteTokenizer::decode: ids must be i64, i32 or u8, got ", dtype_name(ids.dtype()));
  MT_CHECK_T(ShapeError, ids.dim() == 1, "ByteTokenizer::decode: ids must be 1-D [N], got shape ",
             shape_str(ids.shape()));
  return decode(ids.to_vector<int64_t>());
}

}  // namespace mt::data
