// Token files: a tokenized corpus on disk, read through a read-only memory map.
//
// Two formats are read, told apart by their first bytes. All integers are little-endian.
//
// MTTOKENS, version 2 (what the writer produces):
//   [0, 8)     magic "MTTOKENS"
//   [8, 12)    u32 version = 2
//   [12, 16)   u32 bytes per token P: 2 (u16) when vocab_size <= 65536, else 4 (u32); no other
//              value is valid, so every vocabulary has exactly one encoding
//   [16, 20)   u32 vocab_size, in [1, 2^32 - 1]
//   [20, 24)   u32 flags: bit 0 = has a loss mask, bit 1 = has example starts; the other bits are 0
//   [24, 32)   u64 token count N >= 1
//   [32, 32 + P*N)                 N tokens, each < vocab_size
//   [32 + P*N, 32 + P*N + N)       with the loss mask only: N bytes, each 0 or 1; byte i is 1
//                                  when token i is a training target (0: a prompt token of
//                                  fine-tuning data, seen as input but never predicted)
//   then, with example starts only (fine-tuning data of separate examples), at the next byte
//   (so not necessarily 8-byte aligned):
//              u64 example count E >= 1
//              E u64 starts: starts[0] = 0, strictly increasing, each < N. Example e is tokens
//              [starts[e], starts[e + 1]), the last one [starts[E - 1], N). A reader that packs
//              several examples into one row (core/data/packed_batcher.h) keeps them apart.
//   nothing after that.
// MTTOKENS, version 1 (older files, still read): the same header with version 1, P = 2,
// vocab_size in [1, 65536], the flags field reserved and 0, and no loss mask.
//
// llm.c token shards (the .bin files of llm.c's data scripts):
//   [0, 1024)  256 i32: [0] = magic 20240520, [1] = version 1, [2] = token count N >= 1;
//              the other 253 are unused (llm.c writes zeros and reads none of them)
//   [1024, 1024 + 2N)  N u16 tokens; nothing after them.
// Such a shard does not record its vocabulary: the reader takes it from the caller (the
// expected vocab_size argument), else 65536, and checks every token against it.
//
// The writer is atomic (core/atomic_file.h). The reader checks all of the above, every token
// and mask byte included, before the file can be used, so a corrupt file fails at open with a
// FileError whose message starts with the path, never later as an out-of-range embedding id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::data {

constexpr char kTokenFileMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kTokenFileVersion = 2;  // what the writer produces
constexpr uint64_t kTokenFileHeaderBytes = 32;
constexpr int64_t kTokenFileMaxU16Vocab = 65536;           // every id fits in a u16: 2 bytes per token
constexpr int64_t kTokenFileMaxVocab = 4294967295;         // the largest vocab_size a u32 header field holds
constexpr uint32_t kTokenFileFlagLossMask = 1u << 0;       // the flags bit of a file with a loss mask
constexpr uint32_t kTokenFileFlagExampleStarts = 1u << 1;  // the flags bit of a file with example starts
constexpr int32_t kLlmcShardMagic = 20240520;
constexpr uint64_t kLlmcShardHeaderBytes = 256 * 4;
constexpr int64_t kLlmcShardDefaultVocab = 65536;  // what a u16 token can hold

enum class TokenFileFormat { mttokens_v1, mttokens_v2, llmc_shard };

// The bytes per token a version 2 file uses for this vocabulary: 2 up to 65536, else 4.
int bytes_per_token_for(int64_t vocab_size);

// Writes `count` tokens (count >= 1, each < vocab_size, vocab_size in [1, 2^32 - 1]) to `path`
// as a version 2 file, with 2 or 4 bytes per token as the vocabulary needs. `loss_mask`, when
// given, holds `count` bytes, each 0 or 1 (1: the token is a training target).
// `example_starts`, when given, holds `num_examples` >= 1 token offsets: 0 first, strictly
// increasing, each < count (the first token of each fine-tuning example).
// Atomic: on failure `path` is unchanged and no temporary file is left; throws FileError naming
// the path (Error for invalid arguments, raised before the filesystem is touched).
void write_token_file(const std::string& path, const uint32_t* tokens, size_t count, int64_t vocab_size,
                      const uint8_t* loss_mask = nullptr, const uint64_t* example_starts = nullptr,
                      size_t num_examples = 0);
void write_token_file(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab_size,
                      const uint8_t* loss_mask = nullptr, const uint64_t* example_starts = nullptr,
                      size_t num_examples = 0);
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size);
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, int64_t vocab_size);
// With a loss mask of tokens.size() bytes.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const std::vector<uint8_t>& loss_mask, int64_t vocab_size);
// With example starts, and a loss mask of tokens.size() bytes or none (an empty loss_mask).
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const std::vector<uint8_t>& loss_mask, const std::vector<uint64_t>& example_starts,
                      int64_t vocab_size);

// A validated token file of any format above, mapped read-only (MAP_PRIVATE) for as long as
// the object lives. Movable, not copyable; a moved-from TokenFile is empty (size() == 0).
class TokenFile {
 public:
  // expected_vocab_size: the vocabulary of an llm.c shard (which does not record one; default
  // 65536). An MTTOKENS file records its own, which must then equal it.
  explicit TokenFile(const std::string& path, std::optional<int64_t> expected_vocab_size = std::nullopt);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;

  const std::string& path() const { return path_; }
  TokenFileFormat format() const { return format_; }
  int64_t size() const { return count_; }  // number of tokens
  int64_t vocab_size() const { return vocab_size_; }
  int bytes_per_token() const { return bytes_per_token_; }  // 2 or 4 (0 when empty)

  // Token i, unchecked: i in [0, size()). operator[] is the checked path.
  uint32_t token(int64_t i) const { return bytes_per_token_ == 2 ? u16_[i] : u32_[i]; }
  uint32_t operator[](int64_t i) const {
    MT_CHECK(i >= 0 && i < count_, "TokenFile: ", path_, ": index ", i, " is out of range [0, ", count_, ")");
    return token(i);
  }
  // The tokens in the file's own width: [size()] when bytes_per_token() is 2 (resp. 4), else null.
  const uint16_t* u16_tokens() const { return u16_; }
  const uint32_t* u32_tokens() const { return u32_; }
  // Copies tokens [start, start + n) into out[0, n) (checked).
  void copy_tokens(int64_t start, int64_t n, int64_t* out) const;

  bool has_loss_mask() const { return mask_ != nullptr; }
  const uint8_t* loss_mask() const { return mask_; }  // [size()] of 0/1, or null without a mask

  // Example boundaries (fine-tuning data): num_examples() is 0 for a file without them. Example
  // e spans tokens [example_start(e), example_end(e)); checked, e in [0, num_examples()).
  bool has_example_starts() const { return num_examples_ > 0; }
  int64_t num_examples() const { return num_examples_; }
  int64_t example_start(int64_t e) const;
  int64_t example_end(int64_t e) const;  // the next example's start, or size() for the last

 private:
  void map_file();
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  TokenFileFormat format_ = TokenFileFormat::mttokens_v2;
  const uint16_t* u16_ = nullptr;          // into the map, when 2 bytes per token
  const uint32_t* u32_ = nullptr;          // into the map, when 4 bytes per token
  const uint8_t* mask_ = nullptr;          // into the map, after the tokens
  const unsigned char* starts_ = nullptr;  // into the map: [num_examples_] little-endian u64, unaligned
  int64_t num_examples_ = 0;
  int64_t count_ = 0;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
};

}  // namespace mt::data
