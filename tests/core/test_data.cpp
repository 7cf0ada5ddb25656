// Contracts of core/data: the byte tokenizer's lossless round trip, the token file
// formats (version 2 written atomically, byte for byte as documented, with u16 or u32 ids
// and the loss mask; version 1 and llm.c shards read; one test per malformed file the
// reader must refuse, each checking the path and the problem in the message), and the
// batcher's windows, epoch coverage, seeded order, rank split and exact resume on one file.
// Corpora of several shards: test_token_corpus.cpp.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/data/byte_tokenizer.h"
#include "core/data/token_dataset.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using mt::data::Batch;
using mt::data::BatcherOptions;
using mt::data::BatcherState;
using mt::data::ByteTokenizer;
using mt::data::TokenBatcher;
using mt::data::TokenFile;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---------------------------------------------------------------- tokenizer

TEST(TokenDataTokenizer, RoundTripsEveryByteValue) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  const std::vector<uint16_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  EXPECT_EQ(tok.decode(std::vector<int64_t>(ids.begin(), ids.end())), all);
}

TEST(TokenDataTokenizer, RoundTripsUtf8InvalidUtf8AndNul) {
  const ByteTokenizer tok;
  const std::string utf8 = "h\xC3\xA9llo \xE2\x82\xAC";  // "héllo €": é is 2 bytes, € is 3
  const std::string invalid("\xFF\xC3\x00\x80z", 5);     // lone lead/continuation bytes, NUL
  EXPECT_EQ(tok.encode(utf8), (std::vector<uint16_t>{'h', 0xC3, 0xA9, 'l', 'l', 'o', ' ', 0xE2, 0x82, 0xAC}));
  for (const std::string& s : {utf8, invalid, std::string()}) {
    const std::vector<uint16_t> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(std::vector<int64_t>(ids.begin(), ids.end())), s);
  }
}

TEST(TokenDataTokenizer, DecodesIntegerTensors) {
  const ByteTokenizer tok;
  const std::vector<double> ids = {104, 105, 0, 255};
  const std::string expected("hi\0\xFF", 4);
  for (mt::DType dtype : {mt::DType::i64, mt::DType::i32, mt::DType::u8}) {
    EXPECT_EQ(tok.decode(mt::from_vector(ids, {4}, dtype)), expected) << mt::dtype_name(dtype);
  }
}

TEST(TokenDataTokenizer, DecodeRejectsIdsOutsideTheVocabularyNamingIdAndPosition) {
  const ByteTokenizer tok;
  const std::string high = error_message_of([&] { tok.decode(std::vector<int64_t>{72, 105, 256, 1}); });
  EXPECT_TRUE(contains(high, "id 256 at position 2")) << high;
  EXPECT_TRUE(contains(high, "[0, 256)")) << high;
  const std::string negative = error_message_of([&] { tok.decode(std::vector<int64_t>{-1}); });
  EXPECT_TRUE(contains(negative, "id -1 at position 0")) << negative;
  const std::string tensor = error_message_of([&] { tok.decode(mt::from_vector({1, 2, 300}, {3}, mt::DType::i64)); });
  EXPECT_TRUE(contains(tensor, "id 300 at position 2")) << tensor;
}

TEST(TokenDataTokenizer, DecodeRejectsNonIntegerAndNon1DTensors) {
  const ByteTokenizer tok;
  const std::string floats = error_message_of([&] { tok.decode(mt::from_vector({1, 2}, {2})); });
  EXPECT_TRUE(contains(floats, "ids must be i64, i32 or u8, got f32")) << floats;
  const std::string matrix = error_message_of([&] { tok.decode(mt::zeros({2, 2}, mt::DType::i64)); });
  EXPECT_TRUE(contains(matrix, "must be 1-D [N], got shape [2, 2]")) << matrix;
  const std::string undefined = error_message_of([&] { tok.decode(mt::Tensor()); });
  EXPECT_TRUE(contains(undefined, "undefined")) << undefined;
}

// ---------------------------------------------------------------- token files

std::string le(uint64_t value, int bytes) {
  std::string s(static_cast<size_t>(bytes), '\0');
  for (int i = 0; i < bytes; ++i) s[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
  return s;
}

// A file as the format describes it, each field settable to a wrong value; version 1 unless
// told otherwise. Tokens take 4 bytes when token_bytes says 4, else 2; the mask bytes follow.
struct RawFile {
  std::string magic = "MTTOKENS";
  uint64_t version = 1, token_bytes = 2, vocab = 256, reserved = 0;  // reserved: version 2's flags
  std::vector<uint32_t> tokens = {1, 2, 3};
  uint64_t count = 3;
  std::string mask;
  std::string bytes() const {
    std::string s = magic + le(version, 4) + le(token_bytes, 4) + le(vocab, 4) + le(reserved, 4) + le(count, 8);
    for (uint32_t t : tokens) s += le(t, token_bytes == 4 ? 4 : 2);
    return s + mask;
  }
};

// A version 2 file: 2 bytes per token up to a vocabulary of 65536, else 4; flags 1 with a mask.
RawFile v2_file(std::vector<uint32_t> tokens, uint64_t vocab, std::string mask = {}) {
  RawFile raw;
  raw.version = 2;
  raw.token_bytes = vocab > 65536 ? 4 : 2;
  raw.vocab = vocab;
  raw.reserved = mask.empty() ? 0 : 1;
  raw.count = tokens.size();
  raw.tokens = std::move(tokens);
  raw.mask = std::move(mask);
  return raw;
}

// An llm.c shard: 256 i32 of header (magic, version, count, zeros), then u16 tokens.
struct RawShard {
  int64_t magic = 20240520, version = 1;
  std::vector<uint16_t> tokens = {5, 6, 7, 8};
  int64_t count = 4;
  std::string bytes() const {
    std::string s = le(static_cast<uint32_t>(magic), 4) + le(static_cast<uint32_t>(version), 4) +
                    le(static_cast<uint32_t>(count), 4) + std::string(253 * 4, '\0');
    for (uint16_t t : tokens) s += le(t, 2);
    return s;
  }
};

class TokenDataFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "mt_token_data_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    path_ = dir_ + "/corpus.tok";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The message of opening a file holding `raw`; it must start with the path.
  std::string open_error(const RawFile& raw) { return open_error(raw.bytes()); }
  std::string open_error(const RawShard& raw, std::optional<int64_t> vocab = std::nullopt) {
    return open_error(raw.bytes(), vocab);
  }
  std::string open_error(const std::string& bytes, std::optional<int64_t> vocab = std::nullopt) {
    write_bytes(path_, bytes);
    try {
      TokenFile file(path_, vocab);
    } catch (const mt::FileError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path_ + ": ", 0), 0u) << message;
      return message;
    }
    return "(no error)";
  }

  std::string dir_, path_;
};

