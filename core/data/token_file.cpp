#include "core/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/atomic_file.h"

// Tokens are read in place from the map as host-order u16.
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

// 32 + 2 * count in words, since a corrupt count can make it overflow 64 bits.
std::string expected_bytes(uint64_t count) {
  if (count > (UINT64_MAX - kTokenFileHeaderBytes) / 2) return "more than 2^64";
  return std::to_string(kTokenFileHeaderBytes + 2 * count);
}

// Everything in the header and the size; returns (count, vocab_size).
std::pair<uint64_t, uint32_t> check_header(const std::string& path, const unsigned char* bytes, uint64_t file_bytes) {
  if (std::memcmp(bytes, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
    fail_file(path, "not a token file: the first 8 bytes are not the magic \"MTTOKENS\"");
  }
  const uint64_t version = get_le(bytes + 8, 4);
  const uint64_t token_bytes = get_le(bytes + 12, 4);
  const uint64_t vocab_size = get_le(bytes + 16, 4);
  const uint64_t reserved = get_le(bytes + 20, 4);
  const uint64_t count = get_le(bytes + 24, 8);
  if (version != kTokenFileVersion) {
    fail_file(path, "token file version ", version, " is not supported (this reader knows version ", kTokenFileVersion,
              ")");
  }
  if (token_bytes != 2) fail_file(path, "token file has ", token_bytes, " bytes per token; only 2 (u16) is supported");
  if (vocab_size < 1 || vocab_size > static_cast<uint64_t>(kTokenFileMaxVocab)) {
    fail_file(path, "token file vocab_size ", vocab_size, " is outside [1, ", kTokenFileMaxVocab, "]");
  }
  if (reserved != 0) fail_file(path, "token file reserved header field is ", reserved, ", must be 0");
  const uint64_t data_bytes = file_bytes - kTokenFileHeaderBytes;
  if (data_bytes % 2 != 0 || data_bytes / 2 != count) {
    const bool truncated = data_bytes / 2 < count;
    fail_file(path, "token file size mismatch: the header's count of ", count, " tokens needs ", expected_bytes(count),
              " bytes but the file has ", file_bytes, " bytes (", truncated ? "truncated" : "trailing bytes", ")");
  }
  if (count == 0) fail_file(path, "token file holds zero tokens");
  return {count, static_cast<uint32_t>(vocab_size)};
}

}  // namespace

void write_token_file(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab_size) {
  MT_CHECK(vocab_size >= 1 && vocab_size <= kTokenFileMaxVocab, "write_token_file: ", path, ": vocab_size ", vocab_size,
           " is outside [1, ", kTokenFileMaxVocab, "]");
  MT_CHECK(count >= 1, "write_token_file: ", path, ": no tokens to write (a token file holds at least one)");
  for (size_t i = 0; i < count; ++i) {
    MT_CHECK(tokens[i] < vocab_size, "write_token_file: ", path, ": token ", tokens[i], " at position ", i,
             " is not below vocab_size ", vocab_size);
  }
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, sizeof(kTokenFileMagic));
  put_le(header + 8, kTokenFileVersion, 4);
  put_le(header + 12, /*bytes per token=*/2, 4);
  put_le(header + 16, static_cast<uint64_t>(vocab_size), 4);
  put_le(header + 24, count, 8);  // [20, 24) stays 0 (reserved)
  write_file_atomically(path, "token file", [&](const ChunkWriter& write) {
    write(header, sizeof(header));
    write(tokens, count * sizeof(uint16_t));
  });
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, int64_t vocab_size) {
  write_token_file(path, tokens.data(), tokens.size(), vocab_size);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_file(path, "cannot open token file: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail_file(path, "cannot stat token file: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_file(path, "cannot open token file: not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    fail_file(path, "file is ", file_bytes, " bytes, shorter than the ", kTokenFileHeaderBytes,
              "-byte token file header");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail_file(path, "cannot mmap token file (", file_bytes, " bytes): ", std::strerror(err));
  map_ = map;
  map_bytes_ = file_bytes;
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    const auto [count, vocab_size] = check_header(path, bytes, file_bytes);
    // The header is 32 bytes and the map page-aligned, so the u16 tokens are aligned.
    tokens_ = reinterpret_cast<const uint16_t*>(bytes + kTokenFileHeaderBytes);
    // One linear scan at open (memory bandwidth, well under a second per GB) buys the
    // guarantee that no id read later can index past an embedding table.
    for (uint64_t i = 0; i < count; ++i) {
      if (tokens_[i] >= vocab_size) {
        fail_file(path, "token ", tokens_[i], " at position ", i, " is not below the file's vocab_size ", vocab_size);
      }
    }
    count_ = static_cast<int64_t>(count);
    vocab_size_ = vocab_size;
  } catch (...) {
    release();
    throw;
  }
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
  }
  return *this;
}

void TokenFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
  vocab_size_ = 0;
}

}  // namespace mt::data
