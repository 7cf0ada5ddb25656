// Contracts of core/data/packed_batcher.h: hand-built examples packed into exactly the rows
// the header describes (inputs, targets, positions, segments, padding), masked targets
// ignored, long examples truncated and one-token ones skipped, every example once per epoch
// over all ranks, the rank split, the order shared with TokenBatcher, exact resume, the
// padded one-example-per-row layout against the packed one, and the errors for data that
// cannot be packed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/data/packed_batcher.h"
#include "core/data/token_corpus.h"
#include "core/data/token_dataset.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using mt::data::BatcherOptions;
using mt::data::BatcherState;
using mt::data::PackedBatch;
using mt::data::PackedBatcher;
using mt::data::TokenCorpus;
using mt::data::TokenFile;

constexpr int64_t kIgnore = mt::data::kIgnoreTarget;
constexpr int64_t kVocab = 65536;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<int64_t> values(const mt::Tensor& t) { return t.to_vector<int64_t>(); }

class PackedBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "mt_packed_batcher_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A file of these examples, one after another, with their starts (and a mask when given).
  std::string write_examples(const std::string& name, const std::vector<std::vector<uint32_t>>& examples,
                             const std::vector<std::vector<uint8_t>>& masks = {}) {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<uint64_t> starts;
    for (size_t e = 0; e < examples.size(); ++e) {
      starts.push_back(tokens.size());
      tokens.insert(tokens.end(), examples[e].begin(), examples[e].end());
      if (!masks.empty()) mask.insert(mask.end(), masks[e].begin(), masks[e].end());
    }
    mt::data::write_token_file(path(name), tokens, mask, starts, kVocab);
    return path(name);
  }

  // `n` examples of lengths 1 + (e * 7) % max_len tokens, each token its own position in the
  // file, so an example is known by its first input token (its start).
  std::string write_numbered(const std::string& name, int64_t n, int64_t max_len) {
    std::vector<std::vector<uint32_t>> examples;
    uint32_t next = 0;
    for (int64_t e = 0; e < n; ++e) {
      std::vector<uint32_t> example(static_cast<size_t>(1 + (e * 7) % max_len));
      for (auto& t : example) t = next++;
      examples.push_back(std::move(example));
    }
    return write_examples(name, examples);
  }

  std::string dir_;
};

