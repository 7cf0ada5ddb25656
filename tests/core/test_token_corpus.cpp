// Contracts of core/data/token_corpus.h and of TokenBatcher over several shards: which files a
// directory or a pattern names and in what order, one vocabulary for all shards, windows that
// never cross a shard boundary, every window once per epoch, disjoint ranks with equal batch
// counts, exact resume, and loss-masked targets turned into the ignore index.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/data/token_corpus.h"
#include "core/data/token_dataset.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using mt::data::Batch;
using mt::data::BatcherOptions;
using mt::data::BatcherState;
using mt::data::TokenBatcher;
using mt::data::TokenCorpus;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Token values that say where they are: shard s, position p holds s * kShardStride + p (a
// vocabulary of 200,000, so the ids are stored as u32).
constexpr uint32_t kShardStride = 10000;
constexpr int64_t kVocab = 200000;

std::string le32(uint32_t value) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
  return s;
}

class TokenCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "mt_token_corpus_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Shard `index` of `tokens` tokens, each holding its own (shard, position).
  std::string write_shard(const std::string& name, uint32_t index, int64_t tokens,
                          const std::vector<uint8_t>& mask = {}) {
    std::vector<uint32_t> ids(static_cast<size_t>(tokens));
    for (size_t p = 0; p < ids.size(); ++p) ids[p] = index * kShardStride + static_cast<uint32_t>(p);
    if (mask.empty()) {
      mt::data::write_token_file(path(name), ids, kVocab);
    } else {
      mt::data::write_token_file(path(name), ids, mask, kVocab);
    }
    return path(name);
  }

  // An llm.c shard: 256 i32 of header, then u16 tokens.
  std::string write_llmc_shard(const std::string& name, const std::vector<uint16_t>& tokens) {
    std::string bytes =
        le32(20240520) + le32(1) + le32(static_cast<uint32_t>(tokens.size())) + std::string(253 * 4, '\0');
    for (uint16_t t : tokens) bytes += le32(t).substr(0, 2);
    write_bytes(path(name), bytes);
    return path(name);
  }

  std::vector<std::string> names(const std::vector<std::string>& paths) const {
    std::vector<std::string> out;
    for (const std::string& p : paths) out.push_back(fs::path(p).filename().string());
    return out;
  }

  std::string dir_;
};

// Where each row's window lies, read from the token values: (shard, first input position).
std::vector<std::pair<int64_t, int64_t>> window_places(const Batch& batch) {
  const std::vector<int64_t> in = batch.inputs.to_vector<int64_t>();
  const int64_t T = batch.inputs.size(1);
  std::vector<std::pair<int64_t, int64_t>> places;
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    const int64_t first = in[static_cast<size_t>(r * T)];
    places.emplace_back(first / kShardStride, first % kShardStride);
  }
  return places;
}

// ---------------------------------------------------------------- sources

TEST_F(TokenCorpusTest, ADirectoryOpensItsTokenFilesInByteOrderOfTheirNames) {
  write_shard("b.tok", 1, 10);
  write_shard("a.bin", 0, 10);
  write_shard("c.mtt", 2, 10);
  write_shard("D.tokens", 3, 10);  // 'D' sorts before 'a' byte by byte, whatever the locale says
  write_bytes(path("notes.txt"), "not a shard");
  write_shard(".hidden.tok", 4, 10);
  fs::create_directory(path("sub.tok"));  // a directory, whatever its name
  write_shard("sub.tok/inner.tok", 5, 10);
  EXPECT_EQ(names(TokenCorpus::shard_paths(dir_)), (std::vector<std::string>{"D.tokens", "a.bin", "b.tok", "c.mtt"}));
  const TokenCorpus corpus(dir_);
  EXPECT_EQ(corpus.source(), dir_);
  ASSERT_EQ(corpus.num_shards(), 4);
  EXPECT_EQ(corpus.shard(0).path(), path("D.tokens"));
  EXPECT_EQ(corpus.vocab_size(), kVocab);
  EXPECT_EQ(corpus.total_tokens(), 40);
  EXPECT_FALSE(corpus.has_loss_mask());
}

TEST_F(TokenCorpusTest, AGlobPatternOpensWhatItMatchesInNameOrder) {
  write_shard("train_10.bin", 0, 10);
  write_shard("train_2.bin", 1, 10);
  write_shard("val_0.bin", 2, 10);
  const TokenCorpus corpus(path("train_*.bin"));
  ASSERT_EQ(corpus.num_shards(), 2);
  EXPECT_EQ(corpus.shard(0).path(), path("train_10.bin"));  // "1" < "2": names, not numbers
  EXPECT_EQ(corpus.shard(1).path(), path("train_2.bin"));
  EXPECT_EQ(names(TokenCorpus::shard_paths(path("*_?.bin"))), (std::vector<std::string>{"train_2.bin", "val_0.bin"}));
}