TEST_F(TokenDataFile, RoundTripWritesTheDocumentedBytesAndReadsThemBack) {
  const std::vector<uint16_t> tokens = {0, 7, 65535, 258, 1};
  mt::data::write_token_file(path_, tokens, /*vocab_size=*/65536);
  RawFile expected;
  expected.version = 2;
  expected.vocab = 65536;
  expected.tokens.assign(tokens.begin(), tokens.end());
  expected.count = tokens.size();
  EXPECT_EQ(read_bytes(path_), expected.bytes());

  const TokenFile file(path_);
  EXPECT_EQ(file.path(), path_);
  EXPECT_EQ(file.size(), 5);
  EXPECT_EQ(file.vocab_size(), 65536);
  EXPECT_EQ(file.format(), mt::data::TokenFileFormat::mttokens_v2);
  EXPECT_EQ(file.bytes_per_token(), 2);
  EXPECT_FALSE(file.has_loss_mask());
  EXPECT_EQ(file.loss_mask(), nullptr);
  EXPECT_EQ(file.u32_tokens(), nullptr);
  EXPECT_EQ(std::vector<uint16_t>(file.u16_tokens(), file.u16_tokens() + file.size()), tokens);
  for (int64_t i = 0; i < file.size(); ++i) EXPECT_EQ(file[i], tokens[static_cast<size_t>(i)]);
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"corpus.tok"});  // no temporary left
}

TEST_F(TokenDataFile, TokenizedTextRoundTripsThroughAFile) {
  const char raw[] = "any bytes \xFF\x00 at all";
  const std::string text(raw, sizeof(raw) - 1);  // the NUL inside included
  const ByteTokenizer tok;
  mt::data::write_token_file(path_, tok.encode(text), tok.vocab_size());
  const TokenFile file(path_);
  EXPECT_EQ(file.vocab_size(), 256);
  std::vector<int64_t> ids(static_cast<size_t>(file.size()));
  file.copy_tokens(0, file.size(), ids.data());
  EXPECT_EQ(tok.decode(ids), text);
}

TEST_F(TokenDataFile, MoveTransfersTheMappingAndEmptiesTheSource) {
  mt::data::write_token_file(path_, std::vector<uint16_t>{4, 5, 6}, 10);
  TokenFile a(path_);
  const uint16_t* data = a.u16_tokens();
  TokenFile b(std::move(a));
  EXPECT_EQ(b.u16_tokens(), data);
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(b[2], 6);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state is part of the contract
  EXPECT_EQ(a.u16_tokens(), nullptr);
  EXPECT_EQ(a.bytes_per_token(), 0);
  mt::data::write_token_file(dir_ + "/other.tok", std::vector<uint16_t>{9}, 10);
  TokenFile c(dir_ + "/other.tok");
  c = std::move(b);
  EXPECT_EQ(c.u16_tokens(), data);
  EXPECT_EQ(c.path(), path_);
  EXPECT_EQ(c[0], 4);
}

TEST_F(TokenDataFile, IndexOutsideTheFileThrows) {
  mt::data::write_token_file(path_, std::vector<uint16_t>{4, 5, 6}, 10);
  const TokenFile file(path_);
  const std::string message = error_message_of([&] { (void)file[3]; });
  EXPECT_TRUE(contains(message, path_ + ": index 3 is out of range [0, 3)")) << message;
  const std::string negative = error_message_of([&] { (void)file[-1]; });
  EXPECT_TRUE(contains(negative, "index -1 is out of range")) << negative;
}

TEST_F(TokenDataFile, RejectsAMissingFile) {
  const std::string message = error_message_of([&] { TokenFile file(dir_ + "/absent.tok"); });
  EXPECT_TRUE(contains(message, dir_ + "/absent.tok: cannot open token file: No such file")) << message;
}

TEST_F(TokenDataFile, RejectsADirectory) {
  const std::string message = error_message_of([&] { TokenFile file(dir_); });
  EXPECT_TRUE(contains(message, dir_ + ": cannot open token file: not a regular file")) << message;
}

TEST_F(TokenDataFile, RejectsAFileShorterThanTheHeader) {
  const std::string message = open_error(RawFile().bytes().substr(0, 31));
  EXPECT_TRUE(contains(message, "file is 31 bytes, shorter than the 32-byte token file header")) << message;
  EXPECT_TRUE(contains(open_error(std::string()), "file is 0 bytes"));
}

TEST_F(TokenDataFile, RejectsABadMagic) {
  RawFile raw;
  raw.magic = "MTTOKENZ";
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "not a token file: the first 8 bytes are not the magic \"MTTOKENS\"")) << message;
}

TEST_F(TokenDataFile, RejectsAnUnknownVersion) {
  RawFile raw;
  raw.version = 3;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "token file version 3 is not supported (this reader knows versions 1 and 2)"))
      << message;
}

TEST_F(TokenDataFile, RejectsAVersion1FileWithBytesPerTokenOtherThanTwo) {
  RawFile raw;
  raw.token_bytes = 4;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "token file version 1 has 4 bytes per token; it stores 2 (u16)")) << message;
}

TEST_F(TokenDataFile, RejectsAVocabSizeOutsideTheU16Range) {
  RawFile zero, big;
  zero.vocab = 0;
  big.vocab = 65537;
  const std::string a = open_error(zero), b = open_error(big);
  EXPECT_TRUE(contains(a, "token file vocab_size 0 is outside [1, 65536] (version 1 stores u16 tokens)")) << a;
  EXPECT_TRUE(contains(b, "token file vocab_size 65537 is outside [1, 65536]")) << b;
}

TEST_F(TokenDataFile, RejectsANonZeroReservedField) {
  RawFile raw;
  raw.reserved = 7;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "token file reserved header field is 7, must be 0")) << message;
}

