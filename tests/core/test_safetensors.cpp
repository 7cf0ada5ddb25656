// Contracts of core/safetensors.h: bit-exact round trips of every dtype, the
// reference layout (read and written byte for byte), one test per malformed
// file the reader must refuse (FileError, message starting with the path), and
// the atomic writer (no temporary file left, an existing file kept on failure).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "core/view.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using mt::DType;
using mt::Tensor;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file as the format describes it: length, header text, data.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string tensor_bytes(const Tensor& t) {
  Tensor c = mt::raw::to(mt::raw::contiguous(t), mt::kCPU);
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Host bytes as a tensor of `dtype`, unconverted (from_blob converts to options.dtype(), f32 by default).
Tensor blob(const void* data, const mt::Shape& shape, DType dtype) {
  return mt::from_blob(data, shape, dtype, mt::TensorOptions().dtype(dtype));
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "mt_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    path_ = dir_ + "/model.safetensors";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `bytes` to path_, loads it, and returns the FileError's message (checking it starts with the path).
  std::string load_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    return load_error_of(path_);
  }
  static std::string load_error_of(const std::string& path) {
    try {
      mt::load_safetensors(path);
    } catch (const mt::FileError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the path: " << msg;
      return msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw something other than FileError: " << e.what();
      return "";
    }
    ADD_FAILURE() << "loading did not throw";
    return "";
  }
  std::string save_error(const std::string& path, const std::map<std::string, Tensor>& tensors) {
    try {
      mt::save_safetensors(path, tensors);
    } catch (const mt::FileError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the path: " << msg;
      return msg;
    }
    ADD_FAILURE() << "saving did not throw";
    return "";
  }

  std::string dir_;
  std::string path_;
};

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// An entry for a header written by hand.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// ---------------------------------------------------------------- round trips

TEST_F(Safetensors, RoundTripEveryDTypeBitExact) {
  // Bit patterns, not values: NaN payloads (quiet and signalling), infinities, negative zero, subnormals.
  const std::vector<uint16_t> f16 = {0x7E01, 0xFC12, 0x7C01, 0x7C00, 0x8000, 0x0001};
  const std::vector<uint16_t> bf16 = {0x7FC1, 0xFF81, 0x7F80, 0x8000, 0x0001, 0x3F80};
  const std::vector<uint32_t> f32 = {0x7FA00001, 0xFFC00123, 0x7F800000, 0x80000000, 0x00000001, 0x3F800000};
  const std::vector<uint64_t> f64 = {0x7FF0000000000001ull, 0xFFF8000000000abcull, 0x8000000000000000ull,
                                     0x0000000000000001ull, 0x3FF0000000000000ull, 0x7FF0000000000000ull};
  const std::vector<uint8_t> f8e4m3 = {0x7F, 0xFF, 0x7E, 0x80, 0x01, 0x38};
  const std::vector<uint8_t> f8e5m2 = {0x7D, 0xFE, 0x7F, 0x7C, 0x80, 0x01};
  const std::vector<int64_t> i64 = {INT64_MIN, -1, 0, 1, INT64_MAX, 0x0102030405060708};
  const std::vector<int32_t> i32 = {INT32_MIN, -1, 0, 1, INT32_MAX, 0x01020304};
  const std::vector<uint8_t> u8 = {0, 1, 127, 128, 254, 255};
  const std::vector<uint8_t> boolean = {0, 1, 1, 0, 0, 1};
  const mt::Shape shape = {2, 3};
  std::map<std::string, Tensor> tensors = {
      {"f16", blob(f16.data(), shape, DType::f16)},
      {"bf16", blob(bf16.data(), shape, DType::bf16)},
      {"f32", blob(f32.data(), shape, DType::f32)},
      {"f64", blob(f64.data(), shape, DType::f64)},
      {"f8e4m3", blob(f8e4m3.data(), shape, DType::f8e4m3)},
      {"f8e5m2", blob(f8e5m2.data(), shape, DType::f8e5m2)},
      {"i64", blob(i64.data(), shape, DType::i64)},
      {"i32", blob(i32.data(), shape, DType::i32)},
      {"u8", blob(u8.data(), shape, DType::u8)},
      {"bool", blob(boolean.data(), shape, DType::boolean)},
  };
  ASSERT_EQ(tensors.size(), static_cast<size_t>(mt::kNumDTypes));
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(std::string(mt::dtype_name(t.dtype())), name) << "the test's own input";
  }
  mt::save_safetensors(path_, tensors);
  // The names the format gives each dtype (a swap of two would still round-trip).
  const std::string bytes = read_bytes(path_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes.at(i));
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const std::map<std::string, std::string> names = {
      {"f16", "F16"},        {"bf16", "BF16"}, {"f32", "F32"}, {"f64", "F64"}, {"f8e4m3", "F8_E4M3"},
      {"f8e5m2", "F8_E5M2"}, {"i64", "I64"},   {"i32", "I32"}, {"u8", "U8"},   {"bool", "BOOL"}};
  for (const auto& [name, format_name] : names) EXPECT_EQ(header.at(name).at("dtype"), format_name) << name;
  const mt::SafetensorsFile loaded = mt::load_safetensors(path_);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  EXPECT_TRUE(loaded.metadata.empty());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.tensors.count(name), 1u);
    const Tensor& got = loaded.tensors.at(name);
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(got.shape(), shape);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(got.device().is_cpu());
    EXPECT_EQ(tensor_bytes(got), tensor_bytes(t));
  }
}

