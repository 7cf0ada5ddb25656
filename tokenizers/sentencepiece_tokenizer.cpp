#include "tokenizers/sentencepiece_tokenizer.h"

#include "core/error.h"
#include "tokenizers/utf8.h"

#ifdef MT_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mt::tok {

#ifdef MT_WITH_SENTENCEPIECE
namespace {

std::optional<TokenId> id_or_none(int id) {
  if (id < 0) return std::nullopt;
  return static_cast<TokenId>(id);
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto status = processor_.Load(path);
    if (!status.ok()) detail::fail_file(path, "not a SentencePiece model: ", status.ToString());
    special_.bos = id_or_none(processor_.bos_id());
    special_.eos = id_or_none(processor_.eos_id());
    special_.pad = id_or_none(processor_.pad_id());
    special_.unk = id_or_none(processor_.unk_id());
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int> pieces;
    const auto status = processor_.Encode(replace_invalid_utf8(text), &pieces);
    MT_CHECK(status.ok(), "tokenizer encode (", path_, "): ", status.ToString());
    std::vector<TokenId> ids;
    ids.reserve(pieces.size() + 1);
    if (add_special_tokens && special_.bos) ids.push_back(*special_.bos);
    for (const int id : pieces) ids.push_back(static_cast<TokenId>(id));
    return ids;
  }

  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      MT_CHECK(ids[i] < static_cast<TokenId>(processor_.GetPieceSize()), "tokenizer decode: id ", ids[i],
               " at position ", i, " is not in the vocabulary (", processor_.GetPieceSize(), " ids)");
      pieces.push_back(static_cast<int>(ids[i]));
    }
    std::string text;
    const auto status = processor_.Decode(pieces, &text);
    MT_CHECK(status.ok(), "tokenizer decode (", path_, "): ", status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    const int id = processor_.PieceToId(std::string(token));
    if (id == processor_.unk_id() && processor_.IdToPiece(id) != token) return std::nullopt;
    return static_cast<TokenId>(id);
  }
  std::string id_to_token(TokenId id) const override {
    return id < static_cast<TokenId>(processor_.GetPieceSize()) ? processor_.IdToPiece(static_cast<int>(id)) : "";
  }
  std::string description() const override {
    return "SentencePiece (" + path_ + ", " + std::to_string(processor_.GetPieceSize()) + " ids)";
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

bool have_sentencepiece() { return true; }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

#else

bool have_sentencepiece() { return false; }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  MT_CHECK_T(NotImplementedError, false, path,
             ": this build of mixtrain has no SentencePiece; install libsentencepiece-dev (tools/setup.sh) and "
             "reconfigure, or use the model's tokenizer.json");
}

#endif

}  // namespace mt::tok