TEST_F(TokenDataFile, RejectsATruncatedFile) {
  RawFile raw;
  raw.count = 4;  // three tokens present
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "the header's count of 4 tokens needs 40 bytes but the file has 38 bytes (truncated)"))
      << message;
  raw.count = uint64_t{1} << 63;  // 32 + 2 * count does not fit in 64 bits
  const std::string huge = open_error(raw);
  EXPECT_TRUE(contains(huge, "needs more than 2^64 bytes but the file has 38 bytes (truncated)")) << huge;
}

TEST_F(TokenDataFile, RejectsTrailingBytes) {
  RawFile raw;
  raw.count = 2;  // three tokens present
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "count of 2 tokens needs 36 bytes but the file has 38 bytes (trailing bytes)"))
      << message;
  raw.count = 3;
  const std::string odd = open_error(raw.bytes() + "x");  // half a token at the end
  EXPECT_TRUE(contains(odd, "count of 3 tokens needs 38 bytes but the file has 39 bytes (trailing bytes)")) << odd;
}

TEST_F(TokenDataFile, RejectsZeroTokens) {
  RawFile raw;
  raw.tokens.clear();
  raw.count = 0;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "token file holds zero tokens")) << message;
}

TEST_F(TokenDataFile, RejectsATokenNotBelowTheVocabSize) {
  RawFile raw;
  raw.vocab = 50;
  raw.tokens = {1, 49, 50, 3};
  raw.count = 4;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message, "token 50 at position 2 is not below the file's vocab_size 50")) << message;
}

// ---------------------------------------------------------------- version 2 and the loss mask

TEST_F(TokenDataFile, V2RoundTripsU32IdsOfAVocabOf200000AtFourBytesEach) {
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 199999, 123456, 7};
  mt::data::write_token_file(path_, tokens, /*vocab_size=*/200000);
  EXPECT_EQ(read_bytes(path_), v2_file(tokens, 200000).bytes());

  const TokenFile file(path_);
  EXPECT_EQ(file.format(), mt::data::TokenFileFormat::mttokens_v2);
  EXPECT_EQ(file.size(), 6);
  EXPECT_EQ(file.vocab_size(), 200000);
  EXPECT_EQ(file.bytes_per_token(), 4);
  EXPECT_EQ(file.u16_tokens(), nullptr);
  EXPECT_EQ(std::vector<uint32_t>(file.u32_tokens(), file.u32_tokens() + 6), tokens);
  std::vector<int64_t> copied(3);
  file.copy_tokens(2, 3, copied.data());
  EXPECT_EQ(copied, (std::vector<int64_t>{65536, 199999, 123456}));
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(file.token(i), tokens[static_cast<size_t>(i)]);
    EXPECT_EQ(file[i], tokens[static_cast<size_t>(i)]);
  }
  const std::string outside = error_message_of([&] { file.copy_tokens(4, 3, copied.data()); });
  EXPECT_TRUE(contains(outside, path_ + ": tokens [4, 7) are outside [0, 6)")) << outside;
}

TEST_F(TokenDataFile, V2ChoosesTwoBytesPerTokenUpToAVocabOf65536AndFourAbove) {
  EXPECT_EQ(mt::data::bytes_per_token_for(1), 2);
  EXPECT_EQ(mt::data::bytes_per_token_for(65536), 2);
  EXPECT_EQ(mt::data::bytes_per_token_for(65537), 4);
  EXPECT_EQ(mt::data::bytes_per_token_for(4294967295), 4);
  // u32 ids of a small vocabulary are narrowed to 2 bytes; u16 ids of a large one widened to 4.
  mt::data::write_token_file(path_, std::vector<uint32_t>{3, 65535, 0}, 65536);
  EXPECT_EQ(read_bytes(path_), v2_file({3, 65535, 0}, 65536).bytes());
  EXPECT_EQ(TokenFile(path_).bytes_per_token(), 2);
  mt::data::write_token_file(path_, std::vector<uint16_t>{3, 65535, 0}, 65537);
  EXPECT_EQ(read_bytes(path_), v2_file({3, 65535, 0}, 65537).bytes());
  const TokenFile wide(path_);
  EXPECT_EQ(wide.bytes_per_token(), 4);
  EXPECT_EQ(wide[1], 65535u);
}

TEST_F(TokenDataFile, V2RoundTripsMoreTokensThanOneWriterChunk) {
  std::vector<uint32_t> tokens(150000);  // the writer converts widths 65536 tokens at a time
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 1000);
  mt::data::write_token_file(path_, tokens, 1000);
  const TokenFile file(path_);
  ASSERT_EQ(file.bytes_per_token(), 2);
  EXPECT_EQ(std::vector<uint32_t>(file.u16_tokens(), file.u16_tokens() + file.size()), tokens);
}

TEST_F(TokenDataFile, Version1FilesStillLoad) {
  RawFile raw;  // version 1, written byte by byte: the format before version 2
  raw.tokens = {0, 255, 17};
  write_bytes(path_, raw.bytes());
  const TokenFile file(path_);
  EXPECT_EQ(file.format(), mt::data::TokenFileFormat::mttokens_v1);
  EXPECT_EQ(file.size(), 3);
  EXPECT_EQ(file.vocab_size(), 256);
  EXPECT_EQ(file.bytes_per_token(), 2);
  EXPECT_FALSE(file.has_loss_mask());
  EXPECT_EQ(file[1], 255u);
}

TEST_F(TokenDataFile, LossMaskRoundTripsAfterTheTokens) {
  const std::vector<uint32_t> tokens = {10, 11, 12, 13, 70000};
  const std::vector<uint8_t> mask = {0, 0, 1, 1, 0};
  mt::data::write_token_file(path_, tokens, mask, /*vocab_size=*/70001);
  EXPECT_EQ(read_bytes(path_), v2_file(tokens, 70001, std::string("\0\0\1\1\0", 5)).bytes());
  const TokenFile file(path_);
  ASSERT_TRUE(file.has_loss_mask());
  EXPECT_EQ(std::vector<uint8_t>(file.loss_mask(), file.loss_mask() + 5), mask);
  EXPECT_EQ(file[4], 70000u);
  // The pointer overload, 2 bytes per token: the mask follows the narrower tokens.
  const std::vector<uint16_t> small = {1, 2, 3};
  const uint8_t small_mask[] = {1, 0, 1};
  mt::data::write_token_file(path_, small.data(), small.size(), 4, small_mask);
  EXPECT_EQ(read_bytes(path_), v2_file({1, 2, 3}, 4, std::string("\1\0\1", 3)).bytes());
  EXPECT_EQ(TokenFile(path_).loss_mask()[1], 0);
}

