// Batches of fine-tuning examples packed several to a row (sequence packing), from the shards
// of a TokenCorpus whose files record example starts (core/data/token_file.h).
//
// Examples: example e of a shard is its tokens [example_start(e), example_end(e)); the
// examples of all shards are numbered in corpus order, shard 0's first. An example of n tokens
// takes n - 1 positions of a row: its inputs are its first n - 1 tokens and its targets its
// last n - 1, a target masked out by the loss mask becoming kIgnoreTarget exactly as in
// TokenBatcher. An example of one token has no target and is skipped; one longer than T + 1
// tokens (T = seq_len) is cut to its first T + 1, and counted as truncated.
//
// Rows: each epoch visits every example once, in the order TokenBatcher would visit as many
// windows (core/data/epoch_order.h; shuffle(false) keeps corpus order), and packs them next-fit
// into rows of T positions: an example that does not fit in what is left of the current row
// starts the next one. Within a row, example s (s = 0, 1, ...) has segment id s and positions
// 0, 1, 2, ... of its own, so attention kept within a segment and rotary positions restarted
// per segment see each example as if it were alone. The unused tail of a row is padding: input
// id 0, target kIgnoreTarget, positions counting from 0 again, and the next segment id.
//
// Rank split and batches: with world_size W, rank r takes rows r, r + W, r + 2W, ... of the
// epoch's packed rows and groups them B at a time; a partial last batch is dropped. The number
// of rows depends on the order, so batches_per_epoch(epoch) may differ from epoch to epoch;
// the constructor checks that every epoch has at least one batch per rank (the fewest rows any
// order can pack is the positions of all examples over T, rounded up).
//
// Resume: state() is the position of the next batch, as for TokenBatcher; restore(state) on a
// batcher built with the same shards and options continues with exactly the same batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/data/token_corpus.h"
#include "core/data/token_dataset.h"
#include "core/data/token_file.h"
#include "core/tensor.h"

namespace mt::data {

struct PackedBatch {
  Tensor inputs;     // [B, T] i64, on the CPU: each example's first n - 1 tokens, then 0 (padding)
  Tensor targets;    // [B, T] i64, on the CPU: each example's last n - 1 tokens, kIgnoreTarget where masked or padding
  Tensor positions;  // [B, T] i64, on the CPU: 0, 1, 2, ... within each example; padding counts from 0 again
  Tensor segments;   // [B, T] i64, on the CPU: the example's index within its row; padding takes the next one
  int64_t epoch = 0;
  int64_t step = 0;                       // index of this batch within its epoch, in [0, batches_per_epoch(epoch))
  int64_t count = 0;                      // targets that are not kIgnoreTarget
  int64_t examples = 0;                   // examples in the batch: the sum of examples_per_row
  std::vector<int64_t> examples_per_row;  // [B]: row b holds segments [0, examples_per_row[b]), then padding
};

// One packed row: the examples it holds, in order (example indices as numbered above).
struct PackedRow {
  std::vector<int64_t> examples;
};

class PackedBatcher {
 public:
  // Keeps a reference to `file` (or to the corpus' shards), which must outlive the batcher.
  // Every shard must record example starts.
  PackedBatcher(const TokenFile& file, const BatcherOptions& options);
  PackedBatcher(const TokenCorpus& corpus, const BatcherOptions& options);

  PackedBatch next();
  BatcherState state() const { return {epoch_, index_, options_.seed()}; }
  void restore(const BatcherState& state);

  // Batches per rank in `epoch` (epoch >= 0). Packs that epoch unless it is the one cached.
  int64_t batches_per_epoch(int64_t epoch) const;
  int64_t batches_per_epoch() const { return batches_per_epoch(epoch_); }  // of the current epoch
  int64_t rows_per_epoch(int64_t epoch) const;                             // all ranks together

  int64_t num_examples() const { return num_examples_; }    // in all shards, skipped ones included
  int64_t num_tokens() const { return num_tokens_; }        // in all shards
  int64_t num_positions() const { return num_positions_; }  // the positions all examples take per epoch
  int64_t num_truncated() const { return num_truncated_; }  // examples longer than T + 1 tokens
  int64_t num_skipped() const { return num_skipped_; }      // examples of one token
  // The fraction of the epoch's row positions that hold an example's token, not padding.
  double fill(int64_t epoch) const;

  // The rows of one epoch, all ranks, in order.
  std::vector<PackedRow> epoch_rows(int64_t epoch) const;
  // Where example `index` lies: its shard and its tokens [start, end) in that shard.
  struct ExampleRef {
    int64_t shard = 0, start = 0, end = 0;
  };
  ExampleRef example(int64_t index) const;  // index in [0, num_examples())

 private:
  struct Packing {
    int64_t epoch = -1;
    std::vector<int64_t> examples;   // the packed examples of the epoch in order (skipped ones left out)
    std::vector<int64_t> row_first;  // [rows + 1]: row r holds examples[row_first[r], row_first[r + 1])
    int64_t rows() const { return static_cast<int64_t>(row_first.size()) - 1; }
  };

  void count_examples();
  int64_t positions_of(int64_t index) const;  // positions example `index` takes in a row, 0 when skipped
  Packing pack(int64_t epoch) const;
  const Packing& packing(int64_t epoch) const;
  // Fills row `row` of `packing` into inputs/targets/positions/segments [T]; returns its target count.
  int64_t fill_row(const Packing& packing, int64_t row, int64_t* inputs, int64_t* targets, int64_t* positions,
                   int64_t* segments);

  std::string name_;                      // the file's path or the corpus source, for messages
  std::vector<const TokenFile*> shards_;  // not owned
  BatcherOptions options_;
  std::vector<int64_t>
      first_example_;  // [shards + 1]: shard s holds examples [first_example_[s], first_example_[s + 1])
  std::vector<int64_t> example_tokens_;  // [T + 1] scratch: the example being copied
  int64_t num_examples_ = 0, num_tokens_ = 0, num_positions_ = 0, num_truncated_ = 0, num_skipped_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  // The packing of one epoch (the current one, or the last asked for): packing an epoch costs a
  // pass over all examples, so next() and batches_per_epoch() share it. Not thread-safe.
  mutable Packing cached_;
};

// The examples of a packed batch laid out one per row, as the classic padded path feeds them:
// inputs and targets [E, T] i64 (E = batch.examples), example e's tokens at the start of row
// e, then input id 0 and target kIgnoreTarget. Same examples, same (input, target) pairs,
// same count; epoch and step are the packed batch's.
Batch pad_each_example(const PackedBatch& batch);

}  // namespace mt::data
