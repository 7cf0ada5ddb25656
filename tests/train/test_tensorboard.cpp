// TensorBoard event files (train/tensorboard.h) and their CRC-32C framing (train/crc32c.h).
// The writer's output is read back by our own reader here; tensorboard_check.py checks the same files
// with TensorBoard's reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/crc32c.h"
#include "train/tensorboard.h"

namespace fs = std::filesystem;
using mt::train::crc32c;
using mt::train::ScalarEvent;
using mt::train::TensorBoardWriter;

namespace {

#define MT_SKIP_WITHOUT_TENSORBOARD()                                                           \
  do {                                                                                          \
    if (!::mt::train::tensorboard_available()) {                                                \
      GTEST_SKIP() << "this build has no protobuf (libprotobuf-dev, protobuf-compiler), so no " \
                      "TensorBoard event files";                                                \
    }                                                                                           \
  } while (0)

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("mt_tensorboard_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir.string();
}

// The byte offset of each record of a well-formed event file (from the length fields alone).
std::vector<size_t> record_offsets(const std::string& bytes) {
  std::vector<size_t> offsets;
  for (size_t at = 0; at + 12 <= bytes.size();) {
    offsets.push_back(at);
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    at += 12 + length + 4;
  }
  return offsets;
}

// The FileError message of reading `path`'s scalars, or "(no error)".
std::string read_error(const std::string& path) {
  try {
    mt::train::read_tensorboard_scalars(path);
  } catch (const mt::FileError& e) {
    return e.what();
  }
  return "(no error)";
}

// Writes three events (steps 1-3 of "loss") and closes the file: records 0 (version) to 3.
std::string three_step_file(const std::string& dir) {
  TensorBoardWriter writer(dir);
  for (int step = 1; step <= 3; ++step) writer.add_scalar("loss", 1.0 / step, step, 1.7e9 + step);
  writer.close();
  return writer.path();
}

}  // namespace

// RFC 3720 (iSCSI) B.4 vectors and the customary check value.
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("a"), 0xC1D04330u);
}

// The 8-byte fast path and the byte loop agree: any split of a message gives the CRC of the whole.
TEST(Crc32c, ExtendOverAnySplitEqualsTheWhole) {
  std::string text;
  for (int i = 0; i < 77; ++i) text.push_back(static_cast<char>((i * 37 + 11) & 0xFF));
  const uint32_t whole = crc32c(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const uint32_t head = crc32c(text.data(), cut);
    EXPECT_EQ(mt::train::crc32c_extend(head, text.data() + cut, text.size() - cut), whole) << "cut at " << cut;
  }
}