TEST_F(TokenDataFile, V2RejectsBytesPerTokenOtherThanTheVocabularyTakes) {
  RawFile wide = v2_file({1, 2, 3}, 300);
  wide.token_bytes = 4;
  const std::string a = open_error(wide);
  EXPECT_TRUE(contains(a, "token file has 4 bytes per token, but its vocab_size 300 takes 2 (2 up to 65536, else 4)"))
      << a;
  RawFile narrow = v2_file({1, 2, 3}, 70000);
  narrow.token_bytes = 2;
  const std::string b = open_error(narrow);
  EXPECT_TRUE(contains(b, "token file has 2 bytes per token, but its vocab_size 70000 takes 4")) << b;
  RawFile zero = v2_file({0}, 1);
  zero.vocab = 0;
  const std::string c = open_error(zero);
  EXPECT_TRUE(contains(c, "token file vocab_size 0 is outside [1, 4294967295]")) << c;
}

TEST_F(TokenDataFile, V2RejectsUnknownFlags) {
  RawFile raw = v2_file({1, 2, 3}, 256);
  raw.reserved = 6;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message,
                       "token file flags 0x6 set unknown bits (only bit 0, has a loss mask, and bit 1, has example "
                       "starts, are defined)"))
      << message;
}

TEST_F(TokenDataFile, V2RejectsAMaskByteOtherThanZeroOrOne) {
  const std::string message = open_error(v2_file({1, 2, 3}, 256, std::string("\1\2\0", 3)));
  EXPECT_TRUE(contains(message, "loss mask byte 2 at position 1 is not 0 or 1")) << message;
}

TEST_F(TokenDataFile, V2RejectsAMaskCutShortOrFollowedByBytes) {
  RawFile raw = v2_file({1, 2, 3}, 256, std::string("\1\1\1", 3));  // 32 + 3 * (2 + 1) = 41 bytes
  raw.mask.pop_back();
  const std::string cut = open_error(raw);
  EXPECT_TRUE(contains(cut,
                       "the header's count of 3 tokens with a loss mask needs 41 bytes but the file has 40 "
                       "bytes (truncated)"))
      << cut;
  raw.mask = std::string("\1\1\1\1", 4);
  const std::string trailing = open_error(raw);
  EXPECT_TRUE(contains(trailing, "needs 41 bytes but the file has 42 bytes (trailing bytes)")) << trailing;
  RawFile flagless = v2_file({1, 2, 3}, 256);  // mask bytes present, flag clear: they are trailing bytes
  flagless.mask = std::string("\1\1\1", 3);
  const std::string stray = open_error(flagless);
  EXPECT_TRUE(contains(stray, "count of 3 tokens needs 38 bytes but the file has 41 bytes (trailing bytes)")) << stray;
}

TEST_F(TokenDataFile, V2RejectsAU32TokenNotBelowTheVocabSize) {
  const std::string message = open_error(v2_file({1, 70000, 2}, 70000));
  EXPECT_TRUE(contains(message, "token 70000 at position 1 is not below the file's vocab_size 70000")) << message;
}

TEST_F(TokenDataFile, AnExpectedVocabSizeMustMatchTheFilesOwn) {
  mt::data::write_token_file(path_, std::vector<uint16_t>{1, 2}, 256);
  EXPECT_EQ(TokenFile(path_, 256).vocab_size(), 256);
  const std::string message = open_error(read_bytes(path_), 300);
  EXPECT_TRUE(contains(message, "token file vocab_size 256 differs from the expected vocab_size 300")) << message;
  const std::string bad = error_message_of([&] { TokenFile file(path_, 0); });
  EXPECT_TRUE(contains(bad, path_ + ": the expected vocab_size 0 is outside [1, 4294967295]")) << bad;
}

// ---------------------------------------------------------------- llm.c shards

TEST_F(TokenDataFile, ReadsAnLlmcShardWithTheDefaultOrTheGivenVocabulary) {
  RawShard raw;
  raw.tokens = {50256, 0, 65535, 31};
  write_bytes(path_, raw.bytes());
  const TokenFile file(path_);
  EXPECT_EQ(file.format(), mt::data::TokenFileFormat::llmc_shard);
  EXPECT_EQ(file.size(), 4);
  EXPECT_EQ(file.vocab_size(), 65536);  // the shard does not say; a u16 holds 65536 ids
  EXPECT_EQ(file.bytes_per_token(), 2);
  EXPECT_FALSE(file.has_loss_mask());
  EXPECT_EQ(std::vector<uint16_t>(file.u16_tokens(), file.u16_tokens() + 4), raw.tokens);

  raw.tokens = {50256, 0, 220, 31};
  write_bytes(path_, raw.bytes());
  EXPECT_EQ(TokenFile(path_, /*expected_vocab_size=*/50257).vocab_size(), 50257);
  raw.tokens = {50256, 0, 50257, 31};
  const std::string message = open_error(raw, 50257);
  EXPECT_TRUE(contains(message,
                       "token 50257 at position 2 is not below the vocab_size given for this llm.c shard "
                       "50257"))
      << message;
}

TEST_F(TokenDataFile, RejectsAnLlmcShardShorterThanItsHeader) {
  const std::string message = open_error(RawShard().bytes().substr(0, 500));
  EXPECT_TRUE(contains(message, "file is 500 bytes, shorter than the 1024-byte header of an llm.c token shard"))
      << message;
}

