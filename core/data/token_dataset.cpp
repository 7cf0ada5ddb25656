#include "core/data/token_dataset.h"

#include <algorithm>

#include "core/data/epoch_order.h"
#include "core/error.h"

namespace mt::data {

void BatcherOptions::check(const char* batcher, const std::string& source) const {
  const int64_t B = batch_size_, T = seq_len_, W = world_size_;
  MT_CHECK(B >= 1, batcher, ": ", source, ": batch_size must be at least 1, got ", B);
  MT_CHECK(T >= 1, batcher, ": ", source, ": seq_len must be at least 1, got ", T);
  MT_CHECK(W >= 1, batcher, ": ", source, ": world_size must be at least 1, got ", W);
  MT_CHECK(rank_ >= 0 && rank_ < W, batcher, ": ", source, ": rank ", rank_, " is outside [0, world_size ", W, ")");
}

TokenBatcher::TokenBatcher(const TokenFile& file, const BatcherOptions& options)
    : name_(file.path()), shards_{&file}, options_(options) {
  options.check("TokenBatcher", name_);
  count_windows();
}

TokenBatcher::TokenBatcher(const TokenCorpus& corpus, const BatcherOptions& options)
    : name_(corpus.source()), options_(options) {
  options.check("TokenBatcher", name_);
  for (const TokenFile& shard : corpus.shards()) shards_.push_back(&shard);
  count_windows();
}

// Numbers the windows shard by shard and checks there are enough for one batch per rank.
void TokenBatcher::count_windows() {
  const int64_t B = options_.batch_size(), T = options_.seq_len(), W = options_.world_size();
  MT_CHECK(!shards_.empty(), "TokenBatcher: ", name_, ": the corpus has no shards");
  int64_t tokens = 0;
  const TokenFile* longest = shards_.front();
  first_window_.assign(1, 0);
  for (const TokenFile* shard : shards_) {
    MT_CHECK(shard->size() >= 1, "TokenBatcher: the token file is empty (moved from?)");
    first_window_.push_back(first_window_.back() + (shard->size() - 1) / T);
    tokens += shard->size();
    if (shard->size() > longest->size()) longest = shard;
  }
  num_windows_ = first_window_.back();
  const bool one_file = shards_.size() == 1;
  MT_CHECK(num_windows_ >= 1, "TokenBatcher: ", name_, ": ", tokens, " tokens are too few for one window of ",
           "seq_len ", T, " (a window needs seq_len + 1 = ", T + 1, " tokens",
           one_file ? std::string()
                    : detail::str_cat(" within one shard; the longest of the ", shards_.size(), " shards, ",
                                      longest->path(), ", has ", longest->size()),
           ")");
  batches_per_epoch_ = num_windows_ / W / B;
  MT_CHECK(batches_per_epoch_ >= 1, "TokenBatcher: ", name_, ": ", tokens, " tokens",
           one_file ? std::string() : detail::str_cat(" in ", shards_.size(), " shards"), " make ", num_windows_,
           " windows of seq_len ", T, ", fewer than one batch of ", B, " per rank for world_size ", W, " (needs ",
           B * W, " windows)");
  window_tokens_.resize(static_cast<size_t>(T + 1));
}

WindowRef TokenBatcher::window(int64_t index) const {
  MT_CHECK(index >= 0 && index < num_windows_, "TokenBatcher::window: ", name_, ": window ", index, " is outside [0, ",
           num_windows_, ")");
  // The last shard whose first window is at or before `index`: shards without windows are
  // skipped, since the next shard starts at the same number.
  const auto after = std::upper_bound(first_window_.begin(), first_window_.end(), index);
  const int64_t shard = static_cast<int64_t>(after - first_window_.begin()) - 1;
  return {shard, (index - first_window_[static_cast<size_t>(shard)]) * options_.seq_len()};
}

std::vector<int64_t> TokenBatcher::epoch_order(int64_t epoch) const {
  MT_CHECK(epoch >= 0, "TokenBatcher::epoch_order: epoch must be non-negative, got ", epoch);
  return internal::epoch_permutation(num_windows_, options_.seed(), epoch, options_.shuffle());
}

const std::vector<int64_t>& TokenBatcher::order_for(int64_t epoch) {
  if (cached_epoch_ != epoch) {
    order_ = epoch_order(epoch);
    cached_epoch_ = epoch;
  }
  return order_;
}

// One row of a batch: the window's inputs and targets, its masked targets ignored. Returns
// how many targets are left to train on.
int64_t TokenBatcher::fill_row(int64_t window_index, int64_t* inputs, int64_t* targets) {
  const int64_t T = options_.seq_len();
  const WindowRef ref = window(window_index);
  const TokenFile& shard = *shards_[static_cast<size_t>(ref.shard)];
  shard.copy_tokens(ref.start, T + 1, window_tokens_.data());
  std::copy(window_tokens_.begin(), window_tokens_.end() - 1, inputs);
  std::copy(window_tokens_.begin() + 1, window_tokens_.end(), targets);
  const uint8_t* mask = shard.loss_mask();
  if (mask == nullptr) return T;
  const uint8_t* target_mask = mask + ref.start + 1;  // [T]: the targets' own positions
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (target_mask[t] == 0) targets[t] = kIgnoreTarget;
    count += target_mask[t];
  }
  return count;
}

Batch TokenBatcher::next() {
  const int64_t B = options_.batch_size(), T = options_.seq_len(), W = options_.world_size();
  const std::vector<int64_t>& order = order_for(epoch_);
  Batch batch{empty({B, T}, DType::i64), empty({B, T}, DType::i64), epoch_, index_};
  int64_t* inputs = batch.inputs.data<int64_t>();    // [B, T]
  int64_t* targets = batch.targets.data<int64_t>();  // [B, T]
  for (int64_t b = 0; b < B; ++b) {
    // This rank's (index_ * B + b)-th window of the epoch: position rank + k * W of the order.
    const int64_t k = index_ * B + b;
    batch.count += fill_row(order[static_cast<size_t>(options_.rank() + k * W)], inputs + b * T, targets + b * T);
  }
  if (++index_ == batches_per_epoch_) {
    ++epoch_;
    index_ = 0;
  }
  return batch;
}

void TokenBatcher::restore(const BatcherState& state) {
  MT_CHECK(state.seed == options_.seed(), "TokenBatcher::restore: ", name_, ": the state's seed ", state.seed,
           " differs from this batcher's seed ", options_.seed());
  MT_CHECK(state.epoch >= 0, "TokenBatcher::restore: ", name_, ": epoch must be non-negative, got ", state.epoch);
  MT_CHECK(state.index >= 0 && state.index < batches_per_epoch_, "TokenBatcher::restore: ", name_, ": index ",
           state.index, " is outside [0, batches_per_epoch ", batches_per_epoch_, ")");
  epoch_ = state.epoch;
  index_ = state.index;
}

}  // namespace mt::data
