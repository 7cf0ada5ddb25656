#include "train/data_source.h"

#include <cstdio>

#include "core/error.h"
#include "core/format.h"

namespace mt::train {

int64_t count_targets(const Tensor& targets, int64_t ignore_index) {
  MT_CHECK(targets.dtype() == DType::i64, "count_targets: targets must be i64, got ", dtype_name(targets.dtype()));
  int64_t count = 0;
  for (const int64_t id : targets.to_vector<int64_t>()) count += id != ignore_index;
  return count;
}

TokenData::TokenData(const std::string& source, const data::BatcherOptions& options)
    : source_(source),
      options_(options),
      corpus_(std::make_unique<data::TokenCorpus>(source)),
      batcher_(std::make_unique<data::TokenBatcher>(*corpus_, options)) {}

Batch TokenData::next() {
  data::Batch batch = batcher_->next();
  return Batch{std::move(batch.inputs), std::move(batch.targets), batch.count};
}

std::map<std::string, double> TokenData::state() const {
  const data::BatcherState position = batcher_->state();
  return {{"epoch", static_cast<double>(position.epoch)},
          {"index", static_cast<double>(position.index)},
          {"seed", static_cast<double>(position.seed)}};
}

void TokenData::restore(const std::map<std::string, double>& state) {
  for (const char* key : {"epoch", "index", "seed"}) {
    MT_CHECK_T(FileError, state.count(key), "the checkpoint has no data position '", key, "' for ", source_);
  }
  batcher_->restore({static_cast<int64_t>(state.at("epoch")), static_cast<int64_t>(state.at("index")),
                     static_cast<uint64_t>(state.at("seed"))});
}

namespace {

// ", loss mask: 34.4% of tokens are targets" for fine-tuning data; "" without a mask.
std::string loss_mask_summary(const data::TokenCorpus& corpus) {
  if (!corpus.has_loss_mask()) return "";
  int64_t targets = 0;
  for (const auto& shard : corpus.shards()) {
    if (!shard.has_loss_mask()) {
      targets += shard.size();
      continue;
    }
    for (int64_t i = 0; i < shard.size(); ++i) targets += shard.loss_mask()[i];
  }
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.1f%%",
                100.0 * static_cast<double>(targets) / static_cast<double>(corpus.total_tokens()));
  return std::string(", loss mask: ") + percent + " of tokens are targets";
}

}  // namespace

std::string TokenData::describe() const {
  const int64_t shards = corpus_->num_shards();
  const std::string where = shards == 1 ? source_ : std::to_string(shards) + " shards of " + source_;
  return with_commas(corpus_->total_tokens()) + " tokens in " + where + ", " +
         std::to_string(batcher_->batches_per_epoch()) + " batches of " + std::to_string(options_.batch_size()) + "x" +
         std::to_string(options_.seq_len()) + " per epoch and rank" + loss_mask_summary(*corpus_);
}

}  // namespace mt::train