TEST_F(TokenCorpusTest, ASingleFileIsACorpusOfOneShard) {
  const std::string file = write_shard("one.tok", 0, 10);
  const TokenCorpus corpus(file);
  ASSERT_EQ(corpus.num_shards(), 1);
  EXPECT_EQ(corpus.shard(0).path(), file);
  EXPECT_EQ(corpus.total_tokens(), 10);
}

TEST_F(TokenCorpusTest, ReadsLlmcShardsAndMixesThemWithTokenFilesOfTheSameVocabulary) {
  write_llmc_shard("a_shard.bin", {1, 2, 3, 50256});
  mt::data::write_token_file(path("b_file.tok"), std::vector<uint16_t>{4, 5, 6}, 50257);
  const TokenCorpus corpus(dir_, /*expected_vocab_size=*/50257);
  ASSERT_EQ(corpus.num_shards(), 2);
  EXPECT_EQ(corpus.shard(0).format(), mt::data::TokenFileFormat::llmc_shard);
  EXPECT_EQ(corpus.vocab_size(), 50257);
  EXPECT_EQ(corpus.total_tokens(), 7);
}

TEST_F(TokenCorpusTest, ShardsOfDifferentVocabulariesAreAnErrorNamingBoth) {
  write_shard("a.tok", 0, 10);
  mt::data::write_token_file(path("b.tok"), std::vector<uint16_t>{1, 2}, 256);
  const std::string message = error_message_of([&] { TokenCorpus corpus(dir_); });
  EXPECT_EQ(message.rfind(path("b.tok") + ": vocab_size 256 differs from the vocab_size 200000 of " + path("a.tok"), 0),
            0u)
      << message;
  EXPECT_TRUE(contains(message, "the shards of the corpus " + dir_ + " must share one vocabulary")) << message;
  // An llm.c shard takes 65536 unless told otherwise, so it disagrees with a 50257 file.
  fs::remove(path("a.tok"));
  write_llmc_shard("c.bin", {1, 2, 3});
  const std::string llmc = error_message_of([&] { TokenCorpus corpus(dir_); });
  EXPECT_TRUE(contains(llmc, path("c.bin") + ": vocab_size 65536 differs from the vocab_size 256 of " + path("b.tok")))
      << llmc;
}

TEST_F(TokenCorpusTest, EmptyDirectoriesPatternsWithoutMatchesAndMissingFilesAreErrors) {
  write_bytes(path("readme.md"), "no shards here");
  const std::string empty = error_message_of([&] { TokenCorpus corpus(dir_); });
  EXPECT_TRUE(contains(empty, dir_ + ": the corpus directory holds no token file (*.bin, *.mtt, *.tok or *.tokens)"))
      << empty;
  const std::string pattern = error_message_of([&] { TokenCorpus corpus(path("train_*.bin")); });
  EXPECT_TRUE(contains(pattern, path("train_*.bin") + ": no file matches this corpus pattern")) << pattern;
  const std::string missing = error_message_of([&] { TokenCorpus corpus(path("absent.tok")); });
  EXPECT_TRUE(contains(missing, path("absent.tok") + ": cannot open token file: No such file")) << missing;
  const std::string corrupt_shard = [&] {
    write_shard("a.tok", 0, 10);
    write_bytes(path("b.tok"), "MTTOKENS");
    return error_message_of([&] { TokenCorpus corpus(dir_); });
  }();
  EXPECT_TRUE(contains(corrupt_shard, path("b.tok") + ": file is 8 bytes, shorter than the 32-byte token file header"))
      << corrupt_shard;
}

// ---------------------------------------------------------------- batches over shards

// Shards of 40, 3 (too short for a window of 4), 23 and 17 tokens: 9 + 0 + 5 + 4 = 18 windows.
class TokenCorpusBatcher : public TokenCorpusTest {
 protected:
  static constexpr int64_t kT = 4;
  void SetUp() override {
    TokenCorpusTest::SetUp();
    write_shard("s0.tok", 0, 40);
    write_shard("s1.tok", 1, 3);
    write_shard("s2.tok", 2, 23);
    write_shard("s3.tok", 3, 17);
  }
  std::set<std::pair<int64_t, int64_t>> all_windows() const {
    std::set<std::pair<int64_t, int64_t>> all;
    const std::map<int64_t, int64_t> windows_per_shard = {{0, 9}, {2, 5}, {3, 4}};
    for (const auto& [shard, n] : windows_per_shard) {
      for (int64_t w = 0; w < n; ++w) all.emplace(shard, w * kT);
    }
    return all;
  }
};