TEST_F(Safetensors, WriterFollowsReferenceLayout) {
  // Names out of order and of different sizes: the data must follow name order, back to back.
  const std::vector<float> b = {1, 2, 3};
  const std::vector<double> a = {4, 5};
  const std::vector<uint8_t> c = {7};
  mt::save_safetensors(path_, {{"b", blob(b.data(), {3}, DType::f32)},
                               {"c", blob(c.data(), {1}, DType::u8)},
                               {"a", blob(a.data(), {2}, DType::f64)}});
  const std::string bytes = read_bytes(path_);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "the header must be padded to a multiple of 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 16 + 12 + 1);
  const std::string header = bytes.substr(8, n);
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces: " << header;
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j.at("a").at("dtype"), "F64");
  EXPECT_EQ(j.at("a").at("data_offsets"), nlohmann::json::array({0, 16}));
  EXPECT_EQ(j.at("b").at("dtype"), "F32");
  EXPECT_EQ(j.at("b").at("shape"), nlohmann::json::array({3}));
  EXPECT_EQ(j.at("b").at("data_offsets"), nlohmann::json::array({16, 28}));
  EXPECT_EQ(j.at("c").at("data_offsets"), nlohmann::json::array({28, 29}));
  EXPECT_FALSE(j.contains("__metadata__")) << "no metadata given, none written";
  EXPECT_EQ(bytes.substr(8 + n, 16), std::string(reinterpret_cast<const char*>(a.data()), 16));
}

