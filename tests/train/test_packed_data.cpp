// PackedTokenData (train/data_source.h): packed rows carry positions and segments, the padded
// layout feeds the same examples one per row without them, describe() says how the examples
// were packed, and the data position survives a checkpoint's round trip.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/data/token_file.h"
#include "train/data_source.h"

namespace mt::train {
namespace {

class PackedData : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ =
        (std::filesystem::temp_directory_path() / ("mt_packed_data_" + std::to_string(::getpid()) + ".tok")).string();
    // 40 examples of 3 to 9 tokens: a prompt token (mask 0), then completion tokens (mask 1);
    // example 7 is 40 tokens long, more than seq_len + 1.
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<uint64_t> starts;
    for (uint32_t e = 0; e < 40; ++e) {
      starts.push_back(tokens.size());
      const uint32_t n = e == 7 ? 40 : 3 + (e * 5) % 7;
      for (uint32_t j = 0; j < n; ++j) {
        tokens.push_back(1 + (e * 13 + j) % 90);
        mask.push_back(j > 0);
      }
    }
    data::write_token_file(path_, tokens, mask, starts, /*vocab_size=*/100);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string path_;
};

TEST_F(PackedData, PackedRowsCarryPositionsAndSegments) {
  PackedTokenData data(path_, data::BatcherOptions(2, 16).seed(3));
  const Batch batch = data.next();
  ASSERT_TRUE(batch.positions.defined());
  ASSERT_TRUE(batch.segments.defined());
  EXPECT_EQ(batch.inputs.shape(), (Shape{2, 16}));
  EXPECT_EQ(batch.positions.shape(), (Shape{2, 16}));
  EXPECT_EQ(batch.segments.shape(), (Shape{2, 16}));
  EXPECT_EQ(batch.count, count_targets(batch.targets));
  EXPECT_GT(batch.count, 0);
  const auto segments = batch.segments.to_vector<int64_t>();
  EXPECT_GT(segments[15], 0) << "a row of 16 positions holds more than one example of at most 8";
}

TEST_F(PackedData, PaddedLayoutFeedsTheSameExamplesOnePerRow) {
  PackedTokenData packed(path_, data::BatcherOptions(2, 16).seed(3));
  PackedTokenData padded(path_, data::BatcherOptions(2, 16).seed(3), PackedLayout::padded);
  for (int step = 0; step < 4; ++step) {
    const Batch a = packed.next(), b = padded.next();
    EXPECT_FALSE(b.positions.defined());
    EXPECT_FALSE(b.segments.defined());
    EXPECT_EQ(b.inputs.size(1), 16);
    const auto segments = a.segments.to_vector<int64_t>();
    const auto targets = a.targets.to_vector<int64_t>();
    // The packed rows' real examples: the segments of each row below its padding tail's id.
    int64_t examples = 0;
    for (int64_t row = 0; row < 2; ++row) {
      const int64_t last = segments[static_cast<size_t>(row * 16 + 15)];
      const bool padded_tail = targets[static_cast<size_t>(row * 16 + 15)] == -100 &&
                               a.inputs.to_vector<int64_t>()[static_cast<size_t>(row * 16 + 15)] == 0;
      examples += padded_tail ? last : last + 1;
    }
    EXPECT_EQ(b.inputs.size(0), examples) << "step " << step;
    EXPECT_EQ(b.count, a.count);
    EXPECT_EQ(count_targets(b.targets), a.count);
  }
}

TEST_F(PackedData, DescribeSaysHowTheExamplesArePacked) {
  PackedTokenData data(path_, data::BatcherOptions(2, 16));
  const std::string text = data.describe();
  const int64_t rows = data.batcher().rows_per_epoch(0);
  EXPECT_NE(
      text.find("40 examples (" + std::to_string(data.batcher().num_tokens()) + " tokens) in " + path_ + ", packed "),
      std::string::npos)
      << text;
  EXPECT_NE(text.find(" per row into " + std::to_string(rows) + " rows of 16 per epoch ("), std::string::npos) << text;
  EXPECT_NE(text.find("% filled, 1 truncated)"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(data.batcher().batches_per_epoch(0)) + " batches of 2 rows per epoch and rank"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loss mask: "), std::string::npos) << text;
}

TEST_F(PackedData, StateRoundTripsThroughACheckpointsMap) {
  PackedTokenData a(path_, data::BatcherOptions(2, 16).seed(5));
  for (int i = 0; i < 3; ++i) a.next();
  PackedTokenData b(path_, data::BatcherOptions(2, 16).seed(5));
  b.restore(a.state());
  for (int i = 0; i < 6; ++i) {
    const Batch x = a.next(), y = b.next();
    EXPECT_EQ(x.inputs.to_vector<int64_t>(), y.inputs.to_vector<int64_t>()) << i;
    EXPECT_EQ(x.positions.to_vector<int64_t>(), y.positions.to_vector<int64_t>()) << i;
  }
  std::map<std::string, double> missing = a.state();
  missing.erase("index");
  EXPECT_THROW(b.restore(missing), FileError);
}

}  // namespace
}  // namespace mt::train
