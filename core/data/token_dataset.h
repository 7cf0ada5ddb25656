// Batches of (input, target) windows drawn from a TokenFile for next-token training.
//
// Windows: with T = seq_len, window i holds tokens [i*T, i*T + T] (T + 1 tokens); its inputs
// are the first T and its targets the last T, so consecutive windows share one token and
// every token but the first is a target exactly once per epoch. There are (N - 1) / T windows
// for a file of N tokens; the tail that does not fill a window is never used.
//
// Order: each epoch visits every window once, in an order fixed by (seed, epoch) alone: a
// Fisher-Yates shuffle written here, drawing from Philox (core/random.h) with rejection
// sampling, so it is the same on every machine and standard library. shuffle(false) keeps the
// file order. With world_size W > 1, rank r takes positions r, r + W, r + 2W, ... of the
// epoch's order, N_w / W windows each (the remainder is dropped so every rank runs the same
// number of batches), and groups them B at a time; a partial last batch is dropped too.
//
// Resume: state() is the position of the next batch; restore(state) on a batcher built with
// the same file and options continues with exactly the batches an uninterrupted run yields.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/token_file.h"
#include "core/tensor.h"

namespace mt::data {

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

 private:
  int64_t batch_size_, seq_len_;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
};

struct Batch {
  Tensor inputs;   // [B, T] i64, on the CPU
  Tensor targets;  // [B, T] i64, on the CPU: inputs shifted left by one token
  int64_t epoch = 0;
  int64_t step = 0;  // index of this batch within its epoch, in [0, batches_per_epoch())
};

// The position of the next batch.
struct BatcherState {
  int64_t epoch = 0;
  int64_t index = 0;  // in [0, batches_per_epoch())
  uint64_t seed = 0;
};

class TokenBatcher {
 public:
  // Keeps a reference to `file`, which must outlive the batcher.
  TokenBatcher(const TokenFile& file, const BatcherOptions& options);

  Batch next();
  BatcherState state() const { return {epoch_, index_, options_.seed()}; }
  void restore(const BatcherState& state);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t num_windows() const { return num_windows_; }  // in the whole file, all ranks together

  // The window indices (position i * T in the file) of one epoch, in visiting order, all ranks.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  const std::vector<int64_t>& order_for(int64_t epoch);

  const TokenFile& file_;
  BatcherOptions options_;
  int64_t num_windows_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t cached_epoch_ = -1;   // the epoch `order_` belongs to
  std::vector<int64_t> order_;  // [num_windows_]
};

}  // namespace mt::data