TEST_F(TokenCorpusBatcher, WindowsNeverCrossAShardBoundary) {
  const TokenCorpus corpus(dir_);
  TokenBatcher batcher(corpus, BatcherOptions(3, kT).seed(8));
  EXPECT_EQ(batcher.num_windows(), 18);
  for (int i = 0; i < 3 * batcher.batches_per_epoch(); ++i) {
    const Batch batch = batcher.next();
    const std::vector<int64_t> in = batch.inputs.to_vector<int64_t>(), out = batch.targets.to_vector<int64_t>();
    for (size_t r = 0; r < 3; ++r) {
      const int64_t first = in[r * kT];
      for (int64_t t = 0; t < kT; ++t) {  // one shard, consecutive positions: no boundary inside
        EXPECT_EQ(in[r * kT + static_cast<size_t>(t)], first + t) << "batch " << i << " row " << r;
        EXPECT_EQ(out[r * kT + static_cast<size_t>(t)], first + t + 1) << "batch " << i << " row " << r;
      }
      const int64_t shard = first / kShardStride;
      EXPECT_LT(first % kShardStride + kT, corpus.shard(shard).size()) << "the last target is past the shard's end";
    }
  }
  EXPECT_EQ(batcher.window(9).shard, 2);  // shard 1 has no window: shard 2's first follows shard 0's last
  EXPECT_EQ(batcher.window(9).start, 0);
  EXPECT_EQ(batcher.window(17).shard, 3);
  EXPECT_EQ(batcher.window(17).start, 3 * kT);
  EXPECT_TRUE(contains(error_message_of([&] { batcher.window(18); }), "window 18 is outside [0, 18)"));
}

TEST_F(TokenCorpusBatcher, EachEpochVisitsEveryWindowOfEveryShardOnce) {
  const TokenCorpus corpus(dir_);
  TokenBatcher batcher(corpus, BatcherOptions(2, kT).seed(21));
  ASSERT_EQ(batcher.batches_per_epoch(), 9);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> epochs(3);
  for (int64_t e = 0; e < 3; ++e) {
    for (int64_t s = 0; s < 9; ++s) {
      const Batch batch = batcher.next();
      EXPECT_EQ(batch.epoch, e);
      for (const auto& place : window_places(batch)) epochs[static_cast<size_t>(e)].push_back(place);
    }
  }
  for (const auto& epoch : epochs) {
    const std::set<std::pair<int64_t, int64_t>> visited(epoch.begin(), epoch.end());
    EXPECT_EQ(visited, all_windows());
    EXPECT_EQ(epoch.size(), 18u);
  }
  EXPECT_NE(epochs[0], epochs[1]) << "two epochs visited the windows in the same order";
  std::vector<std::pair<int64_t, int64_t>> first_shards(epochs[0].begin(), epochs[0].begin() + 6);
  EXPECT_FALSE(std::all_of(first_shards.begin(), first_shards.end(), [&](const auto& p) {
    return p.first == first_shards[0].first;
  })) << "the shuffle did not mix shards";
}

TEST_F(TokenCorpusBatcher, UnshuffledGoesThroughTheShardsInOrder) {
  const TokenCorpus corpus(dir_);
  TokenBatcher batcher(corpus, BatcherOptions(18, kT).shuffle(false));
  const std::vector<std::pair<int64_t, int64_t>> places = window_places(batcher.next());
  EXPECT_EQ(places.front(), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(places[9], std::make_pair(int64_t{2}, int64_t{0}));
  EXPECT_EQ(places.back(), std::make_pair(int64_t{3}, 3 * kT));
}

TEST_F(TokenCorpusBatcher, RanksTakeDisjointWindowsAndTheSameNumberOfBatches) {
  const TokenCorpus corpus(dir_);
  constexpr int64_t kWorld = 4, kB = 2;  // 18 windows: 4 per rank, 2 dropped; 2 batches each
  TokenBatcher whole(corpus, BatcherOptions(1, kT).seed(5));
  const std::vector<int64_t> order = whole.epoch_order(0);
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    TokenBatcher batcher(corpus, BatcherOptions(kB, kT).seed(5).rank(rank).world_size(kWorld));
    ASSERT_EQ(batcher.batches_per_epoch(), 2) << "rank " << rank;
    std::vector<std::pair<int64_t, int64_t>> mine;
    for (int s = 0; s < 2; ++s) {
      for (const auto& place : window_places(batcher.next())) mine.push_back(place);
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      const mt::data::WindowRef expected = whole.window(order[static_cast<size_t>(rank) + kWorld * k]);
      EXPECT_EQ(mine[k], std::make_pair(expected.shard, expected.start)) << "rank " << rank << " window " << k;
      EXPECT_TRUE(seen.insert(mine[k]).second) << "a window reached two ranks";
    }
    EXPECT_EQ(batcher.next().epoch, 1) << "rank " << rank;
  }
  EXPECT_EQ(seen.size(), 16u);  // 18 windows, the last 2 of the order dropped
}

