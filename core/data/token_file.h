// Token files: a tokenized corpus on disk, read through a read-only memory map.
//
// Layout (little-endian):
//   [0, 8)     magic "MTTOKENS"
//   [8, 12)    u32 version = 1
//   [12, 16)   u32 bytes per token = 2
//   [16, 20)   u32 vocab_size, in [1, 65536]
//   [20, 24)   u32 reserved, 0
//   [24, 32)   u64 token count N >= 1
//   [32, 32 + 2N)  N u16 tokens, each < vocab_size; nothing after them
// The writer is atomic (core/atomic_file.h). The reader checks all of the above, every
// token included, before the file can be used, so a corrupt file fails at open with a
// FileError whose message starts with the path, never later as an out-of-range embedding id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::data {

constexpr char kTokenFileMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kTokenFileVersion = 1;
constexpr uint64_t kTokenFileHeaderBytes = 32;
constexpr int64_t kTokenFileMaxVocab = 65536;  // every id must fit in a u16

// Writes `count` tokens (count >= 1, each < vocab_size, vocab_size in [1, 65536]) to `path`.
// Atomic: on failure `path` is unchanged and no temporary file is left; throws FileError naming
// the path (Error for invalid arguments, raised before the filesystem is touched).
void write_token_file(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab_size);
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, int64_t vocab_size);

// A validated token file, mapped read-only (MAP_PRIVATE) for as long as the object lives.
// Movable, not copyable; a moved-from TokenFile is empty (size() == 0, data() == nullptr).
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  int64_t vocab_size() const { return vocab_size_; }
  const uint16_t* data() const { return tokens_; }  // [size()]
  uint16_t operator[](int64_t i) const {            // checked; data() is the unchecked path
    MT_CHECK(i >= 0 && i < count_, "TokenFile: ", path_, ": index ", i, " is out of range [0, ", count_, ")");
    return tokens_[i];
  }

 private:
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;  // map_ + kTokenFileHeaderBytes
  int64_t count_ = 0;
  int64_t vocab_size_ = 0;
};

}  // namespace mt::data