TEST_F(TokenDataFile, RejectsAnLlmcShardOfAnotherVersionOrACountThatDisagrees) {
  RawShard version;
  version.version = 7;
  const std::string a = open_error(version);
  EXPECT_TRUE(contains(a, "llm.c shard version 7 is not supported (this reader knows version 1, u16 tokens)")) << a;
  RawShard truncated;
  truncated.count = 5;  // four tokens present
  const std::string b = open_error(truncated);
  EXPECT_TRUE(contains(b,
                       "llm.c shard size mismatch: the header's count of 5 tokens needs 1034 bytes but the file "
                       "has 1032 bytes (truncated)"))
      << b;
  RawShard trailing;
  trailing.count = 3;
  const std::string c = open_error(trailing);
  EXPECT_TRUE(contains(c, "needs 1030 bytes but the file has 1032 bytes (trailing bytes)")) << c;
  RawShard negative;
  negative.count = -2;
  const std::string d = open_error(negative);
  EXPECT_TRUE(contains(d, "llm.c shard token count -2 is negative")) << d;
  RawShard empty;
  empty.tokens.clear();
  empty.count = 0;
  const std::string e = open_error(empty);
  EXPECT_TRUE(contains(e, "llm.c shard holds zero tokens")) << e;
}

TEST_F(TokenDataFile, AWrongMagicNamesBothFormats) {
  RawShard raw;
  raw.magic = 20240521;
  const std::string message = open_error(raw);
  EXPECT_TRUE(contains(message,
                       "not a token file: the first 8 bytes are not the magic \"MTTOKENS\" (nor do the "
                       "first 4 hold llm.c's shard magic 20240520)"))
      << message;
}

TEST_F(TokenDataFile, WriterValidatesBeforeTouchingTheFilesystem) {
  const std::string high = error_message_of([&] {
    mt::data::write_token_file(path_, std::vector<uint16_t>{1, 256, 2}, 256);
  });
  EXPECT_TRUE(contains(high, "write_token_file: " + path_ + ": token 256 at position 1 is not below vocab_size 256"))
      << high;
  const std::string empty = error_message_of([&] { mt::data::write_token_file(path_, std::vector<uint16_t>{}, 256); });
  EXPECT_TRUE(contains(empty, path_ + ": no tokens to write")) << empty;
  for (int64_t vocab : {int64_t{0}, int64_t{1} << 32}) {
    const std::string bad =
        error_message_of([&] { mt::data::write_token_file(path_, std::vector<uint16_t>{0}, vocab); });
    EXPECT_TRUE(contains(bad, path_ + ": vocab_size " + std::to_string(vocab) + " is outside [1, 4294967295]")) << bad;
  }
  const std::string mask = error_message_of([&] {
    mt::data::write_token_file(path_, std::vector<uint32_t>{1, 2, 3}, std::vector<uint8_t>{1, 2, 0}, 256);
  });
  EXPECT_TRUE(contains(mask, path_ + ": loss mask byte 2 at position 1 is not 0 or 1")) << mask;
  const std::string short_mask = error_message_of([&] {
    mt::data::write_token_file(path_, std::vector<uint32_t>{1, 2, 3}, std::vector<uint8_t>{1}, 256);
  });
  EXPECT_TRUE(contains(short_mask, path_ + ": the loss mask has 1 bytes for 3 tokens")) << short_mask;
  EXPECT_TRUE(dir_entries(dir_).empty());
}

TEST_F(TokenDataFile, WriteIntoAMissingDirectoryThrowsAndLeavesNothing) {
  const std::string missing = dir_ + "/no_such_dir/corpus.tok";
  try {
    mt::data::write_token_file(missing, std::vector<uint16_t>{1, 2}, 256);
    FAIL() << "expected a FileError";
  } catch (const mt::FileError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(missing + ": cannot save token file", 0), 0u) << message;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/no_such_dir"));
  EXPECT_TRUE(dir_entries(dir_).empty());
}

TEST_F(TokenDataFile, OverwritingReplacesTheExistingFile) {
  mt::data::write_token_file(path_, std::vector<uint16_t>{1, 2, 3, 4, 5}, 256);
  const TokenFile old_file(path_);  // an open map keeps the old content (rename, not rewrite in place)
  mt::data::write_token_file(path_, std::vector<uint16_t>{9, 8}, 10);
  const TokenFile file(path_);
  EXPECT_EQ(file.size(), 2);
  EXPECT_EQ(file.vocab_size(), 10);
  EXPECT_EQ(std::vector<uint16_t>(file.u16_tokens(), file.u16_tokens() + 2), (std::vector<uint16_t>{9, 8}));
  EXPECT_EQ(std::vector<uint16_t>(old_file.u16_tokens(), old_file.u16_tokens() + 5),
            (std::vector<uint16_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"corpus.tok"});
}

// ---------------------------------------------------------------- example starts

// The example starts section: the count, then the starts, each a little-endian u64.
std::string starts_section(uint64_t count, const std::vector<uint64_t>& starts) {
  std::string s = le(count, 8);
  for (uint64_t start : starts) s += le(start, 8);
  return s;
}

// A version 2 file of tokens 1..n (vocab 256) with the example-starts flag (and a mask when
// given), followed by `section`.
std::string v2_with_starts(int n, const std::string& section, std::string mask = {}) {
  std::vector<uint32_t> tokens;
  for (int i = 1; i <= n; ++i) tokens.push_back(static_cast<uint32_t>(i));
  RawFile raw = v2_file(tokens, 256, std::move(mask));
  raw.reserved |= mt::data::kTokenFileFlagExampleStarts;
  return raw.bytes() + section;
}

