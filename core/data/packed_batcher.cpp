#include "core/data/packed_batcher.h"

#include <algorithm>
#include <utility>

#include "core/data/epoch_order.h"
#include "core/error.h"

namespace mt::data {

PackedBatcher::PackedBatcher(const TokenFile& file, const BatcherOptions& options)
    : name_(file.path()), shards_{&file}, options_(options) {
  options.check("PackedBatcher", name_);
  count_examples();
}

PackedBatcher::PackedBatcher(const TokenCorpus& corpus, const BatcherOptions& options)
    : name_(corpus.source()), options_(options) {
  options.check("PackedBatcher", name_);
  for (const TokenFile& shard : corpus.shards()) shards_.push_back(&shard);
  count_examples();
}

// Numbers the examples shard by shard, counts what packing them takes, and checks that every
// epoch has a batch for every rank.
void PackedBatcher::count_examples() {
  const int64_t B = options_.batch_size(), T = options_.seq_len(), W = options_.world_size();
  MT_CHECK(!shards_.empty(), "PackedBatcher: ", name_, ": the corpus has no shards");
  first_example_.assign(1, 0);
  for (const TokenFile* shard : shards_) {
    MT_CHECK(shard->size() >= 1, "PackedBatcher: the token file is empty (moved from?)");
    MT_CHECK(shard->has_example_starts(), "PackedBatcher: ", shard->path(),
             " records no example starts, so its examples cannot be packed apart; tokenize fine-tuning data with ",
             "mt_tokenize --format prompt-completion or --format messages");
    first_example_.push_back(first_example_.back() + shard->num_examples());
    num_tokens_ += shard->size();
  }
  num_examples_ = first_example_.back();
  for (int64_t i = 0; i < num_examples_; ++i) {
    const ExampleRef ref = example(i);
    const int64_t n = ref.end - ref.start;
    num_skipped_ += n == 1;
    num_truncated_ += n > T + 1;
    num_positions_ += positions_of(i);
  }
  MT_CHECK(num_positions_ >= 1, "PackedBatcher: ", name_, ": all ", num_examples_,
           " examples are of one token, which leaves nothing to predict");
  // Any packing fills at most T positions per row, so this many rows is the fewest of any epoch.
  const int64_t fewest_rows = (num_positions_ + T - 1) / T;
  MT_CHECK(fewest_rows >= B * W, "PackedBatcher: ", name_, ": ", num_examples_, " examples take ", num_positions_,
           " positions, at most ", fewest_rows, " rows of seq_len ", T, ", fewer than one batch of ", B,
           " rows per rank for world_size ", W, " (needs ", B * W, " rows)");
  example_tokens_.resize(static_cast<size_t>(T + 1));
}

PackedBatcher::ExampleRef PackedBatcher::example(int64_t index) const {
  MT_CHECK(index >= 0 && index < num_examples_, "PackedBatcher::example: ", name_, ": example ", index,
           " is outside [0, ", num_examples_, ")");
  const auto after = std::upper_bound(first_example_.begin(), first_example_.end(), index);
  const int64_t shard = static_cast<int64_t>(after - first_example_.begin()) - 1;
  const TokenFile& file = *shards_[static_cast<size_t>(shard)];
  const int64_t local = index - first_example_[static_cast<size_t>(shard)];
  return {shard, file.example_start(local), file.example_end(local)};
}

int64_t PackedBatcher::positions_of(int64_t index) const {
  const ExampleRef ref = example(index);
  return std::min(ref.end - ref.start, options_.seq_len() + 1) - 1;
}

// Next-fit in the epoch's order: an example that does not fit in what is left of the current
// row closes it. Next-fit rather than best-fit keeps each row's examples consecutive in the
// shuffled order, which is what makes the packing a pure function of (seed, epoch).
PackedBatcher::Packing PackedBatcher::pack(int64_t epoch) const {
  MT_CHECK(epoch >= 0, "PackedBatcher: ", name_, ": epoch must be non-negative, got ", epoch);
  const int64_t T = options_.seq_len();
  Packing p;
  p.epoch = epoch;
  p.examples.reserve(static_cast<size_t>(num_examples_));
  p.row_first.push_back(0);
  int64_t used = 0;
  for (const int64_t index : internal::epoch_permutation(num_examples_, options_.seed(), epoch, options_.shuffle())) {
    const int64_t n = positions_of(index);
    if (n == 0) continue;
    if (used + n > T) {
      p.row_first.push_back(static_cast<int64_t>(p.examples.size()));
      used = 0;
    }
    p.examples.push_back(index);
    used += n;
  }
  p.row_first.push_back(static_cast<int64_t>(p.examples.size()));  // closes the last row, never empty
  return p;
}

const PackedBatcher::Packing& PackedBatcher::packing(int64_t epoch) const {
  if (cached_.epoch != epoch) cached_ = pack(epoch);
  return cached_;
}

int64_t PackedBatcher::rows_per_epoch(int64_t epoch) const { return packing(epoch).rows(); }

int64_t PackedBatcher::batches_per_epoch(int64_t epoch) const {
  return rows_per_epoch(epoch) / options_.world_size() / options_.batch_size();
}

double PackedBatcher::fill(int64_t epoch) const {
  return static_cast<double>(num_positions_) / static_cast<double>(rows_per_epoch(epoch) * options_.seq_len());
}

std::vector<PackedRow> PackedBatcher::epoch_rows(int64_t epoch) const {
  const Packing p = pack(epoch);
  std::vector<PackedRow> rows(static_cast<size_t>(p.rows()));
  for (int64_t r = 0; r < p.rows(); ++r) {
    rows[static_cast<size_t>(r)].examples.assign(p.examples.begin() + p.row_first[static_cast<size_t>(r)],
                                                 p.examples.begin() + p.row_first[static_cast<size_t>(r) + 1]);
  }
  return rows;
}

int64_t PackedBatcher::fill_row(const Packing& packing, int64_t row, int64_t* inputs, int64_t* targets,
                                int64_t* positions, int64_t* segments) {
  const int64_t T = options_.seq_len();
  const int64_t first = packing.row_first[static_cast<size_t>(row)];
  const int64_t last = packing.row_first[static_cast<size_t>(row) + 1];
  int64_t used = 0, count = 0;
  for (int64_t k = first; k < last; ++k) {
    const ExampleRef ref = example(packing.examples[static_cast<size_t>(k)]);
    const int64_t m = std::min(ref.end - ref.start, T + 1);  // tokens used, the truncated tail left out
    const TokenFile& shard = *shards_[static_cast<size_t>(ref.shard)];
    shard.copy_tokens(ref.start, m, example_tokens_.data());
    const uint8_t* mask = shard.loss_mask();
    for (int64_t j = 0; j + 1 < m; ++j) {
      const int64_t t = used + j;
      inputs[t] = example_tokens_[static_cast<size_t>(j)];
      const bool trained = mask == nullptr || mask[ref.start + j + 1] != 0;  // the target's own mask byte
      targets[t] = trained ? example_tokens_[static_cast<size_t>(j) + 1] : kIgnoreTarget;
      count += trained;
      positions[t] = j;
      segments[t] = k - first;
    }
    used += m - 1;
  }
  for (int64_t t = used; t < T; ++t) {
    inputs[t] = 0;
    targets[t] = kIgnoreTarget;
    positions[t] = t - used;
    segments[t] = last - first;
  }
  return count;
}

PackedBatch PackedBatcher::next() {
  const int64_t B = options_.batch_size(), T = options_.seq_len(), W = options_.world_size();
  const Packing& p = packing(epoch_);
  PackedBatch batch;
  batch.inputs = empty({B, T}, DType::i64);
  batch.targets = empty({B, T}, DType::i64);
  batch.positions = empty({B, T}, DType::i64);
  batch.segments = empty({B, T}, DType::i64);
  batch.epoch = epoch_;
  batch.step = index_;
  batch.examples_per_row.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    // This rank's (index_ * B + b)-th row of the epoch: row rank + k * W.
    const int64_t row = options_.rank() + (index_ * B + b) * W;
    batch.count += fill_row(p, row, batch.inputs.data<int64_t>() + b * T, batch.targets.data<int64_t>() + b * T,
                            batch.positions.data<int64_t>() + b * T, batch.segments.data<int64_t>() + b * T);
    const int64_t held = p.row_first[static_cast<size_t>(row) + 1] - p.row_first[static_cast<size_t>(row)];
    batch.examples_per_row[static_cast<size_t>(b)] = held;
    batch.examples += held;
  }
  if (++index_ == p.rows() / W / B) {
    ++epoch_;
    index_ = 0;
  }
  return batch;
}

