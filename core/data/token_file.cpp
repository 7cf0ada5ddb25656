#include "core/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/atomic_file.h"

// Tokens are read in place from the map as host-order u16 or u32.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files assume a little-endian host");

namespace mt::data {
namespace {

using detail::fail_file;

void put_le(unsigned char* dst, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) dst[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint64_t get_le(const unsigned char* src, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | src[i];
  return value;
}

// Where a validated file keeps what: everything the reader needs besides the map itself.
struct Layout {
  TokenFileFormat format = TokenFileFormat::mttokens_v2;
  uint64_t header_bytes = 0;
  uint64_t count = 0;
  uint64_t vocab_size = 0;
  int bytes_per_token = 2;
  bool has_loss_mask = false;
  bool has_example_starts = false;
  const char* what = "token file";  // the format's name in messages
};

// header + count * (bytes per token + mask byte) in words, since a corrupt count can make it
// overflow 64 bits.
std::string expected_bytes(const Layout& layout) {
  const uint64_t per_token = static_cast<uint64_t>(layout.bytes_per_token) + (layout.has_loss_mask ? 1 : 0);
  if (layout.count > (UINT64_MAX - layout.header_bytes) / per_token) return "more than 2^64";
  return std::to_string(layout.header_bytes + per_token * layout.count);
}

// The file holds exactly the header, the tokens and the mask: nothing missing, nothing after.
// With example starts, it holds at least those and the example count (check_example_starts
// sees to the rest).
void check_size(const std::string& path, const Layout& layout, uint64_t file_bytes) {
  const uint64_t per_token = static_cast<uint64_t>(layout.bytes_per_token) + (layout.has_loss_mask ? 1 : 0);
  const uint64_t data_bytes = file_bytes - layout.header_bytes;
  if (layout.has_example_starts) {
    const bool fits = layout.count <= (data_bytes - std::min<uint64_t>(data_bytes, 8)) / per_token;
    if (data_bytes < 8 || !fits) {
      fail_file(path, layout.what, " size mismatch: the header's count of ", layout.count, " tokens",
                layout.has_loss_mask ? " with a loss mask" : "", " and example starts needs more than ",
                expected_bytes(layout), " bytes but the file has ", file_bytes, " bytes (truncated)");
    }
  } else if (data_bytes % per_token != 0 || data_bytes / per_token != layout.count) {
    const bool truncated = data_bytes / per_token < layout.count;
    fail_file(path, layout.what, " size mismatch: the header's count of ", layout.count, " tokens",
              layout.has_loss_mask ? " with a loss mask" : "", " needs ", expected_bytes(layout),
              " bytes but the file has ", file_bytes, " bytes (", truncated ? "truncated" : "trailing bytes", ")");
  }
  if (layout.count == 0) fail_file(path, layout.what, " holds zero tokens");
}

// The example starts section at `section` (the file's last `section_bytes` bytes): its count,
// then exactly that many starts, 0 first, strictly increasing, each below the token count.
// Returns the count.
int64_t check_example_starts(const std::string& path, const Layout& layout, const unsigned char* section,
                             uint64_t section_bytes, uint64_t file_bytes) {
  const uint64_t count = get_le(section, 8);
  if (count == 0) fail_file(path, "token file example count is 0 (a file with example starts holds at least one)");
  const uint64_t room = (section_bytes - 8) / 8;
  if (count != room || (section_bytes - 8) % 8 != 0) {
    const std::string needed = count > (UINT64_MAX - file_bytes) / 8
                                   ? std::string("more than 2^64")
                                   : std::to_string(file_bytes - section_bytes + 8 + 8 * count);
    fail_file(path, "token file example count of ", count, " needs ", needed, " bytes but the file has ", file_bytes,
              " bytes (", count > room ? "truncated" : "trailing bytes", ")");
  }
  const unsigned char* starts = section + 8;
  const uint64_t first = get_le(starts, 8);
  if (first != 0) fail_file(path, "example start 0 (= ", first, ") is not 0: the first example starts at token 0");
  for (uint64_t e = 1; e < count; ++e) {
    const uint64_t start = get_le(starts + 8 * e, 8), before = get_le(starts + 8 * (e - 1), 8);
    if (start <= before) {
      fail_file(path, "example start ", e, " (= ", start, ") is not greater than the one before (= ", before, ")");
    }
    if (start >= layout.count) {
      fail_file(path, "example start ", e, " (= ", start, ") is not below the token count ", layout.count);
    }
  }
  return static_cast<int64_t>(count);
}

uint64_t checked_expected_vocab(const std::string& path, std::optional<int64_t> expected) {
  MT_CHECK(!expected || (*expected >= 1 && *expected <= kTokenFileMaxVocab), "TokenFile: ", path,
           ": the expected vocab_size ", expected.value_or(0), " is outside [1, ", kTokenFileMaxVocab, "]");
  return static_cast<uint64_t>(expected.value_or(kLlmcShardDefaultVocab));
}

Layout check_llmc_header(const std::string& path, const unsigned char* bytes, uint64_t file_bytes,
                         std::optional<int64_t> expected_vocab) {
  Layout layout;
  layout.format = TokenFileFormat::llmc_shard;
  layout.header_bytes = kLlmcShardHeaderBytes;
  layout.what = "llm.c shard";
  if (file_bytes < kLlmcShardHeaderBytes) {
    fail_file(path, "file is ", file_bytes, " bytes, shorter than the ", kLlmcShardHeaderBytes,
              "-byte header of an llm.c token shard (its first 4 bytes hold llm.c's magic ", kLlmcShardMagic, ")");
  }
  const auto version = static_cast<int32_t>(get_le(bytes + 4, 4));
  const auto count = static_cast<int32_t>(get_le(bytes + 8, 4));
  if (version != 1) {
    fail_file(path, "llm.c shard version ", version, " is not supported (this reader knows version 1, u16 tokens)");
  }
  if (count < 0) fail_file(path, "llm.c shard token count ", count, " is negative");
  layout.count = static_cast<uint64_t>(count);
  layout.vocab_size = checked_expected_vocab(path, expected_vocab);
  return layout;
}

// Version 1 and 2 differ in the bytes per token, the vocabulary range and the flags field.
void check_mttokens_fields(const std::string& path, Layout& layout, uint64_t version, uint64_t token_bytes,
                           uint64_t flags) {
  if (version == 1) {
    layout.format = TokenFileFormat::mttokens_v1;
    if (token_bytes != 2)
      fail_file(path, "token file version 1 has ", token_bytes, " bytes per token; it stores 2 (u16)");
    if (layout.vocab_size < 1 || layout.vocab_size > static_cast<uint64_t>(kTokenFileMaxU16Vocab)) {
      fail_file(path, "token file vocab_size ", layout.vocab_size, " is outside [1, ", kTokenFileMaxU16Vocab,
                "] (version 1 stores u16 tokens)");
    }
    if (flags != 0) fail_file(path, "token file reserved header field is ", flags, ", must be 0");
    return;
  }
  layout.format = TokenFileFormat::mttokens_v2;
  if (layout.vocab_size < 1) fail_file(path, "token file vocab_size 0 is outside [1, ", kTokenFileMaxVocab, "]");
  const int needed = bytes_per_token_for(static_cast<int64_t>(layout.vocab_size));
  if (token_bytes != static_cast<uint64_t>(needed)) {
    fail_file(path, "token file has ", token_bytes, " bytes per token, but its vocab_size ", layout.vocab_size,
              " takes ", needed, " (2 up to 65536, else 4)");
  }
  if ((flags & ~uint64_t{kTokenFileFlagLossMask | kTokenFileFlagExampleStarts}) != 0) {
    fail_file(path, "token file flags 0x", std::hex, flags, std::dec,
              " set unknown bits (only bit 0, has a loss mask, and bit 1, has example starts, are defined)");
  }
  layout.bytes_per_token = needed;
  layout.has_loss_mask = (flags & kTokenFileFlagLossMask) != 0;
  layout.has_example_starts = (flags & kTokenFileFlagExampleStarts) != 0;
}

Layout check_mttokens_header(const std::string& path, const unsigned char* bytes, uint64_t file_bytes,
                             std::optional<int64_t> expected_vocab) {
  if (file_bytes < kTokenFileHeaderBytes) {
    fail_file(path, "file is ", file_bytes, " bytes, shorter than the ", kTokenFileHeaderBytes,
              "-byte token file header");
  }
  if (std::memcmp(bytes, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
    fail_file(path, "not a token file: the first 8 bytes are not the magic \"MTTOKENS\" (nor do the first 4 hold ",
              "llm.c's shard magic ", kLlmcShardMagic, ")");
  }
  const uint64_t version = get_le(bytes + 8, 4);
  if (version != 1 && version != 2) {
    fail_file(path, "token file version ", version, " is not supported (this reader knows versions 1 and 2)");
  }
  Layout layout;
  layout.header_bytes = kTokenFileHeaderBytes;
  layout.vocab_size = get_le(bytes + 16, 4);
  layout.count = get_le(bytes + 24, 8);
  check_mttokens_fields(path, layout, version, /*token_bytes=*/get_le(bytes + 12, 4), /*flags=*/get_le(bytes + 20, 4));
  if (expected_vocab && layout.vocab_size != static_cast<uint64_t>(checked_expected_vocab(path, expected_vocab))) {
    fail_file(path, "token file vocab_size ", layout.vocab_size, " differs from the expected vocab_size ",
              *expected_vocab);
  }
  return layout;
}

// The first token not below vocab_size, or -1.
template <typename Id>
int64_t find_token_outside(const Id* tokens, uint64_t count, uint64_t vocab_size) {
  if (vocab_size > std::numeric_limits<Id>::max()) return -1;  // every Id is below it
  for (uint64_t i = 0; i < count; ++i) {
    if (tokens[i] >= vocab_size) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string vocab_origin(const Layout& layout) {
  return layout.format == TokenFileFormat::llmc_shard ? "the vocab_size given for this llm.c shard"
                                                      : "the file's vocab_size";
}

template <typename Id>
void check_tokens(const std::string& path, const Layout& layout, const Id* tokens) {
  // One linear scan at open (memory bandwidth, well under a second per GB) buys the
  // guarantee that no id read later can index past an embedding table.
  const int64_t bad = find_token_outside(tokens, layout.count, layout.vocab_size);
  if (bad >= 0) {
    fail_file(path, "token ", tokens[bad], " at position ", bad, " is not below ", vocab_origin(layout), " ",
              layout.vocab_size);
  }
}

void check_loss_mask(const std::string& path, const Layout& layout, const uint8_t* mask) {
  const uint8_t* bad = std::find_if(mask, mask + layout.count, [](uint8_t b) { return b > 1; });
  if (bad != mask + layout.count) {
    fail_file(path, "loss mask byte ", static_cast<int>(*bad), " at position ", bad - mask, " is not 0 or 1");
  }
}

// Validates the arguments, then writes the header and the tokens in the file's width, a
// chunk at a time, so neither a narrowing nor a widening copy of the whole corpus is made.
template <typename Id>
void write_tokens(const std::string& path, const Id* tokens, size_t count, int64_t vocab_size, const uint8_t* loss_mask,
                  const uint64_t* example_starts, size_t num_examples) {
  MT_CHECK(vocab_size >= 1 && vocab_size <= kTokenFileMaxVocab, "write_token_file: ", path, ": vocab_size ", vocab_size,
           " is outside [1, ", kTokenFileMaxVocab, "]");
  MT_CHECK(count >= 1, "write_token_file: ", path, ": no tokens to write (a token file holds at least one)");
  for (size_t i = 0; i < count; ++i) {
    MT_CHECK(tokens[i] < static_cast<uint64_t>(vocab_size), "write_token_file: ", path, ": token ", tokens[i],
             " at position ", i, " is not below vocab_size ", vocab_size);
  }
  for (size_t i = 0; loss_mask != nullptr && i < count; ++i) {
    MT_CHECK(loss_mask[i] <= 1, "write_token_file: ", path, ": loss mask byte ", static_cast<int>(loss_mask[i]),
             " at position ", i, " is not 0 or 1");
  }
  if (example_starts != nullptr) {
    MT_CHECK(num_examples >= 1, "write_token_file: ", path, ": example starts given, but none (at least one: 0)");
    MT_CHECK(example_starts[0] == 0, "write_token_file: ", path, ": example start 0 (= ", example_starts[0],
             ") is not 0: the first example starts at token 0");
    for (size_t e = 1; e < num_examples; ++e) {
      MT_CHECK(example_starts[e] > example_starts[e - 1], "write_token_file: ", path, ": example start ", e,
               " (= ", example_starts[e], ") is not greater than the one before (= ", example_starts[e - 1], ")");
      MT_CHECK(example_starts[e] < count, "write_token_file: ", path, ": example start ", e, " (= ", example_starts[e],
               ") is not below the token count ", count);
    }
  } else {
    MT_CHECK(num_examples == 0, "write_token_file: ", path, ": ", num_examples,
             " example starts, but no pointer to them");
  }
  uint32_t flags = 0;
  if (loss_mask != nullptr) flags |= kTokenFileFlagLossMask;
  if (example_starts != nullptr) flags |= kTokenFileFlagExampleStarts;
  const int token_bytes = bytes_per_token_for(vocab_size);
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, sizeof(kTokenFileMagic));
  put_le(header + 8, kTokenFileVersion, 4);
  put_le(header + 12, static_cast<uint64_t>(token_bytes), 4);
  put_le(header + 16, static_cast<uint64_t>(vocab_size), 4);
  put_le(header + 20, flags, 4);
  put_le(header + 24, count, 8);
  write_file_atomically(path, "token file", [&](const ChunkWriter& write) {
    write(header, sizeof(header));
    const auto write_as = [&](auto tag) {
      using Out = decltype(tag);
      if constexpr (std::is_same_v<Out, Id>) {
        write(tokens, count * sizeof(Id));
      } else {
        constexpr size_t kChunk = size_t{1} << 16;
        std::vector<Out> buffer(std::min(count, kChunk));
        for (size_t start = 0; start < count; start += kChunk) {
          const size_t n = std::min(kChunk, count - start);
          std::copy(tokens + start, tokens + start + n, buffer.begin());  // each id fits: checked above
          write(buffer.data(), n * sizeof(Out));
        }
      }
    };
    if (token_bytes == 2) {
      write_as(uint16_t{});
    } else {
      write_as(uint32_t{});
    }
    if (loss_mask != nullptr) write(loss_mask, count);
    if (example_starts != nullptr) {
      std::vector<unsigned char> section(8 * (num_examples + 1));
      put_le(section.data(), num_examples, 8);
      for (size_t e = 0; e < num_examples; ++e) put_le(section.data() + 8 * (e + 1), example_starts[e], 8);
      write(section.data(), section.size());
    }
  });
}

}  // namespace

int bytes_per_token_for(int64_t vocab_size) { return vocab_size <= kTokenFileMaxU16Vocab ? 2 : 4; }

void write_token_file(const std::string& path, const uint32_t* tokens, size_t count, int64_t vocab_size,
                      const uint8_t* loss_mask, const uint64_t* example_starts, size_t num_examples) {
  write_tokens(path, tokens, count, vocab_size, loss_mask, example_starts, num_examples);
}

void write_token_file(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab_size,
                      const uint8_t* loss_mask, const uint64_t* example_starts, size_t num_examples) {
  write_tokens(path, tokens, count, vocab_size, loss_mask, example_starts, num_examples);
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size) {
  write_tokens(path, tokens.data(), tokens.size(), vocab_size, /*loss_mask=*/nullptr, /*example_starts=*/nullptr,
               /*num_examples=*/0);
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, int64_t vocab_size) {
  write_tokens(path, tokens.data(), tokens.size(), vocab_size, /*loss_mask=*/nullptr, /*example_starts=*/nullptr,
               /*num_examples=*/0);
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const std::vector<uint8_t>& loss_mask, int64_t vocab_size) {
  MT_CHECK(loss_mask.size() == tokens.size(), "write_token_file: ", path, ": the loss mask has ", loss_mask.size(),
           " bytes for ", tokens.size(), " tokens");
  write_tokens(path, tokens.data(), tokens.size(), vocab_size, loss_mask.data(), /*example_starts=*/nullptr,
               /*num_examples=*/0);
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const std::vector<uint8_t>& loss_mask, const std::vector<uint64_t>& example_starts,
                      int64_t vocab_size) {
  MT_CHECK(loss_mask.empty() || loss_mask.size() == tokens.size(), "write_token_file: ", path, ": the loss mask has ",
           loss_mask.size(), " bytes for ", tokens.size(), " tokens");
  MT_CHECK(!example_starts.empty(), "write_token_file: ", path, ": example starts given, but none (at least one: 0)");
  write_tokens(path, tokens.data(), tokens.size(), vocab_size, loss_mask.empty() ? nullptr : loss_mask.data(),
               example_starts.data(), example_starts.size());
}

TokenFile::TokenFile(const std::string& path, std::optional<int64_t> expected_vocab_size) : path_(path) {
  map_file();
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    const bool llmc = map_bytes_ >= 4 && static_cast<int32_t>(get_le(bytes, 4)) == kLlmcShardMagic;
    const Layout layout = llmc ? check_llmc_header(path, bytes, map_bytes_, expected_vocab_size)
                               : check_mttokens_header(path, bytes, map_bytes_, expected_vocab_size);
    check_size(path, layout, map_bytes_);
    // Both headers are a multiple of 4 bytes and the map is page-aligned, so the tokens are aligned.
    const unsigned char* data = bytes + layout.header_bytes;
    if (layout.bytes_per_token == 2) {
      u16_ = reinterpret_cast<const uint16_t*>(data);
      check_tokens(path, layout, u16_);
    } else {
      u32_ = reinterpret_cast<const uint32_t*>(data);
      check_tokens(path, layout, u32_);
    }
    const unsigned char* after_tokens = data + layout.count * static_cast<uint64_t>(layout.bytes_per_token);
    if (layout.has_loss_mask) {
      mask_ = after_tokens;
      check_loss_mask(path, layout, mask_);
    }
    if (layout.has_example_starts) {
      const unsigned char* section = after_tokens + (layout.has_loss_mask ? layout.count : 0);
      const uint64_t section_bytes = map_bytes_ - static_cast<uint64_t>(section - bytes);
      num_examples_ = check_example_starts(path, layout, section, section_bytes, map_bytes_);
      starts_ = section + 8;
    }
    format_ = layout.format;
    count_ = static_cast<int64_t>(layout.count);
    vocab_size_ = static_cast<int64_t>(layout.vocab_size);
    bytes_per_token_ = layout.bytes_per_token;
  } catch (...) {
    release();
    throw;
  }
}

// Opens, checks it is a non-empty regular file, and maps the whole of it.
void TokenFile::map_file() {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_file(path_, "cannot open token file: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail_file(path_, "cannot stat token file: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_file(path_, "cannot open token file: not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes == 0) {  // nothing to map; no format's header fits
    ::close(fd);
    fail_file(path_, "file is 0 bytes, shorter than the ", kTokenFileHeaderBytes, "-byte token file header");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail_file(path_, "cannot mmap token file (", file_bytes, " bytes): ", std::strerror(err));
  map_ = map;
  map_bytes_ = file_bytes;
}

void TokenFile::copy_tokens(int64_t start, int64_t n, int64_t* out) const {
  MT_CHECK(start >= 0 && n >= 0 && start <= count_ - n, "TokenFile: ", path_, ": tokens [", start, ", ", start + n,
           ") are outside [0, ", count_, ")");
  if (u16_ != nullptr) {
    std::copy(u16_ + start, u16_ + start + n, out);
  } else if (u32_ != nullptr) {
    std::copy(u32_ + start, u32_ + start + n, out);
  }
}

int64_t TokenFile::example_start(int64_t e) const {
  MT_CHECK(e >= 0 && e < num_examples_, "TokenFile: ", path_, ": example ", e, " is out of range [0, ", num_examples_,
           ")");
  return static_cast<int64_t>(get_le(starts_ + 8 * e, 8));
}

int64_t TokenFile::example_end(int64_t e) const {
  MT_CHECK(e >= 0 && e < num_examples_, "TokenFile: ", path_, ": example ", e, " is out of range [0, ", num_examples_,
           ")");
  return e + 1 < num_examples_ ? static_cast<int64_t>(get_le(starts_ + 8 * (e + 1), 8)) : count_;
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    format_ = other.format_;
    u16_ = std::exchange(other.u16_, nullptr);
    u32_ = std::exchange(other.u32_, nullptr);
    mask_ = std::exchange(other.mask_, nullptr);
    starts_ = std::exchange(other.starts_, nullptr);
    num_examples_ = std::exchange(other.num_examples_, 0);
    count_ = std::exchange(other.count_, 0);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
    bytes_per_token_ = std::exchange(other.bytes_per_token_, 0);
  }
  return *this;
}

void TokenFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  u16_ = nullptr;
  u32_ = nullptr;
  mask_ = nullptr;
  starts_ = nullptr;
  num_examples_ = 0;
  count_ = 0;
  vocab_size_ = 0;
  bytes_per_token_ = 0;
}

}  // namespace mt::data