TEST_F(TokenDataFile, ExampleStartsRoundTripAfterTheTokensAndTheMask) {
  const std::vector<uint32_t> tokens = {5, 6, 7, 8, 9, 10, 11};
  const std::vector<uint8_t> mask = {0, 1, 1, 0, 0, 1, 1};
  const std::vector<uint64_t> starts = {0, 3, 5};
  mt::data::write_token_file(path_, tokens, mask, starts, /*vocab_size=*/256);
  RawFile expected = v2_file(tokens, 256, std::string("\0\1\1\0\0\1\1", 7));
  expected.reserved = 3;                                                       // loss mask and example starts
  EXPECT_EQ(read_bytes(path_), expected.bytes() + starts_section(3, starts));  // 32 + 14 + 7: an unaligned section
  const TokenFile file(path_);
  ASSERT_TRUE(file.has_example_starts());
  EXPECT_EQ(file.num_examples(), 3);
  EXPECT_EQ(file.example_start(0), 0);
  EXPECT_EQ(file.example_start(1), 3);
  EXPECT_EQ(file.example_start(2), 5);
  EXPECT_EQ(file.example_end(0), 3);
  EXPECT_EQ(file.example_end(2), 7);
  EXPECT_EQ(std::vector<uint8_t>(file.loss_mask(), file.loss_mask() + 7), mask);
  const std::string outside = error_message_of([&] { (void)file.example_start(3); });
  EXPECT_TRUE(contains(outside, path_ + ": example 3 is out of range [0, 3)")) << outside;

  // Without a mask, through the pointer overload with u32 tokens; one example covering all.
  const std::vector<uint32_t> wide = {70000, 1};
  const uint64_t one[] = {0};
  mt::data::write_token_file(path_, wide.data(), wide.size(), 70001, /*loss_mask=*/nullptr, one, 1);
  RawFile plain = v2_file(wide, 70001);
  plain.reserved = 2;
  EXPECT_EQ(read_bytes(path_), plain.bytes() + starts_section(1, {0}));
  const TokenFile single(path_);
  EXPECT_FALSE(single.has_loss_mask());
  EXPECT_EQ(single.num_examples(), 1);
  EXPECT_EQ(single.example_end(0), 2);

  // A file written without them has none.
  mt::data::write_token_file(path_, tokens, mask, 256);
  const TokenFile none(path_);
  EXPECT_FALSE(none.has_example_starts());
  EXPECT_EQ(none.num_examples(), 0);
  EXPECT_TRUE(contains(error_message_of([&] { (void)none.example_start(0); }), "example 0 is out of range [0, 0)"));
}

TEST_F(TokenDataFile, MoveCarriesTheExampleStarts) {
  mt::data::write_token_file(path_, std::vector<uint32_t>{1, 2, 3}, {}, std::vector<uint64_t>{0, 2}, 10);
  TokenFile a(path_);
  const TokenFile b(std::move(a));
  EXPECT_EQ(b.num_examples(), 2);
  EXPECT_EQ(b.example_start(1), 2);
  EXPECT_EQ(a.num_examples(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state is part of the contract
}

TEST_F(TokenDataFile, RejectsAFirstExampleStartOtherThanZero) {
  const std::string message = open_error(v2_with_starts(5, starts_section(2, {1, 3})));
  EXPECT_TRUE(contains(message, "example start 0 (= 1) is not 0: the first example starts at token 0")) << message;
}

TEST_F(TokenDataFile, RejectsExampleStartsThatDoNotIncrease) {
  const std::string equal = open_error(v2_with_starts(20, starts_section(4, {0, 5, 17, 17})));
  EXPECT_TRUE(contains(equal, "example start 3 (= 17) is not greater than the one before (= 17)")) << equal;
  const std::string down = open_error(v2_with_starts(20, starts_section(3, {0, 9, 4})));
  EXPECT_TRUE(contains(down, "example start 2 (= 4) is not greater than the one before (= 9)")) << down;
}

TEST_F(TokenDataFile, RejectsAnExampleStartNotBelowTheTokenCount) {
  const std::string at = open_error(v2_with_starts(5, starts_section(2, {0, 5})));
  EXPECT_TRUE(contains(at, "example start 1 (= 5) is not below the token count 5")) << at;
  const std::string masked = open_error(v2_with_starts(3, starts_section(2, {0, 9}), std::string("\1\1\1", 3)));
  EXPECT_TRUE(contains(masked, "example start 1 (= 9) is not below the token count 3")) << masked;
}

TEST_F(TokenDataFile, RejectsAnExampleCountOfZero) {
  const std::string message = open_error(v2_with_starts(5, starts_section(0, {})));
  EXPECT_TRUE(contains(message, "token file example count is 0 (a file with example starts holds at least one)"))
      << message;
}

TEST_F(TokenDataFile, RejectsExampleStartsCutShortOrFollowedByBytes) {
  // 32 + 5 * 2 = 42 bytes of header and tokens, then 8 for the count and 8 per start.
  const std::string missing = open_error(v2_with_starts(5, ""));
  EXPECT_TRUE(contains(missing,
                       "the header's count of 5 tokens and example starts needs more than 42 bytes but the file has "
                       "42 bytes (truncated)"))
      << missing;
  const std::string half_count = open_error(v2_with_starts(5, le(1, 4)));
  EXPECT_TRUE(contains(half_count, "but the file has 46 bytes (truncated)")) << half_count;
  const std::string cut = open_error(v2_with_starts(5, starts_section(3, {0, 2})));
  EXPECT_TRUE(contains(cut, "token file example count of 3 needs 74 bytes but the file has 66 bytes (truncated)"))
      << cut;
  const std::string part = open_error(v2_with_starts(5, starts_section(2, {0, 2}).substr(0, 20)));
  EXPECT_TRUE(contains(part, "example count of 2 needs 66 bytes but the file has 62 bytes (truncated)")) << part;
  const std::string huge = open_error(v2_with_starts(5, starts_section(uint64_t{1} << 62, {0})));
  EXPECT_TRUE(contains(huge, "needs more than 2^64 bytes but the file has 58 bytes (truncated)")) << huge;
  const std::string trailing = open_error(v2_with_starts(5, starts_section(2, {0, 2}) + "x"));
  EXPECT_TRUE(contains(trailing, "example count of 2 needs 66 bytes but the file has 67 bytes (trailing bytes)"))
      << trailing;
  const std::string extra = open_error(v2_with_starts(5, starts_section(1, {0, 2})));
  EXPECT_TRUE(contains(extra, "example count of 1 needs 58 bytes but the file has 66 bytes (trailing bytes)")) << extra;
  // Starts present, flag clear: trailing bytes after the tokens.
  const std::string flagless = open_error(v2_file({1, 2, 3}, 256).bytes() + starts_section(1, {0}));
  EXPECT_TRUE(contains(flagless, "count of 3 tokens needs 38 bytes but the file has 54 bytes (trailing bytes)"))
      << flagless;
}

TEST_F(TokenDataFile, WriterValidatesExampleStartsBeforeTouchingTheFilesystem) {
  const std::vector<uint32_t> tokens = {1, 2, 3, 4};
  const auto write_error = [&](const std::vector<uint64_t>& starts) {
    return error_message_of([&] { mt::data::write_token_file(path_, tokens, {}, starts, 10); });
  };
  EXPECT_TRUE(contains(write_error({}), path_ + ": example starts given, but none")) << write_error({});
  EXPECT_TRUE(contains(write_error({2}), path_ + ": example start 0 (= 2) is not 0")) << write_error({2});
  EXPECT_TRUE(contains(write_error({0, 2, 2}), "example start 2 (= 2) is not greater than the one before (= 2)"));
  EXPECT_TRUE(contains(write_error({0, 4}), "example start 1 (= 4) is not below the token count 4"));
  const std::string no_pointer = error_message_of(
      [&] { mt::data::write_token_file(path_, tokens.data(), tokens.size(), 10, nullptr, nullptr, 2); });
  EXPECT_TRUE(contains(no_pointer, "2 example starts, but no pointer to them")) << no_pointer;
  const std::string short_mask = error_message_of(
      [&] { mt::data::write_token_file(path_, tokens, std::vector<uint8_t>{1}, std::vector<uint64_t>{0}, 10); });
  EXPECT_TRUE(contains(short_mask, "the loss mask has 1 bytes for 4 tokens")) << short_mask;
  EXPECT_TRUE(dir_entries(dir_).empty());
}

// ---------------------------------------------------------------- batcher

// A file whose token i is i (vocab 65536), so a token's value is its position.
class TokenDataBatcher : public TokenDataFile {
 protected:
  TokenFile make_file(int64_t n) {
    std::vector<uint16_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
    mt::data::write_token_file(path_, tokens, 65536);
    return TokenFile(path_);
  }
};

struct Rows {
  std::vector<int64_t> inputs, targets;
};

Rows rows_of(const Batch& b) { return {b.inputs.to_vector<int64_t>(), b.targets.to_vector<int64_t>()}; }

// The file position of each row's first input (token values are positions).
std::vector<int64_t> window_starts(const Batch& b) {
  const std::vector<int64_t> in = b.inputs.to_vector<int64_t>();
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < b.inputs.size(0); ++r) starts.push_back(in[static_cast<size_t>(r * b.inputs.size(1))]);
  return starts;
}

std::vector<Rows> take(TokenBatcher& batcher, int n) {
  std::vector<Rows> out;
  for (int i = 0; i < n; ++i) out.push_back(rows_of(batcher.next()));
  return out;
}

bool operator==(const Rows& a, const Rows& b) { return a.inputs == b.inputs && a.targets == b.targets; }

TEST_F(TokenDataBatcher, TargetsAreInputsShiftedByOneAndBothAreSlicesOfTheFile) {
  constexpr int64_t B = 3, T = 5;
  const TokenFile file = make_file(1 + 7 * T + 2);  // 7 windows and a 2-token tail
  TokenBatcher batcher(file, BatcherOptions(B, T).seed(11));
  EXPECT_EQ(batcher.num_windows(), 7);
  EXPECT_EQ(batcher.batches_per_epoch(), 2);
  const Batch batch = batcher.next();
  EXPECT_EQ(batch.inputs.shape(), (mt::Shape{B, T}));
  EXPECT_EQ(batch.targets.shape(), (mt::Shape{B, T}));
  EXPECT_EQ(batch.inputs.dtype(), mt::DType::i64);
  EXPECT_EQ(batch.targets.dtype(), mt::DType::i64);
  EXPECT_EQ(batch.inputs.device(), mt::kCPU);
  const Rows rows = rows_of(batch);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t start = rows.inputs[static_cast<size_t>(r * T)];
    EXPECT_EQ(start % T, 0) << "row " << r << " does not start on a window boundary";
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(r * T + t);
      EXPECT_EQ(rows.inputs[i], file[start + t]);
      EXPECT_EQ(rows.targets[i], file[start + t + 1]);
    }
  }
}