void PackedBatcher::restore(const BatcherState& state) {
  MT_CHECK(state.seed == options_.seed(), "PackedBatcher::restore: ", name_, ": the state's seed ", state.seed,
           " differs from this batcher's seed ", options_.seed());
  MT_CHECK(state.epoch >= 0, "PackedBatcher::restore: ", name_, ": epoch must be non-negative, got ", state.epoch);
  const int64_t batches = batches_per_epoch(state.epoch);
  MT_CHECK(state.index >= 0 && state.index < batches, "PackedBatcher::restore: ", name_, ": index ", state.index,
           " is outside [0, batches_per_epoch ", batches, ") of epoch ", state.epoch);
  epoch_ = state.epoch;
  index_ = state.index;
}

Batch pad_each_example(const PackedBatch& batch) {
  MT_CHECK(batch.inputs.defined() && batch.inputs.dim() == 2, "pad_each_example: the batch's inputs must be [B, T]");
  const int64_t B = batch.inputs.size(0), T = batch.inputs.size(1);
  MT_CHECK(static_cast<int64_t>(batch.examples_per_row.size()) == B, "pad_each_example: examples_per_row has ",
           batch.examples_per_row.size(), " entries for ", B, " rows");
  int64_t held_total = 0;
  for (const int64_t held : batch.examples_per_row) held_total += held;
  MT_CHECK(held_total == batch.examples, "pad_each_example: examples_per_row sums to ", held_total,
           ", not the batch's ", batch.examples, " examples");
  Batch out{empty({batch.examples, T}, DType::i64), empty({batch.examples, T}, DType::i64), batch.epoch, batch.step,
            batch.count};
  int64_t* inputs = out.inputs.data<int64_t>();    // [E, T]
  int64_t* targets = out.targets.data<int64_t>();  // [E, T]
  std::fill(inputs, inputs + batch.examples * T, int64_t{0});
  std::fill(targets, targets + batch.examples * T, kIgnoreTarget);
  const int64_t* in = batch.inputs.data<int64_t>();
  const int64_t* tg = batch.targets.data<int64_t>();
  const int64_t* pos = batch.positions.data<int64_t>();
  const int64_t* seg = batch.segments.data<int64_t>();
  int64_t first_out_row = 0;  // the output row of this packed row's segment 0
  for (int64_t b = 0; b < B; ++b) {
    const int64_t held = batch.examples_per_row[static_cast<size_t>(b)];
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      if (seg[t] >= held) continue;  // padding
      MT_CHECK(seg[t] >= 0 && pos[t] >= 0 && pos[t] < T, "pad_each_example: row ", b, " position ", t - b * T,
               " has segment ", seg[t], " and position ", pos[t], ", outside [0, ", T, ")");
      const int64_t at = (first_out_row + seg[t]) * T + pos[t];
      inputs[at] = in[t];
      targets[at] = tg[t];
    }
    first_out_row += held;
  }
  return out;
}

}  // namespace mt::data