TEST(Crc32c, MaskIsTFRecordsRotationAndOffset) {
  EXPECT_EQ(mt::train::mask_crc32c(0), 0xa282ead8u);
  const uint32_t crc = crc32c("123456789");
  EXPECT_EQ(mt::train::mask_crc32c(crc), static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
  for (uint32_t v : {0u, 1u, 0x80000000u, 0xFFFFFFFFu, crc}) {
    EXPECT_EQ(mt::train::unmask_crc32c(mt::train::mask_crc32c(v)), v);
  }
  EXPECT_EQ(mt::train::masked_crc32c("123456789", 9), mt::train::mask_crc32c(crc));
}

// Values come back as TensorBoard stores them: simple_value is a float, so each value is the double
// given rounded to the nearest float (exactly static_cast<float>); steps and wall times are exact.
TEST(TensorBoardWriter, ScalarsReadBackInFileOrder) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("scalars");
  std::vector<ScalarEvent> want;
  std::string path;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    const std::vector<std::string> tags = {"loss", "lr", "grad_norm", "val/loss"};
    for (int64_t step = 1; step <= 5; ++step) {
      for (size_t t = 0; t < tags.size(); ++t) {
        if (tags[t] == "val/loss" && step % 2 == 0) continue;
        const double value = (t + 1) * 0.1 / static_cast<double>(step) + 1e-9;  // not a float
        const double wall_time = 1712345678.123456 + step * 0.25;
        writer.add_scalar(tags[t], value, step, wall_time);
        want.push_back({tags[t], step, wall_time, static_cast<float>(value)});
      }
    }
    writer.add_scalar("big_step", -3.5e38, int64_t{1} << 40, 0.5);
    want.push_back({"big_step", int64_t{1} << 40, 0.5, static_cast<float>(-3.5e38)});
    writer.flush();
    // Readable while the writer is still open, as TensorBoard reads a running job's file.
    EXPECT_EQ(mt::train::read_tensorboard_scalars(path).size(), want.size());
  }
  const std::vector<ScalarEvent> got = mt::train::read_tensorboard_scalars(path);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tag, want[i].tag) << "scalar " << i;
    EXPECT_EQ(got[i].step, want[i].step) << "scalar " << i;
    EXPECT_EQ(got[i].wall_time, want[i].wall_time) << "scalar " << i;
    EXPECT_EQ(got[i].value, want[i].value) << "scalar " << i;
  }
  EXPECT_TRUE(mt::train::read_tensorboard_start_steps(path).empty());
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, NonFiniteValuesSurvive) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("nonfinite");
  TensorBoardWriter writer(dir);
  writer.add_scalar("loss", std::numeric_limits<double>::quiet_NaN(), 1, 1.0);
  writer.add_scalar("loss", std::numeric_limits<double>::infinity(), 2, 2.0);
  writer.add_scalar("loss", 1e300, 3, 3.0);  // beyond float: rounds to inf
  writer.close();
  const std::vector<ScalarEvent> got = mt::train::read_tensorboard_scalars(writer.path());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(std::isnan(got[0].value));
  EXPECT_EQ(got[1].value, std::numeric_limits<float>::infinity());
  EXPECT_EQ(got[2].value, std::numeric_limits<float>::infinity());
  fs::remove_all(dir);
}

// events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>, in a directory made on demand; a later
// writer's file sorts after an earlier one's even within the same second.
TEST(TensorBoardWriter, FileNamesFollowTensorBoardAndSortInWritingOrder) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("names") + "/nested/run";
  std::string first, second;
  {
    TensorBoardWriter a(dir);
    TensorBoardWriter b(dir);
    first = a.path();
    second = b.path();
  }
  const std::regex pattern(R"(events\.out\.tfevents\.(\d{10})\..+\.(\d+)\.(\d+))");
  std::smatch m;
  const std::string name = fs::path(first).filename().string();
  ASSERT_TRUE(std::regex_match(name, m, pattern)) << name;
  EXPECT_EQ(m[2].str(), std::to_string(::getpid()));
  EXPECT_EQ(fs::path(first).parent_path(), fs::path(dir));
  EXPECT_LT(fs::path(first).filename().string(), fs::path(second).filename().string());
  fs::remove_all(fresh_dir("names"));
}

// Note [Resumed runs in TensorBoard]: a resumed writer's file starts with a SessionLog START at the
// first step it will log, and sorts after the interrupted run's file.
TEST(TensorBoardWriter, ResumeStepWritesASessionStart) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("resume");
  TensorBoardWriter first(dir);
  for (int step = 1; step <= 8; ++step) first.add_scalar("loss", step, step, step);
  first.close();
  TensorBoardWriter resumed(dir, /*resume_step=*/7);
  for (int step = 7; step <= 9; ++step) resumed.add_scalar("loss", step, step, step);
  resumed.close();

  EXPECT_TRUE(mt::train::read_tensorboard_start_steps(first.path()).empty());
  EXPECT_EQ(mt::train::read_tensorboard_start_steps(resumed.path()), std::vector<int64_t>{7});
  EXPECT_EQ(mt::train::read_tensorboard_scalars(resumed.path()).size(), 3u);
  EXPECT_LT(fs::path(first.path()).filename().string(), fs::path(resumed.path()).filename().string());
  EXPECT_THROW(TensorBoardWriter(dir, -1), mt::Error);
  fs::remove_all(dir);
}