TEST_F(TokenDataBatcher, EachEpochCoversEveryWindowExactlyOnce) {
  constexpr int64_t B = 4, T = 3;
  const TokenFile file = make_file(1 + 24 * T);
  TokenBatcher batcher(file, BatcherOptions(B, T).seed(5));
  ASSERT_EQ(batcher.batches_per_epoch(), 6);
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t e = 0; e < 3; ++e) {
    for (int64_t s = 0; s < 6; ++s) {
      const Batch batch = batcher.next();
      EXPECT_EQ(batch.epoch, e);
      EXPECT_EQ(batch.step, s);
      for (int64_t start : window_starts(batch)) epochs[static_cast<size_t>(e)].push_back(start);
    }
  }
  std::vector<int64_t> all_windows;
  for (int64_t w = 0; w < 24; ++w) all_windows.push_back(w * T);
  for (auto& starts : epochs) {
    std::vector<int64_t> sorted = starts;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all_windows);
  }
  EXPECT_NE(epochs[0], all_windows) << "the first epoch was not shuffled";
  EXPECT_NE(epochs[0], epochs[1]) << "two epochs visited the windows in the same order";
}

TEST_F(TokenDataBatcher, ShuffleFalseKeepsTheFileOrder) {
  constexpr int64_t B = 2, T = 4;
  const TokenFile file = make_file(1 + 4 * T);
  TokenBatcher batcher(file, BatcherOptions(B, T).shuffle(false));
  for (int epoch = 0; epoch < 2; ++epoch) {
    EXPECT_EQ(window_starts(batcher.next()), (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(window_starts(batcher.next()), (std::vector<int64_t>{8, 12}));
  }
}

TEST_F(TokenDataBatcher, SameSeedGivesTheSameBatchesAndAnotherSeedAnotherOrder) {
  const TokenFile file = make_file(1 + 40 * 2);
  TokenBatcher a(file, BatcherOptions(4, 2).seed(42)), b(file, BatcherOptions(4, 2).seed(42));
  TokenBatcher c(file, BatcherOptions(4, 2).seed(43));
  const std::vector<Rows> ra = take(a, 25), rb = take(b, 25), rc = take(c, 25);  // 2.5 epochs
  EXPECT_TRUE(ra == rb);
  EXPECT_FALSE(ra == rc);
}

// The order must not change between machines, compilers or releases: a resumed run on
// another machine would otherwise see different data. Pinned for seed 1234, epochs 0 and 1;
// the values were checked against an independent Python Philox4x32-10 + Fisher-Yates.
TEST_F(TokenDataBatcher, TheShuffleIsPinnedAcrossPlatforms) {
  const TokenFile file = make_file(1 + 10);
  const TokenBatcher batcher(file, BatcherOptions(1, 1).seed(1234));
  EXPECT_EQ(batcher.epoch_order(0), (std::vector<int64_t>{3, 6, 9, 8, 4, 2, 1, 5, 7, 0}));
  EXPECT_EQ(batcher.epoch_order(1), (std::vector<int64_t>{4, 5, 0, 1, 2, 8, 9, 7, 3, 6}));
}

TEST_F(TokenDataBatcher, TwoRanksGetDisjointWindowsWhoseUnionIsTheEpochMinusTheRemainder) {
  constexpr int64_t B = 4, T = 2;
  const TokenFile file = make_file(1 + 25 * T);  // 25 windows: 12 per rank, one dropped
  TokenBatcher whole(file, BatcherOptions(1, T).seed(9));
  std::vector<int64_t> epoch;  // the single-process epoch, in order
  for (int i = 0; i < 25; ++i) epoch.push_back(window_starts(whole.next())[0]);

  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    TokenBatcher batcher(file, BatcherOptions(B, T).seed(9).rank(rank).world_size(2));
    ASSERT_EQ(batcher.batches_per_epoch(), 3);
    std::vector<int64_t> mine;
    for (int s = 0; s < 3; ++s) {
      for (int64_t start : window_starts(batcher.next())) mine.push_back(start);
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k], epoch[static_cast<size_t>(rank) + 2 * k]) << "rank " << rank << " window " << k;
      EXPECT_TRUE(seen.insert(mine[k]).second) << "window at " << mine[k] << " reached twice";
    }
    EXPECT_EQ(batcher.next().epoch, 1);  // 3 batches, then the next epoch
  }
  std::set<int64_t> expected(epoch.begin(), epoch.end() - 1);
  EXPECT_EQ(seen, expected);  // the last window of the order is the remainder
}