TEST_F(TokenCorpusBatcher, RestoreReproducesTheUninterruptedRun) {
  const TokenCorpus corpus(dir_);
  const BatcherOptions options = BatcherOptions(4, kT).seed(99).rank(1).world_size(2);  // 2 batches per epoch
  TokenBatcher reference(corpus, options);
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 9; ++i) expected.push_back(reference.next().inputs.to_vector<int64_t>());
  for (int stop : {0, 1, 2, 3, 5, 8}) {
    TokenBatcher first(corpus, options);
    for (int i = 0; i < stop; ++i) first.next();
    const BatcherState state = first.state();
    const TokenCorpus reopened(dir_);  // a new process opens the corpus again
    TokenBatcher resumed(reopened, options);
    resumed.restore(state);
    for (int i = stop; i < 9; ++i) {
      EXPECT_EQ(resumed.next().inputs.to_vector<int64_t>(), expected[static_cast<size_t>(i)]) << "stop " << stop;
    }
  }
}

TEST_F(TokenCorpusBatcher, OneShardBatchesAsItsFileDoes) {
  const std::string file_path = path("s0.tok");
  const mt::data::TokenFile file(file_path);
  const TokenCorpus corpus(file_path);
  TokenBatcher from_file(file, BatcherOptions(3, kT).seed(4)), from_corpus(corpus, BatcherOptions(3, kT).seed(4));
  EXPECT_EQ(from_file.epoch_order(1), from_corpus.epoch_order(1));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(from_file.next().targets.to_vector<int64_t>(), from_corpus.next().targets.to_vector<int64_t>());
  }
}

TEST_F(TokenCorpusTest, NoShardLongEnoughForAWindowNamesTheLongest) {
  write_shard("a.tok", 0, 5);
  write_shard("b.tok", 1, 7);
  const TokenCorpus corpus(dir_);
  const std::string message = error_message_of([&] { TokenBatcher batcher(corpus, BatcherOptions(1, 7)); });
  EXPECT_TRUE(contains(message, dir_ +
                                    ": 12 tokens are too few for one window of seq_len 7 (a window needs seq_len "
                                    "+ 1 = 8 tokens within one shard; the longest of the 2 shards, " +
                                    path("b.tok") + ", has 7)"))
      << message;
  const std::string batch = error_message_of([&] { TokenBatcher batcher(corpus, BatcherOptions(2, 6)); });
  EXPECT_TRUE(contains(batch, dir_ + ": 12 tokens in 2 shards make 1 windows of seq_len 6, fewer than one batch of 2 "
                                     "per rank for world_size 1 (needs 2 windows)"))
      << batch;
}

// ---------------------------------------------------------------- loss mask

TEST_F(TokenCorpusTest, MaskedTargetsBecomeTheIgnoreIndexAndAreNotCounted) {
  // Shard 0: a prompt of 3 tokens, then 6 answer tokens; shard 1 has no mask (all targets).
  write_shard("a.tok", 0, 9, {0, 0, 0, 1, 1, 1, 1, 1, 0});
  write_shard("b.tok", 1, 9);
  const TokenCorpus corpus(dir_);
  EXPECT_TRUE(corpus.has_loss_mask());
  TokenBatcher batcher(corpus, BatcherOptions(4, 2).shuffle(false));  // windows at 0, 2, 4, 6 of each shard
  const Batch first = batcher.next();                                 // shard 0
  EXPECT_EQ(first.inputs.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Target positions 1..8; mask there 0 0 1 1 1 1 1 0.
  EXPECT_EQ(first.targets.to_vector<int64_t>(), (std::vector<int64_t>{-100, -100, 3, 4, 5, 6, 7, -100}));
  EXPECT_EQ(first.count, 5);
  EXPECT_EQ(mt::data::kIgnoreTarget, -100);
  const Batch second = batcher.next();  // shard 1: nothing ignored
  EXPECT_EQ(second.targets.to_vector<int64_t>(),
            (std::vector<int64_t>{10001, 10002, 10003, 10004, 10005, 10006, 10007, 10008}));
  EXPECT_EQ(second.count, 8);
}

TEST_F(TokenCorpusTest, AShardWhoseTargetsAreAllMaskedCountsZero) {
  write_shard("a.tok", 0, 5, {1, 0, 0, 0, 0});  // only the first token, never a target, is marked
  const TokenCorpus corpus(dir_);
  TokenBatcher batcher(corpus, BatcherOptions(1, 4));
  const Batch batch = batcher.next();
  EXPECT_EQ(batch.targets.to_vector<int64_t>(), (std::vector<int64_t>(4, -100)));
  EXPECT_EQ(batch.count, 0);
}

}  // namespace
