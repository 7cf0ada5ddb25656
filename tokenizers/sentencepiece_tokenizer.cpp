#include "tokenizers/sentencepiece_tokenizer.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

// The functions of libmt_sentencepiece (sentencepiece_shim.cpp, which says why it is a module).
struct Shim {
  void* (*load)(const char*, char*, size_t) = nullptr;
  void (*free_processor)(void*) = nullptr;
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t) = nullptr;
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t) = nullptr;
  int (*number)(void*, int) = nullptr;
  int (*piece_to_id)(void*, const char*, size_t) = nullptr;
  char* (*id_to_piece)(void*, int, size_t*) = nullptr;
  std::string missing;  // why it could not be loaded; empty when it was
};

// Beside this library (build tree and install tree alike), found through this function's address.
std::string shim_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&shim_path), &info) == 0 || info.dli_fname == nullptr)
    return "libmt_sentencepiece.so";
  return (std::filesystem::path(info.dli_fname).parent_path() / "libmt_sentencepiece.so").string();
}

template <typename F>
void bind(void* library, const char* name, F& slot, std::string& missing) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (slot == nullptr && missing.empty()) missing = std::string("the module lacks ") + name;
}

const Shim& shim() {
  static const Shim loaded = [] {
    Shim s;
#ifndef MT_WITH_SENTENCEPIECE
    s.missing =
        "this build of mixtrain has no SentencePiece; install libsentencepiece-dev (tools/setup.sh) and "
        "reconfigure, or use the model's tokenizer.json";
    return s;
#else
    const std::string path = shim_path();
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (library == nullptr) {
      const char* why = dlerror();
      s.missing = "cannot load " + path + " (" + (why ? why : "unknown error") + "), which holds SentencePiece";
      return s;
    }
    bind(library, "mt_spm_load", s.load, s.missing);
    bind(library, "mt_spm_free", s.free_processor, s.missing);
    bind(library, "mt_spm_encode", s.encode, s.missing);
    bind(library, "mt_spm_decode", s.decode, s.missing);
    bind(library, "mt_spm_number", s.number, s.missing);
    bind(library, "mt_spm_piece_to_id", s.piece_to_id, s.missing);
    bind(library, "mt_spm_id_to_piece", s.id_to_piece, s.missing);
    return s;
#endif
  }();
  return loaded;
}

std::optional<TokenId> id_or_none(int id) {
  if (id < 0) return std::nullopt;
  return static_cast<TokenId>(id);
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path), s_(shim()) {
    if (!s_.missing.empty()) MT_CHECK_T(NotImplementedError, false, path, ": ", s_.missing);
    char error[512] = "";
    handle_ = s_.load(path.c_str(), error, sizeof error);
    if (handle_ == nullptr) detail::fail_file(path, "not a SentencePiece model: ", error);
    special_.bos = id_or_none(s_.number(handle_, 1));
    special_.eos = id_or_none(s_.number(handle_, 2));
    special_.pad = id_or_none(s_.number(handle_, 3));
    special_.unk = id_or_none(s_.number(handle_, 4));
  }
  ~SentencePieceTokenizer() override { s_.free_processor(handle_); }

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const override {
    const std::string clean = replace_invalid_utf8(text);
    int* pieces = nullptr;
    size_t count = 0;
    char error[512] = "";
    const int rc = s_.encode(handle_, clean.data(), clean.size(), &pieces, &count, error, sizeof error);
    MT_CHECK(rc == 0, "tokenizer encode (", path_, "): ", error);
    std::vector<TokenId> ids;
    ids.reserve(count + 1);
    if (add_special_tokens && special_.bos) ids.push_back(*special_.bos);
    for (size_t i = 0; i < count; ++i) ids.push_back(static_cast<TokenId>(pieces[i]));
    std::free(pieces);
    return ids;
  }

  // SentencePiece writes no text for control tokens (bos, eos), so skip_special_tokens changes nothing.
  std::string decode(const std::vector<TokenId>& ids, bool) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      MT_CHECK(ids[i] < static_cast<TokenId>(vocab_size()), "tokenizer decode: id ", ids[i], " at position ", i,
               " is not in the vocabulary (", vocab_size(), " ids)");
      pieces.push_back(static_cast<int>(ids[i]));
    }
    char* text = nullptr;
    size_t length = 0;
    char error[512] = "";
    const int rc = s_.decode(handle_, pieces.data(), pieces.size(), &text, &length, error, sizeof error);
    MT_CHECK(rc == 0, "tokenizer decode (", path_, "): ", error);
    std::string out(text, length);
    std::free(text);
    return out;
  }

  int64_t vocab_size() const override { return s_.number(handle_, 0); }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    const int id = s_.piece_to_id(handle_, token.data(), token.size());
    if (id < 0 || (special_.unk && static_cast<TokenId>(id) == *special_.unk && id_to_token(*special_.unk) != token)) {
      return std::nullopt;
    }
    return static_cast<TokenId>(id);
  }
  std::string id_to_token(TokenId id) const override {
    if (id >= static_cast<TokenId>(vocab_size())) return "";
    size_t length = 0;
    char* piece = s_.id_to_piece(handle_, static_cast<int>(id), &length);
    std::string out(piece, length);
    std::free(piece);
    return out;
  }
  std::string description() const override {
    return "SentencePiece (" + path_ + ", " + std::to_string(vocab_size()) + " ids)";
  }

 private:
  std::string path_;
  const Shim& s_;
  void* handle_ = nullptr;
};

}  // namespace

bool have_sentencepiece() { return shim().missing.empty(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace mt::tok