TEST_F(Safetensors, NonContiguousInput) {
  Tensor base = mt::arange(int64_t{12}, mt::TensorOptions().dtype(DType::f32));
  Tensor t = mt::raw::transpose(mt::raw::view(base, {3, 4}), 0, 1);  // [4, 3], strides [1, 4]
  Tensor every_other = mt::raw::slice(base, 0, 1, 12, 2);            // [6], stride 2
  ASSERT_FALSE(t.is_contiguous());
  mt::save_safetensors(path_, {{"t", t}, {"s", every_other}});
  const auto loaded = mt::load_safetensors(path_);
  EXPECT_EQ(loaded.tensors.at("t").shape(), (mt::Shape{4, 3}));
  EXPECT_EQ(loaded.tensors.at("t").to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(loaded.tensors.at("s").to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
}

TEST_F(Safetensors, MetadataRoundTrip) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"empty", ""}, {"quote \" and \\ and \n", "unicode \xc3\xa9"}};
  mt::save_safetensors(path_, {{"w", mt::ones({2})}}, metadata);
  const auto loaded = mt::load_safetensors(path_);
  EXPECT_EQ(loaded.metadata, metadata);
  EXPECT_EQ(loaded.tensors.at("w").to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST_F(Safetensors, EmptyAndScalarTensorsRoundTrip) {
  mt::save_safetensors(path_, {{"empty", mt::zeros({0, 3})}, {"scalar", mt::full({}, 2.5)}});
  const auto loaded = mt::load_safetensors(path_);
  EXPECT_EQ(loaded.tensors.at("empty").shape(), (mt::Shape{0, 3}));
  EXPECT_EQ(loaded.tensors.at("scalar").shape(), mt::Shape{});
  EXPECT_EQ(loaded.tensors.at("scalar").item(), 2.5);
}

TEST_F(Safetensors, HeaderAloneGivesTheDtypesShapesAndMetadataAndIsValidatedAsTheFileIs) {
  mt::save_safetensors(path_, {{"w", mt::ones({2, 3}, mt::DType::bf16)}, {"i", mt::zeros({4}, mt::DType::i64)}},
                       {{"format", "pt"}});
  const mt::SafetensorsHeader header = mt::read_safetensors_header(path_);
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors.at("w"), std::make_pair(mt::DType::bf16, mt::Shape{2, 3}));
  EXPECT_EQ(header.tensors.at("i"), std::make_pair(mt::DType::i64, mt::Shape{4}));
  EXPECT_EQ(header.metadata.at("format"), "pt");
  std::filesystem::resize_file(path_, std::filesystem::file_size(path_) - 1);  // the data section cut short
  const std::string msg = error_message_of([&] { mt::read_safetensors_header(path_); });
  EXPECT_EQ(msg, error_message_of([&] { mt::load_safetensors(path_); }));
  EXPECT_EQ(msg.rfind(path_, 0), 0u) << msg;
}

TEST_F(Safetensors, SaveOverwritesAnExistingFile) {
  mt::save_safetensors(path_, {{"old", mt::ones({3})}});
  mt::save_safetensors(path_, {{"new", mt::zeros({2})}});
  const auto loaded = mt::load_safetensors(path_);
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.tensors.count("new"), 1u);
}

// The bytes Python's `safetensors.torch.save_file({"weight": torch.tensor([1.0, -2.5])}, metadata={"format": "pt"})`
// writes, built by hand from the spec: compact JSON, spaces to a multiple of 8, little-endian f32 data.
TEST_F(Safetensors, LoadsReferenceFileAndWritesTheSameBytes) {
  std::string header = R"({"__metadata__":{"format":"pt"},"weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  const std::string data("\x00\x00\x80\x3f\x00\x00\x20\xc0", 8);  // 1.0f, -2.5f
  const std::string reference = file_bytes(header, data);
  write_bytes(path_, reference);
  const auto loaded = mt::load_safetensors(path_);
  ASSERT_EQ(loaded.tensors.size(), 1u);
  const Tensor& w = loaded.tensors.at("weight");
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.shape(), mt::Shape{2});
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(loaded.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));

  const std::string ours = dir_ + "/ours.safetensors";
  mt::save_safetensors(ours, loaded.tensors, loaded.metadata);
  EXPECT_EQ(read_bytes(ours), reference);
}

TEST_F(Safetensors, CudaRoundTrip) {
  MT_SKIP_WITHOUT_CUDA();
  const std::vector<uint16_t> f16 = {0x7E01, 0xFC12, 0x3C00, 0x8000};
  Tensor host = blob(f16.data(), {2, 2}, DType::f16);
  Tensor dev = mt::raw::transpose(mt::raw::to(host, mt::cuda_device()), 0, 1);
  mt::save_safetensors(path_, {{"x", dev}});
  const auto loaded = mt::load_safetensors(path_, mt::cuda_device());
  const Tensor& x = loaded.tensors.at("x");
  EXPECT_TRUE(x.is_cuda());
  EXPECT_EQ(tensor_bytes(x), tensor_bytes(mt::raw::transpose(host, 0, 1)));
}

