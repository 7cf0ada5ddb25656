// Bad files as users come by them, given to the core readers: a safetensors file cut short by
// a copy or a download, and a file of another kind under a .safetensors name. Each error must
// start with the path and say what is wrong; the reader's other refusals, one per malformed
// field, are in test_safetensors.cpp and test_data.cpp.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

class BadInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "mt_bad_inputs_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    path_ = dir_ + "/model.safetensors";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The FileError of loading path_, which must start with the path.
  std::string load_error() {
    try {
      mt::load_safetensors(path_);
    } catch (const mt::FileError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path_ + ": ", 0), 0u) << "message does not start with the path: " << msg;
      return msg;
    }
    return "(no FileError)";
  }

  std::string dir_, path_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(BadInputs, TruncatedSafetensorsFileNamesTheTensorAndTheBytesLeft) {
  mt::save_safetensors(path_, {{"a", mt::ones({64})}, {"b", mt::ones({64})}});  // 256 bytes each
  const std::string bytes = read_bytes(path_);
  write_bytes(path_, bytes.substr(0, bytes.size() - 100));
  const std::string msg = load_error();
  EXPECT_TRUE(contains(msg, "tensor 'b': data_offsets [256, 512] are out of the data section, which holds 412 bytes"))
      << msg;
}

// A text file (or a PyTorch .bin, a zip) read as safetensors: its first 8 bytes, taken as the
// header length, are far beyond any real header.
TEST_F(BadInputs, TextFileNamedSafetensorsIsRefusedByItsHeaderLength) {
  write_bytes(path_, "the licence grants permission to copy and distribute the work.\n");
  EXPECT_TRUE(contains(load_error(), "safetensors header length 7305798933645977716 exceeds the limit")) << path_;
  write_bytes(path_, std::string("PK\x03\x04\x14\x00\x00\x00\x08\x00", 10) + std::string(100, 'z'));
  EXPECT_TRUE(contains(load_error(), "exceeds the limit of 100000000 bytes")) << path_;
}

}  // namespace

namespace {

// Error messages quote file content; every byte that is not printable UTF-8 comes out as \xNN.
TEST(PrintableMessages, EscapesWhatIsNotPrintableUtf8AndKeepsTheRest) {
  EXPECT_EQ(mt::printable("plain ascii, tab\tand\nnewline"), "plain ascii, tab\tand\nnewline");
  EXPECT_EQ(mt::printable("caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80");
  EXPECT_EQ(mt::printable(std::string("a\xff") + "b"), "a\\xffb");
  EXPECT_EQ(mt::printable("\x1b[31m"), "\\x1b[31m");  // a terminal escape
  EXPECT_EQ(mt::printable(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(mt::printable("\xc3"), "\\xc3");                             // a sequence cut short
  EXPECT_EQ(mt::printable("\xc0\xaf"), "\\xc0\\xaf");                    // an overlong '/'
  EXPECT_EQ(mt::printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a UTF-16 surrogate
  EXPECT_EQ(mt::printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
}

TEST(PrintableMessages, EveryErrorMessageIsPrintable) {
  const mt::FileError error("model.safetensors: bad name 'x\xff\x01'");
  EXPECT_STREQ(error.what(), "model.safetensors: bad name 'x\\xff\\x01'");
}

}  // namespace