TEST_F(PackedBatcherTest, PacksExamplesNextFitIntoExactRows) {
  // Examples of 3, 4, 5 and 2 tokens take 2, 3, 4 and 1 positions: rows of 6 hold {A, B} and {C, D}.
  const TokenFile file(write_examples("a.tok", {{10, 11, 12}, {20, 21, 22, 23}, {30, 31, 32, 33, 34}, {40, 41}}));
  PackedBatcher batcher(file, BatcherOptions(1, 6).shuffle(false));
  EXPECT_EQ(batcher.num_examples(), 4);
  EXPECT_EQ(batcher.num_positions(), 10);
  EXPECT_EQ(batcher.rows_per_epoch(0), 2);
  EXPECT_EQ(batcher.batches_per_epoch(0), 2);
  EXPECT_DOUBLE_EQ(batcher.fill(0), 10.0 / 12.0);

  const PackedBatch first = batcher.next();
  EXPECT_EQ(values(first.inputs), (std::vector<int64_t>{10, 11, 20, 21, 22, 0}));
  EXPECT_EQ(values(first.targets), (std::vector<int64_t>{11, 12, 21, 22, 23, kIgnore}));
  EXPECT_EQ(values(first.positions), (std::vector<int64_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(values(first.segments), (std::vector<int64_t>{0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(first.inputs.shape(), (mt::Shape{1, 6}));
  EXPECT_EQ(first.inputs.dtype(), mt::DType::i64);
  EXPECT_EQ(first.count, 5);
  EXPECT_EQ(first.examples, 2);
  EXPECT_EQ(first.examples_per_row, (std::vector<int64_t>{2}));
  EXPECT_EQ(first.epoch, 0);
  EXPECT_EQ(first.step, 0);

  const PackedBatch second = batcher.next();
  EXPECT_EQ(values(second.inputs), (std::vector<int64_t>{30, 31, 32, 33, 40, 0}));
  EXPECT_EQ(values(second.targets), (std::vector<int64_t>{31, 32, 33, 34, 41, kIgnore}));
  EXPECT_EQ(values(second.positions), (std::vector<int64_t>{0, 1, 2, 3, 0, 0}));
  EXPECT_EQ(values(second.segments), (std::vector<int64_t>{0, 0, 0, 0, 1, 2}));
  EXPECT_EQ(second.step, 1);
  EXPECT_EQ(batcher.next().epoch, 1);  // the epoch ended after two batches
}

TEST_F(PackedBatcherTest, AFullRowHasNoPaddingAndPaddingPositionsCountFromZero) {
  // Rows of 4: {5 tokens} fills one, then {2 tokens} leaves 3 positions of padding.
  const TokenFile file(write_examples("a.tok", {{1, 2, 3, 4, 5}, {6, 7}}));
  PackedBatcher batcher(file, BatcherOptions(2, 4).shuffle(false));
  const PackedBatch batch = batcher.next();
  EXPECT_EQ(values(batch.inputs), (std::vector<int64_t>{1, 2, 3, 4, 6, 0, 0, 0}));
  EXPECT_EQ(values(batch.targets), (std::vector<int64_t>{2, 3, 4, 5, 7, kIgnore, kIgnore, kIgnore}));
  EXPECT_EQ(values(batch.positions), (std::vector<int64_t>{0, 1, 2, 3, 0, 0, 1, 2}));
  EXPECT_EQ(values(batch.segments), (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batch.examples_per_row, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(batch.count, 5);
}

TEST_F(PackedBatcherTest, MaskedTargetsBecomeTheIgnoreIndexAndAreNotCounted) {
  // Each example: a prompt of two tokens (mask 0), then a completion (mask 1). The target of
  // position j is token j + 1, masked by that token's own byte.
  const TokenFile file(write_examples("a.tok", {{10, 11, 12, 13}, {20, 21, 22}}, {{0, 0, 1, 1}, {0, 0, 1}}));
  PackedBatcher batcher(file, BatcherOptions(1, 8).shuffle(false));
  const PackedBatch batch = batcher.next();
  EXPECT_EQ(values(batch.inputs), (std::vector<int64_t>{10, 11, 12, 20, 21, 0, 0, 0}));
  EXPECT_EQ(values(batch.targets), (std::vector<int64_t>{kIgnore, 12, 13, kIgnore, 22, kIgnore, kIgnore, kIgnore}));
  EXPECT_EQ(batch.count, 3);
}

TEST_F(PackedBatcherTest, TruncatesLongExamplesAndSkipsOneTokenOnes) {
  // T = 4: the 8-token example is cut to its first 5; the 5-token one fits exactly; [99] is skipped.
  const TokenFile file(write_examples("a.tok", {{1, 2, 3, 4, 5, 6, 7, 8}, {99}, {11, 12, 13, 14, 15}, {21, 22}}));
  PackedBatcher batcher(file, BatcherOptions(1, 4).shuffle(false));
  EXPECT_EQ(batcher.num_examples(), 4);
  EXPECT_EQ(batcher.num_truncated(), 1);
  EXPECT_EQ(batcher.num_skipped(), 1);
  EXPECT_EQ(batcher.num_positions(), 4 + 4 + 1);
  EXPECT_EQ(batcher.rows_per_epoch(0), 3);
  const PackedBatch a = batcher.next();
  EXPECT_EQ(values(a.inputs), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(values(a.targets), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(values(a.positions), (std::vector<int64_t>{0, 1, 2, 3}));
  const PackedBatch b = batcher.next();
  EXPECT_EQ(values(b.inputs), (std::vector<int64_t>{11, 12, 13, 14}));
  EXPECT_EQ(values(b.targets), (std::vector<int64_t>{12, 13, 14, 15}));
  const PackedBatch c = batcher.next();
  EXPECT_EQ(values(c.inputs), (std::vector<int64_t>{21, 0, 0, 0}));
  EXPECT_EQ(c.examples, 1);
  for (const auto& row : batcher.epoch_rows(0)) {
    EXPECT_EQ(std::count(row.examples.begin(), row.examples.end(), 1), 0) << "the one-token example was packed";
  }
}

TEST_F(PackedBatcherTest, EveryExampleOncePerEpochAcrossRanksInTheRowsEachRankTakes) {
  const std::string file_path = write_numbered("a.tok", 300, 20);
  const TokenFile file(file_path);
  const int64_t W = 3, B = 2, T = 24;
  std::vector<PackedBatcher> ranks;
  for (int64_t r = 0; r < W; ++r) ranks.emplace_back(file, BatcherOptions(B, T).seed(5).rank(r).world_size(W));
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<mt::data::PackedRow> rows = ranks[0].epoch_rows(epoch);
    // The packing holds every example of two tokens or more exactly once.
    std::multiset<int64_t> packed;
    for (const auto& row : rows) packed.insert(row.examples.begin(), row.examples.end());
    std::multiset<int64_t> expected;
    for (int64_t e = 0; e < ranks[0].num_examples(); ++e) {
      const auto ref = ranks[0].example(e);
      if (ref.end - ref.start >= 2) expected.insert(e);
    }
    EXPECT_EQ(packed, expected) << "epoch " << epoch;

    // Rank r's batch s, row b is packed row r + (s * B + b) * W: its examples' first tokens.
    const int64_t batches = ranks[0].batches_per_epoch(epoch);
    ASSERT_EQ(batches, static_cast<int64_t>(rows.size()) / W / B);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < W; ++r) {
      ASSERT_EQ(ranks[static_cast<size_t>(r)].batches_per_epoch(epoch), batches);
      for (int64_t s = 0; s < batches; ++s) {
        const PackedBatch batch = ranks[static_cast<size_t>(r)].next();
        ASSERT_EQ(batch.epoch, epoch);
        ASSERT_EQ(batch.step, s);
        const auto inputs = values(batch.inputs), positions = values(batch.positions), segs = values(batch.segments);
        for (int64_t b = 0; b < B; ++b) {
          std::vector<int64_t> starts;
          for (int64_t t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(b * T + t);
            if (positions[i] == 0 && segs[i] < batch.examples_per_row[static_cast<size_t>(b)]) {
              starts.push_back(inputs[i]);
            }
          }
          std::vector<int64_t> want;
          for (int64_t e : rows[static_cast<size_t>(r + (s * B + b) * W)].examples)
            want.push_back(ranks[0].example(e).start);
          EXPECT_EQ(starts, want) << "rank " << r << " step " << s << " row " << b;
          for (int64_t start : starts) EXPECT_TRUE(seen.insert(start).second) << "example at " << start << " twice";
        }
      }
    }
    // Together the ranks saw every example of the rows that make whole batches, and only those.
    std::set<int64_t> used;
    for (int64_t r = 0; r < batches * B * W; ++r) {
      for (int64_t e : rows[static_cast<size_t>(r)].examples) used.insert(ranks[0].example(e).start);
    }
    EXPECT_EQ(seen, used);
    EXPECT_GE(seen.size() + static_cast<size_t>(W * B * T), packed.size());  // fewer than W * B rows dropped
  }
}

TEST_F(PackedBatcherTest, UnshuffledKeepsCorpusOrderAndShuffledFollowsTokenBatchersOrder) {
  // Examples of two tokens or more, so every example is packed and the packed order is the visiting order.
  std::vector<std::vector<uint32_t>> examples;
  for (uint32_t e = 0; e < 40; ++e) examples.push_back(std::vector<uint32_t>(2 + e % 5, e));
  const TokenFile file(write_examples("a.tok", examples));
  const auto packed_order = [&](const BatcherOptions& options, int64_t epoch) {
    std::vector<int64_t> order;
    for (const auto& row : PackedBatcher(file, options).epoch_rows(epoch)) {
      order.insert(order.end(), row.examples.begin(), row.examples.end());
    }
    return order;
  };
  std::vector<int64_t> ascending(40);
  for (int64_t e = 0; e < 40; ++e) ascending[static_cast<size_t>(e)] = e;
  EXPECT_EQ(packed_order(BatcherOptions(1, 8).shuffle(false), 3), ascending);

  // TokenBatcher over a file of 41 tokens with seq_len 1 has 40 windows: the same permutation.
  mt::data::write_token_file(path("windows.tok"), std::vector<uint16_t>(41, 0), 10);
  const TokenFile windows(path("windows.tok"));
  const mt::data::TokenBatcher token_batcher(windows, BatcherOptions(1, 1).seed(77));
  for (int64_t epoch : {0, 1, 4}) {
    EXPECT_EQ(packed_order(BatcherOptions(1, 8).seed(77), epoch), token_batcher.epoch_order(epoch)) << epoch;
  }
  EXPECT_NE(packed_order(BatcherOptions(1, 8).seed(77), 0), packed_order(BatcherOptions(1, 8).seed(77), 1));
}

TEST_F(PackedBatcherTest, StepsFollowEachEpochsOwnBatchCount) {
  const TokenFile file(write_numbered("a.tok", 120, 30));
  PackedBatcher batcher(file, BatcherOptions(2, 32).seed(3));
  std::set<int64_t> counts;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const int64_t batches = batcher.batches_per_epoch(epoch);
    counts.insert(batches);
    for (int64_t s = 0; s < batches; ++s) {
      const PackedBatch batch = batcher.next();
      ASSERT_EQ(batch.epoch, epoch);
      ASSERT_EQ(batch.step, s);
    }
    EXPECT_EQ(batcher.state().epoch, epoch + 1);
    EXPECT_EQ(batcher.state().index, 0);
    // fill = positions / (rows * T), of the epoch's own rows
    EXPECT_DOUBLE_EQ(batcher.fill(epoch), static_cast<double>(batcher.num_positions()) /
                                              static_cast<double>(batcher.rows_per_epoch(epoch) * 32));
  }
  EXPECT_GE(*counts.begin(), 1);
}

TEST_F(PackedBatcherTest, RestoreContinuesExactlyAsTheUninterruptedRun) {
  const TokenFile file(write_numbered("a.tok", 150, 25));
  const BatcherOptions options = BatcherOptions(2, 20).seed(11).rank(1).world_size(2);
  PackedBatcher straight(file, options);
  const int64_t total = straight.batches_per_epoch(0) + straight.batches_per_epoch(1) + 2;
  std::vector<PackedBatch> expected;
  std::vector<BatcherState> states;
  for (int64_t i = 0; i < total; ++i) {
    states.push_back(straight.state());
    expected.push_back(straight.next());
  }
  for (int64_t from : {int64_t{1}, straight.batches_per_epoch(0), total - 1}) {
    PackedBatcher resumed(file, options);
    resumed.restore(states[static_cast<size_t>(from)]);
    for (int64_t i = from; i < total; ++i) {
      const PackedBatch got = resumed.next();
      const PackedBatch& want = expected[static_cast<size_t>(i)];
      ASSERT_EQ(values(got.inputs), values(want.inputs)) << "from " << from << " batch " << i;
      ASSERT_EQ(values(got.targets), values(want.targets));
      ASSERT_EQ(values(got.positions), values(want.positions));
      ASSERT_EQ(values(got.segments), values(want.segments));
      ASSERT_EQ(got.epoch, want.epoch);
      ASSERT_EQ(got.step, want.step);
      ASSERT_EQ(got.count, want.count);
    }
  }
  PackedBatcher other(file, options);
  const std::string seed = error_message_of([&] { other.restore({0, 0, 12}); });
  EXPECT_TRUE(contains(seed, "the state's seed 12 differs from this batcher's seed 11")) << seed;
  const int64_t batches = other.batches_per_epoch(2);
  const std::string index = error_message_of([&] { other.restore({2, batches, 11}); });
  EXPECT_TRUE(contains(index, "index " + std::to_string(batches) + " is outside [0, batches_per_epoch " +
                                  std::to_string(batches) + ") of epoch 2"))
      << index;
}

TEST_F(PackedBatcherTest, PadEachExampleLaysTheSameExamplesOutOnePerRow) {
  std::vector<std::vector<uint32_t>> examples;
  std::vector<std::vector<uint8_t>> masks;
  for (uint32_t e = 0; e < 60; ++e) {
    std::vector<uint32_t> example;
    std::vector<uint8_t> mask;
    for (uint32_t j = 0; j < 2 + (e * 5) % 13; ++j) {
      example.push_back(100 * e + j);
      mask.push_back(j % 3 != 0);
    }
    examples.push_back(example);
    masks.push_back(mask);
  }
  const TokenFile file(write_examples("a.tok", examples, masks));
  PackedBatcher batcher(file, BatcherOptions(3, 16).seed(9));
  for (int step = 0; step < 3; ++step) {
    const PackedBatch packed = batcher.next();
    const mt::data::Batch padded = mt::data::pad_each_example(packed);
    ASSERT_EQ(padded.inputs.shape(), (mt::Shape{packed.examples, 16}));
    ASSERT_EQ(padded.targets.shape(), (mt::Shape{packed.examples, 16}));
    EXPECT_EQ(padded.count, packed.count);
    EXPECT_EQ(padded.epoch, packed.epoch);
    EXPECT_EQ(padded.step, packed.step);
    const auto in = values(packed.inputs), tg = values(packed.targets), seg = values(packed.segments);
    const auto pin = values(padded.inputs), ptg = values(padded.targets);
    int64_t out_row = 0, counted = 0;
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t s = 0; s < packed.examples_per_row[static_cast<size_t>(b)]; ++s, ++out_row) {
        // The segment's (input, target) pairs, in order, are the start of its padded row.
        std::vector<std::pair<int64_t, int64_t>> want, got;
        for (int64_t t = 0; t < 16; ++t) {
          const size_t i = static_cast<size_t>(b * 16 + t);
          if (seg[i] == s) want.emplace_back(in[i], tg[i]);
        }
        for (int64_t t = 0; t < 16; ++t) {
          const size_t i = static_cast<size_t>(out_row * 16 + t);
          if (t < static_cast<int64_t>(want.size())) {
            got.emplace_back(pin[i], ptg[i]);
          } else {
            EXPECT_EQ(pin[i], 0) << "row " << out_row << " padding at " << t;
            EXPECT_EQ(ptg[i], kIgnore) << "row " << out_row << " padding at " << t;
          }
          counted += ptg[i] != kIgnore;
        }
        EXPECT_EQ(got, want) << "example " << out_row;
        ASSERT_FALSE(want.empty());
        EXPECT_EQ(want.front().first % 100, 0) << "row " << out_row << " does not start at its example's first token";
      }
    }
    EXPECT_EQ(out_row, packed.examples);
    EXPECT_EQ(counted, packed.count);
  }
  PackedBatch broken = batcher.next();
  broken.examples += 1;
  const std::string message = error_message_of([&] { mt::data::pad_each_example(broken); });
  EXPECT_TRUE(contains(message, "examples_per_row sums to")) << message;
}

TEST_F(PackedBatcherTest, PacksTheExamplesOfEveryShardOfACorpus) {
  fs::create_directory(path("shards"));
  write_examples("shards/a.tok", {{1, 2, 3}, {4, 5}});
  write_examples("shards/b.tok", {{6, 7, 8, 9}});
  const TokenCorpus corpus(path("shards"));
  PackedBatcher batcher(corpus, BatcherOptions(1, 16).shuffle(false));
  EXPECT_EQ(batcher.num_examples(), 3);
  EXPECT_EQ(batcher.num_tokens(), 9);
  EXPECT_EQ(batcher.example(2).shard, 1);
  EXPECT_EQ(batcher.example(2).start, 0);
  EXPECT_EQ(batcher.example(2).end, 4);
  const PackedBatch batch = batcher.next();
  const std::vector<int64_t> inputs = values(batch.inputs);
  EXPECT_EQ(std::vector<int64_t>(inputs.begin(), inputs.begin() + 7), (std::vector<int64_t>{1, 2, 4, 6, 7, 8, 0}));
  EXPECT_EQ(values(batch.segments)[6], 3);
}

TEST_F(PackedBatcherTest, AShardWithoutExampleStartsIsAClearError) {
  fs::create_directory(path("shards"));
  write_examples("shards/a.tok", {{1, 2, 3}, {4, 5}});
  mt::data::write_token_file(path("shards/b.tok"), std::vector<uint16_t>{1, 2, 3, 4}, kVocab);
  const TokenCorpus corpus(path("shards"));
  const std::string message = error_message_of([&] { PackedBatcher batcher(corpus, BatcherOptions(1, 4)); });
  EXPECT_TRUE(contains(message, path("shards/b.tok") + " records no example starts")) << message;
  EXPECT_TRUE(contains(message, "mt_tokenize --format prompt-completion or --format messages")) << message;
}

TEST_F(PackedBatcherTest, RejectsTooFewPositionsForABatchAndBadOptions) {
  const TokenFile file(write_examples("a.tok", {{1, 2, 3}, {4, 5, 6}, {7}}));
  const std::string few = error_message_of([&] { PackedBatcher batcher(file, BatcherOptions(2, 4).world_size(2)); });
  EXPECT_TRUE(contains(few,
                       "3 examples take 4 positions, at most 1 rows of seq_len 4, fewer than one batch of 2 rows "
                       "per rank for world_size 2 (needs 4 rows)"))
      << few;
  const TokenFile ones(write_examples("b.tok", {{1}, {2}}));
  const std::string none = error_message_of([&] { PackedBatcher batcher(ones, BatcherOptions(1, 4)); });
  EXPECT_TRUE(contains(none, "all 2 examples are of one token")) << none;
  const std::string rank = error_message_of([&] { PackedBatcher batcher(file, BatcherOptions(1, 4).rank(2)); });
  EXPECT_TRUE(contains(rank, "rank 2 is outside [0, world_size 1)")) << rank;
}

}  // namespace