// ---------------------------------------------------------------- malformed files

TEST_F(Safetensors, RejectsFileShorterThanLengthField) {
  EXPECT_HAS(load_error(std::string("\x02\x00\x00\x00\x00", 5)), "file is 5 bytes, shorter than the 8-byte");
}

TEST_F(Safetensors, RejectsEmptyFile) { EXPECT_HAS(load_error(""), "file is 0 bytes"); }

TEST_F(Safetensors, RejectsHeaderLengthLargerThanFile) {
  EXPECT_HAS(load_error(le64(64) + "{}"), "header length 64 is larger than the 2 bytes after the length field");
}

TEST_F(Safetensors, RejectsHeaderLengthOverLimit) {
  EXPECT_HAS(load_error(le64(100'000'001) + "{}"), "header length 100000001 exceeds the limit of 100000000 bytes");
  EXPECT_HAS(load_error(le64(UINT64_MAX) + "{}"), "exceeds the limit");
}

TEST_F(Safetensors, RejectsHeaderThatIsNotJson) {
  EXPECT_HAS(load_error(file_bytes(R"({"a": {"dtype": "F32",)", "")), "header is not valid JSON");
}

// The message quotes the offending bytes escaped, so that the message (and stderr) stays valid UTF-8.
TEST_F(Safetensors, HeaderThatIsNotUtf8IsReportedWithTheByteEscaped) {
  const std::string msg = load_error(file_bytes("{\"a\xff\": 1}", ""));
  EXPECT_HAS(msg, "header is not valid JSON");
  EXPECT_HAS(msg, "\\xff");
  EXPECT_EQ(msg.find('\xff'), std::string::npos) << "the raw byte reached the message";
  EXPECT_EQ(mt::printable(msg), msg) << "the message is not printable as it is";
}

TEST_F(Safetensors, RejectsHeaderThatIsNotAnObject) {
  EXPECT_HAS(load_error(file_bytes("[1, 2]  ", "")), "header is not a JSON object (it is a array)");
}

TEST_F(Safetensors, RejectsEntryThatIsNotAnObject) {
  EXPECT_HAS(load_error(file_bytes(R"({"a": 5})", "")), "tensor 'a': entry is not a JSON object (it is a number)");
}

TEST_F(Safetensors, RejectsEntryWithoutDtype) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "abcd")),
             "tensor 'a': missing \"dtype\"");
}

TEST_F(Safetensors, RejectsEntryWithoutShape) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "abcd")),
             "tensor 'a': missing \"shape\"");
}

TEST_F(Safetensors, RejectsEntryWithoutDataOffsets) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", "abcd")),
             "tensor 'a': missing \"data_offsets\"");
}

TEST_F(Safetensors, RejectsEntryWithUnexpectedKey) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}})", "abcd")),
             "tensor 'a': unexpected key \"stride\"");
}

TEST_F(Safetensors, RejectsDtypeOfWrongJsonType) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd")),
             "\"dtype\" must be a string, got 4");
}

TEST_F(Safetensors, RejectsShapeOfWrongJsonType) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "abcd")),
             "\"shape\" must be an array of integers, got \"1\"");
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd")),
             "\"shape\" must be an array of integers, got [1.5]");
}

TEST_F(Safetensors, RejectsDataOffsetsOfWrongJsonType) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", "abcd")),
             "\"data_offsets\" must be [begin, end] with non-negative integers, got [4]");
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd")),
             "got [-4,0]");
}

TEST_F(Safetensors, RejectsUnknownDtype) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F4","shape":[1],"data_offsets":[0,4]}})", "abcd")),
             "tensor 'a': unknown dtype \"F4\"");
}

TEST_F(Safetensors, RejectsNegativeDimension) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,4]}})", "abcd")),
             "tensor 'a': negative dimension -2 in shape [-2,2]");
}

TEST_F(Safetensors, RejectsTooManyDimensions) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "a")),
             "has 9 dimensions; at most 8");
}