TEST(TensorBoardReader, FlippedDataByteNamesFileRecordAndOffset) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("flip");
  const std::string path = three_step_file(dir);
  std::string bytes = read_bytes(path);
  const std::vector<size_t> offsets = record_offsets(bytes);
  ASSERT_EQ(offsets.size(), 4u);
  bytes[offsets[2] + 12 + 3] ^= 0x10;  // inside record 2's data
  write_bytes(path, bytes);
  const std::string message = read_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("record 2 at byte " + std::to_string(offsets[2])), std::string::npos) << message;
  EXPECT_NE(message.find("data CRC mismatch"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(TensorBoardReader, FlippedLengthByteIsALengthCrcMismatch) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("flip_length");
  const std::string path = three_step_file(dir);
  std::string bytes = read_bytes(path);
  const std::vector<size_t> offsets = record_offsets(bytes);
  bytes[offsets[1]] ^= 0x01;
  write_bytes(path, bytes);
  const std::string message = read_error(path);
  EXPECT_NE(message.find("record 1 at byte " + std::to_string(offsets[1]) + ": length CRC mismatch"), std::string::npos)
      << message;
  fs::remove_all(dir);
}

TEST(TensorBoardReader, TruncatedFileNamesTheCutRecord) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("truncated");
  const std::string path = three_step_file(dir);
  const std::string bytes = read_bytes(path);
  const std::vector<size_t> offsets = record_offsets(bytes);
  // Cut inside the last record's data, and inside its header.
  for (const size_t keep : {bytes.size() - 6, offsets[3] + 5}) {
    write_bytes(path, bytes.substr(0, keep));
    const std::string message = read_error(path);
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("record 3 at byte " + std::to_string(offsets[3]) + ": truncated record"), std::string::npos)
        << message;
  }
  fs::remove_all(dir);
}

// Framing and CRCs intact, but the data is no event.
TEST(TensorBoardReader, UnparsableEventIsReported) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("unparsable");
  const std::string path = three_step_file(dir);
  const std::string data = "\xff\xff\xff";
  std::string record(12, '\0');
  record[0] = static_cast<char>(data.size());
  const uint32_t length_crc = mt::train::masked_crc32c(record.data(), 8);
  const uint32_t data_crc = mt::train::masked_crc32c(data.data(), data.size());
  for (int i = 0; i < 4; ++i) record[8 + i] = static_cast<char>(length_crc >> (8 * i));
  record += data;
  for (int i = 0; i < 4; ++i) record.push_back(static_cast<char>(data_crc >> (8 * i)));
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes + record);
  const std::string message = read_error(path);
  EXPECT_NE(message.find("record 4 at byte " + std::to_string(bytes.size()) + ": the 3-byte event does not parse"),
            std::string::npos)
      << message;
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, UncreatableDirectoryAndClosedWriterAreFileErrors) {
  MT_SKIP_WITHOUT_TENSORBOARD();
  const std::string dir = fresh_dir("errors");
  fs::create_directories(dir);
  const std::string blocker = dir + "/a_file";
  write_bytes(blocker, "x");
  // A path below a regular file cannot be created, even by root.
  const std::string message = error_message_of([&] { TensorBoardWriter writer(blocker + "/tb"); });
  EXPECT_NE(message.find(blocker + "/tb: cannot create the TensorBoard directory"), std::string::npos) << message;
  EXPECT_THROW(TensorBoardWriter(blocker + "/tb"), mt::FileError);

  TensorBoardWriter writer(dir);
  writer.close();
  writer.close();  // a second close does nothing
  EXPECT_THROW(writer.add_scalar("loss", 1, 1, 1), mt::FileError);
  EXPECT_THROW(mt::train::read_tensorboard_scalars(dir + "/missing"), mt::FileError);
  fs::remove_all(dir);
}

// A build without protobuf says what to install instead of writing nothing.
TEST(TensorBoardWriter, WithoutProtobufSaysWhatToInstall) {
  if (mt::train::tensorboard_available()) GTEST_SKIP() << "this build has protobuf; the error path is not reachable";
  const std::string message = error_message_of([] { TensorBoardWriter writer(fresh_dir("none")); });
  EXPECT_NE(message.find("install libprotobuf-dev and protobuf-compiler and configure again"), std::string::npos)
      << message;
  EXPECT_THROW(mt::train::read_tensorboard_scalars("x"), mt::Error);
}