TEST_F(TokenDataBatcher, RestoreMidEpochAndAcrossEpochsReproducesTheUninterruptedRun) {
  const TokenFile file = make_file(1 + 13 * 3);  // 13 windows, B = 2: 6 batches per epoch, one window dropped
  const BatcherOptions options = BatcherOptions(2, 3).seed(77);
  TokenBatcher reference(file, options);
  const std::vector<Rows> expected = take(reference, 20);
  for (int stop : {0, 4, 5, 6, 8, 12, 13}) {
    TokenBatcher first(file, options);
    take(first, stop);
    const BatcherState state = first.state();
    EXPECT_EQ(state.epoch, stop / 6) << "after " << stop;
    EXPECT_EQ(state.index, stop % 6) << "after " << stop;
    EXPECT_EQ(state.seed, 77u);
    TokenBatcher resumed(file, options);
    resumed.restore(state);
    const std::vector<Rows> rest = take(resumed, 20 - stop);
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), expected.begin() + stop)) << "resumed after " << stop;
  }
}

TEST_F(TokenDataBatcher, RestoreRejectsAnotherSeedAndPositionsOutOfRange) {
  const TokenFile file = make_file(1 + 8 * 2);
  TokenBatcher batcher(file, BatcherOptions(2, 2).seed(3));  // 4 batches per epoch
  const std::string seed = error_message_of([&] { batcher.restore({0, 1, 4}); });
  EXPECT_TRUE(contains(seed, path_ + ": the state's seed 4 differs from this batcher's seed 3")) << seed;
  const std::string index = error_message_of([&] { batcher.restore({0, 4, 3}); });
  EXPECT_TRUE(contains(index, path_ + ": index 4 is outside [0, batches_per_epoch 4)")) << index;
  EXPECT_TRUE(contains(error_message_of([&] { batcher.restore({0, -1, 3}); }), "index -1 is outside"));
  const std::string epoch = error_message_of([&] { batcher.restore({-1, 0, 3}); });
  EXPECT_TRUE(contains(epoch, "epoch must be non-negative, got -1")) << epoch;
  EXPECT_EQ(batcher.state().index, 0);  // unchanged by the refused restores
  EXPECT_TRUE(contains(error_message_of([&] { batcher.epoch_order(-2); }), "epoch must be non-negative, got -2"));
}

TEST_F(TokenDataBatcher, AFileTooShortForOneWindowNamesFileCountAndSeqLen) {
  const TokenFile file = make_file(8);
  const std::string message = error_message_of([&] { TokenBatcher batcher(file, BatcherOptions(1, 8)); });
  EXPECT_TRUE(contains(message, path_ + ": 8 tokens are too few for one window of seq_len 8")) << message;
  TokenBatcher ok(file, BatcherOptions(1, 7));  // 8 tokens are exactly one window of 7 + 1
  EXPECT_EQ(ok.batches_per_epoch(), 1);
}

TEST_F(TokenDataBatcher, TooFewWindowsForOneBatchPerRankIsAnError) {
  const TokenFile file = make_file(1 + 5 * 2);  // 5 windows
  const std::string message =
      error_message_of([&] { TokenBatcher batcher(file, BatcherOptions(3, 2).rank(1).world_size(2)); });
  EXPECT_TRUE(contains(message, path_ + ": 11 tokens make 5 windows of seq_len 2, fewer than one batch of 3 per rank "
                                        "for world_size 2 (needs 6 windows)"))
      << message;
}

TEST_F(TokenDataBatcher, RejectsInvalidOptions) {
  const TokenFile file = make_file(100);
  const auto error = [&](const BatcherOptions& options) {
    return error_message_of([&] { TokenBatcher batcher(file, options); });
  };
  EXPECT_TRUE(contains(error(BatcherOptions(0, 4)), "batch_size must be at least 1, got 0"));
  EXPECT_TRUE(contains(error(BatcherOptions(1, 0)), "seq_len must be at least 1, got 0"));
  EXPECT_TRUE(contains(error(BatcherOptions(1, 4).world_size(0)), "world_size must be at least 1, got 0"));
  EXPECT_TRUE(contains(error(BatcherOptions(1, 4).rank(2).world_size(2)), "rank 2 is outside [0, world_size 2)"));
  EXPECT_TRUE(contains(error(BatcherOptions(1, 4).rank(-1)), "rank -1 is outside [0, world_size 1)"));
  TokenFile moved = make_file(10);
  TokenFile taken(std::move(moved));
  EXPECT_TRUE(contains(error_message_of([&] { TokenBatcher batcher(moved, BatcherOptions(1, 1)); }),
                       "the token file is empty (moved from?)"));
}

}  // namespace