TEST_F(Safetensors, RejectsByteSizeDifferentFromOffsets) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F32", "[2,3]", 0, 20) + "}", std::string(20, 'x'))),
             "tensor 'a': shape [2, 3] of f32 needs 24 bytes but data_offsets [0, 20] hold 20 bytes");
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F64", "[4294967296,4294967296]", 0, 8) + "}", "12345678")),
             "needs more than 2^64 bytes");
}

TEST_F(Safetensors, RejectsReversedOffsets) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "U8", "[0]", 4, 0) + "}", "abcd")),
             "tensor 'a': data_offsets [4, 0] are reversed");
}

TEST_F(Safetensors, RejectsOffsetsOutOfDataSection) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F32", "[2]", 0, 8) + "}", "abcd")),
             "tensor 'a': data_offsets [0, 8] are out of the data section, which holds 4 bytes");
}

TEST_F(Safetensors, RejectsOverlappingTensors) {
  const std::string h = "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}";
  EXPECT_HAS(load_error(file_bytes(h, std::string(12, 'x'))),
             "tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap");
}

TEST_F(Safetensors, RejectsGapBetweenTensors) {
  // Listed in the header in the other order: order of offsets is what counts.
  const std::string h = "{" + entry("z", "F32", "[1]", 12, 16) + "," + entry("y", "F64", "[1]", 0, 8) + "}";
  EXPECT_HAS(load_error(file_bytes(h, std::string(16, 'x'))), "bytes [8, 12) between tensors 'y' and 'z'");
}

TEST_F(Safetensors, RejectsGapBeforeFirstTensor) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F32", "[1]", 4, 8) + "}", std::string(8, 'x'))),
             "bytes [0, 4) before the first tensor 'a'");
}

TEST_F(Safetensors, RejectsBytesAfterLastTensor) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F32", "[1]", 0, 4) + "}", std::string(6, 'x'))),
             "bytes [4, 6) after the last tensor 'a'");
}

TEST_F(Safetensors, RejectsDataWithoutTensors) {
  EXPECT_HAS(load_error(file_bytes(R"({"__metadata__":{}})", "xyz")), "holds 3 bytes but the header has no tensors");
}

TEST_F(Safetensors, RejectsDuplicateTensorName) {
  const std::string h = "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 4, 8) + "}";
  EXPECT_HAS(load_error(file_bytes(h, std::string(8, 'x'))), "tensor name 'a' appears twice in the header");
}

TEST_F(Safetensors, RejectsDuplicateKeyInEntry) {
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", "abcd")),
             "key 'dtype' appears twice in the entry 'a'");
}

TEST_F(Safetensors, RejectsMetadataThatIsNotAnObject) {
  EXPECT_HAS(load_error(file_bytes(R"({"__metadata__":["pt"]})", "")),
             "\"__metadata__\" must be an object of strings, got array");
}

TEST_F(Safetensors, RejectsMetadataValueThatIsNotAString) {
  EXPECT_HAS(load_error(file_bytes(R"({"__metadata__":{"format":"pt","epoch":3}})", "")),
             "\"__metadata__\" value of key 'epoch' must be a string, got 3");
}

TEST_F(Safetensors, RejectsBoolByteOtherThanZeroOrOne) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("m", "BOOL", "[3]", 0, 3) + "}", std::string("\x01\x00\x02", 3))),
             "tensor 'm' (BOOL) holds byte 2 at element 2");
}

// An empty tensor's other dimensions are not bounded by its bytes, but its strides are
// their product in int64_t: the shape must be refused before a tensor is made from it.
TEST_F(Safetensors, RejectsEmptyTensorWhoseOtherDimensionsOverflow) {
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "F32", "[4611686018427387904,4,0]", 0, 0) + "}", "")),
             "tensor 'a': empty tensor of shape [4611686018427387904, 4, 0] is too large: its non-zero dimensions "
             "multiply to more than 2^63 - 1");
  EXPECT_HAS(load_error(file_bytes("{" + entry("a", "U8", "[0,9223372036854775807,2]", 0, 0) + "}", "")),
             "is too large");
  // Up to 2^63 - 1 (here 2^62) it is an ordinary empty tensor.
  write_bytes(path_, file_bytes("{" + entry("a", "U8", "[0,2305843009213693952,2]", 0, 0) + "}", ""));
  const Tensor a = mt::load_safetensors(path_).tensors.at("a");
  EXPECT_EQ(a.shape(), (mt::Shape{0, 2305843009213693952, 2}));
  EXPECT_EQ(a.numel(), 0);
}

