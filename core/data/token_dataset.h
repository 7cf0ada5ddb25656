// Batches of (input, target) windows drawn from a TokenFile, or from the shards of a
// TokenCorpus, for next-token training.
//
// Windows: with T = seq_len, window i of a shard holds its tokens [i*T, i*T + T] (T + 1
// tokens); its inputs are the first T and its targets the last T, so consecutive windows share
// one token and every token but the first is a target exactly once per epoch. A shard of N
// tokens has (N - 1) / T windows; the tail that does not fill a window is never used, so no
// window crosses from one shard into the next (they are separate documents or separate runs of
// a tokenizer). The windows of all shards are numbered in corpus order, shard 0's first.
//
// Loss mask: where a shard has one (core/data/token_file.h), a target whose token is masked
// out (mask byte 0 at the target's position) becomes kIgnoreTarget, the cross-entropy's
// ignore_index, so it adds nothing to the loss and is not counted in its mean. Inputs keep
// their ids: the model reads a prompt, it is only not trained to predict it.
//
// Order: each epoch visits every window once, in an order fixed by (seed, epoch) alone: one
// Fisher-Yates shuffle over the windows of all shards together (core/data/epoch_order.h), drawing from
// Philox (core/random.h) with rejection sampling, so it is the same on every machine and
// standard library. One permutation over all (shard, window) pairs rather than shards first
// and windows within: consecutive batches then mix every shard even when the shards are
// ordered by source or topic, the rank split stays a plain stride, and a single file is
// visited exactly as it was before corpora existed. The price is reads spread over the whole
// corpus, which the page cache absorbs while the corpus fits in memory. shuffle(false) keeps
// corpus order. With world_size W > 1, rank r takes positions r, r + W, r + 2W, ... of the
// epoch's order, N_w / W windows each (the remainder is dropped so every rank runs the same
// number of batches), and groups them B at a time; a partial last batch is dropped too.
//
// Resume: state() is the position of the next batch; restore(state) on a batcher built with
// the same shards and options continues with exactly the batches an uninterrupted run yields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/data/token_corpus.h"
#include "core/data/token_file.h"
#include "core/tensor.h"

namespace mt::data {

// The target id that a loss ignores: cross_entropy's default ignore_index (ops/loss/loss.h).
constexpr int64_t kIgnoreTarget = -100;

class BatcherOptions {
 public:
  BatcherOptions(int64_t batch_size, int64_t seq_len) : batch_size_(batch_size), seq_len_(seq_len) {}
  BatcherOptions& seed(uint64_t s) {
    seed_ = s;
    return *this;
  }
  BatcherOptions& shuffle(bool s) {
    shuffle_ = s;
    return *this;
  }
  BatcherOptions& rank(int64_t r) {
    rank_ = r;
    return *this;
  }
  BatcherOptions& world_size(int64_t w) {
    world_size_ = w;
    return *this;
  }
  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  // Throws naming `batcher` and `source` when a size is below 1 or the rank is outside [0, world_size).
  void check(const char* batcher, const std::string& source) const;

 private:
  int64_t batch_size_, seq_len_;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
};

struct Batch {
  Tensor inputs;   // [B, T] i64, on the CPU
  Tensor targets;  // [B, T] i64, on the CPU: inputs shifted left by one token, kIgnoreTarget where masked
  int64_t epoch = 0;
  int64_t step = 0;   // index of this batch within its epoch, in [0, batches_per_epoch())
  int64_t count = 0;  // targets that are not kIgnoreTarget
};

// The position of the next batch.
struct BatcherState {
  int64_t epoch = 0;
  int64_t index = 0;  // in [0, batches_per_epoch())
  uint64_t seed = 0;
};

// Where a window lies: its shard, and the shard position of its first input token.
struct WindowRef {
  int64_t shard = 0;
  int64_t start = 0;
};

class TokenBatcher {
 public:
  // Keeps a reference to `file` (or to the corpus' shards), which must outlive the batcher.
  TokenBatcher(const TokenFile& file, const BatcherOptions& options);
  TokenBatcher(const TokenCorpus& corpus, const BatcherOptions& options);

  Batch next();
  BatcherState state() const { return {epoch_, index_, options_.seed()}; }
  void restore(const BatcherState& state);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t num_windows() const { return num_windows_; }  // in all shards, all ranks together

  // The window indices of one epoch, in visiting order, all ranks. Window indices number the
  // windows of shard 0 first, then shard 1's, ...; for one file, window i starts at token i * T.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  WindowRef window(int64_t index) const;  // index in [0, num_windows())

 private:
  void count_windows();
  const std::vector<int64_t>& order_for(int64_t epoch);
  int64_t fill_row(int64_t window_index, int64_t* inputs, int64_t* targets);  // inputs [T], targets [T]

  std::string name_;                      // the file's path or the corpus source, for messages
  std::vector<const TokenFile*> shards_;  // not owned
  BatcherOptions options_;
  std::vector<int64_t> first_window_;   // [shards + 1]: shard s holds windows [first_window_[s], first_window_[s + 1])
  std::vector<int64_t> window_tokens_;  // [T + 1] scratch: the window being copied
  int64_t num_windows_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t cached_epoch_ = -1;   // the epoch `order_` belongs to
  std::vector<int64_t> order_;  // [num_windows_]
};

}  // namespace mt::data
