// The SentencePiece library behind a C interface, built as its own module (libmt_sentencepiece)
// that sentencepiece_tokenizer.cpp loads with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a separate module: Debian's libsentencepiece carries its own copy of protobuf-lite and
// exports its symbols. Linked into a process that also uses the system's protobuf (TensorBoard
// event files, train/tensorboard.h), one copy's symbols would serve the other's code and crash
// it. Loaded locally with deep binding, SentencePiece keeps its protobuf to itself.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void set_error(const std::string& message, char* error, size_t size) {
  if (size == 0) return;
  std::strncpy(error, message.c_str(), size - 1);
  error[size - 1] = '\0';
}

char* copy_out(const std::string& text, size_t* length) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
  *length = text.size();
  return out;
}

}  // namespace

extern "C" {

void* mt_spm_load(const char* path, char* error, size_t error_size) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    set_error(status.ToString(), error, error_size);
    delete processor;
    return nullptr;
  }
  return processor;
}

void mt_spm_free(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

// ids: malloc'ed, freed by the caller with free(). Returns 0 on success.
int mt_spm_encode(void* handle, const char* text, size_t length, int** ids, size_t* count, char* error,
                  size_t error_size) {
  std::vector<int> pieces;
  const auto status =
      static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string(text, length), &pieces);
  if (!status.ok()) {
    set_error(status.ToString(), error, error_size);
    return 1;
  }
  *ids = static_cast<int*>(std::malloc(pieces.size() * sizeof(int) + 1));
  if (*ids == nullptr) return 1;
  std::memcpy(*ids, pieces.data(), pieces.size() * sizeof(int));
  *count = pieces.size();
  return 0;
}

// text: malloc'ed, freed by the caller with free(). Returns 0 on success.
int mt_spm_decode(void* handle, const int* ids, size_t count, char** text, size_t* length, char* error,
                  size_t error_size) {
  std::string decoded;
  const auto status =
      static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Decode(std::vector<int>(ids, ids + count), &decoded);
  if (!status.ok()) {
    set_error(status.ToString(), error, error_size);
    return 1;
  }
  *text = copy_out(decoded, length);
  return *text == nullptr;
}

// which: 0 pieces, 1 bos, 2 eos, 3 pad, 4 unk.
int mt_spm_number(void* handle, int which) {
  const auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  switch (which) {
    case 0:
      return p->GetPieceSize();
    case 1:
      return p->bos_id();
    case 2:
      return p->eos_id();
    case 3:
      return p->pad_id();
    default:
      return p->unk_id();
  }
}

int mt_spm_piece_to_id(void* handle, const char* piece, size_t length) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->PieceToId(std::string(piece, length));
}

char* mt_spm_id_to_piece(void* handle, int id, size_t* length) {
  return copy_out(static_cast<sentencepiece::SentencePieceProcessor*>(handle)->IdToPiece(id), length);
}

}  // extern "C"