// Messages print the offending value, and printing recurses once per level: a header nested
// 100,000 deep must be refused before anything prints it.
TEST_F(Safetensors, RejectsHeaderNestedTooDeep) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", "")),
             "safetensors header nests deeper than 64 levels (a valid header nests 3)");
  // 64 levels are parsed, and refused for what they hold.
  const std::string ok = std::string(62, '[') + std::string(62, ']');
  EXPECT_HAS(load_error(file_bytes(R"({"a":{"dtype":"F32","shape":)" + ok + R"(,"data_offsets":[0,0]}})", "")),
             "\"shape\" must be an array of integers, got [[[");
}

TEST_F(Safetensors, RejectsMissingFileAndDirectory) {
  EXPECT_HAS(load_error_of(dir_ + "/absent.safetensors"), "No such file or directory");
  EXPECT_HAS(load_error_of(dir_), "not a regular file");
}

// ---------------------------------------------------------------- atomic writes

TEST_F(Safetensors, SaveLeavesNoTemporaryFile) {
  mt::save_safetensors(path_, {{"w", mt::ones({4})}});
  mt::save_safetensors(path_, {{"w", mt::zeros({4})}});
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(Safetensors, SaveIntoMissingDirectoryFailsAndCreatesNothing) {
  const std::string missing = dir_ + "/no_such_dir/model.safetensors";
  const std::string msg = save_error(missing, {{"w", mt::ones({4})}});
  EXPECT_HAS(msg, "cannot create temporary file");
  EXPECT_HAS(msg, "No such file or directory");
  EXPECT_TRUE(dir_entries(dir_).empty());
}

TEST_F(Safetensors, FailedSaveKeepsExistingFile) {
  mt::save_safetensors(path_, {{"kept", mt::ones({3})}});
  const std::string before = read_bytes(path_);
  // A directory where the temporary file must go makes creating it fail.
  const std::string blocker = path_ + ".tmp." + std::to_string(::getpid());
  ASSERT_TRUE(fs::create_directory(blocker));
  EXPECT_HAS(save_error(path_, {{"new", mt::zeros({5})}}), "Is a directory");
  EXPECT_TRUE(fs::is_directory(blocker)) << "the writer must not remove what it did not create";
  fs::remove(blocker);
  EXPECT_EQ(read_bytes(path_), before);
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(Safetensors, WriteErrorMidFileRemovesTemporaryAndKeepsExistingFile) {
  mt::save_safetensors(path_, {{"kept", mt::ones({3})}});
  const std::string before = read_bytes(path_);
  // Cap the file size this process may write: the 1 MiB tensor fails with EFBIG part way through.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    mt::save_safetensors(path_, {{"big", mt::zeros({256, 1024})}});
  } catch (const mt::FileError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_HAS(msg, path_ + ": cannot save safetensors file: ");
  EXPECT_HAS(msg, "File too large");
  EXPECT_EQ(read_bytes(path_), before);
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(Safetensors, SaveRejectsReservedEmptyAndUndefinedNames) {
  EXPECT_HAS(save_error(path_, {{"__metadata__", mt::ones({1})}}), "\"__metadata__\" is reserved");
  EXPECT_HAS(save_error(path_, {{"", mt::ones({1})}}), "a tensor has an empty name");
  EXPECT_HAS(save_error(path_, {{"w", Tensor()}}), "tensor 'w' is undefined");
  EXPECT_HAS(save_error(path_, {{"bad\xff", mt::ones({1})}}), "not valid UTF-8");
  EXPECT_TRUE(dir_entries(dir_).empty());
}

}  // namespace
