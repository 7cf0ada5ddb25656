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

namespace {

std::map<std::string, double> position_of(const data::BatcherState& position) {
  return {{"epoch", static_cast<double>(position.epoch)},
          {"index", static_cast<double>(position.index)},
          {"seed", static_cast<double>(position.seed)}};
}

data::BatcherState position_from(const std::map<std::string, double>& state, const std::string& source) {
  for (const char* key : {"epoch", "index", "seed"}) {
    MT_CHECK_T(FileError, state.count(key), "the checkpoint has no data position '", key, "' for ", source);
  }
  return {static_cast<int64_t>(state.at("epoch")), static_cast<int64_t>(state.at("index")),
          static_cast<uint64_t>(state.at("seed"))};
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

}  // namespace

TokenData::TokenData(const std::string& source, const data::BatcherOptions& options)
    : source_(source),
      options_(options),
      corpus_(std::make_unique<data::TokenCorpus>(source)),
      batcher_(std::make_unique<data::TokenBatcher>(*corpus_, options)) {}

Batch TokenData::next() {
  data::Batch batch = batcher_->next();
  return Batch{std::move(batch.inputs), std::move(batch.targets), batch.count};
}

std::map<std::string, double> TokenData::state() const { return position_of(batcher_->state()); }

void TokenData::restore(const std::map<std::string, double>& state) {
  batcher_->restore(position_from(state, source_));
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

PackedTokenData::PackedTokenData(const std::string& source, const data::BatcherOptions& options, PackedLayout layout)
    : source_(source),
      options_(options),
      layout_(layout),
      corpus_(std::make_unique<data::TokenCorpus>(source)),
      batcher_(std::make_unique<data::PackedBatcher>(*corpus_, options)) {}

Batch PackedTokenData::next() {
  data::PackedBatch packed = batcher_->next();
  if (layout_ == PackedLayout::padded) {
    data::Batch padded = data::pad_each_example(packed);
    return Batch{std::move(padded.inputs), std::move(padded.targets), padded.count};
  }
  return Batch{std::move(packed.inputs), std::move(packed.targets), packed.count, std::move(packed.positions),
               std::move(packed.segments)};
}

std::map<std::string, double> PackedTokenData::state() const { return position_of(batcher_->state()); }

void PackedTokenData::restore(const std::map<std::string, double>& state) {
  batcher_->restore(position_from(state, source_));
}

std::string PackedTokenData::describe() const {
  const data::PackedBatcher& b = *batcher_;
  const int64_t shards = corpus_->num_shards();
  const std::string where = shards == 1 ? source_ : std::to_string(shards) + " shards of " + source_;
  const int64_t epoch = b.state().epoch, rows = b.rows_per_epoch(epoch);
  const int64_t packed = b.num_examples() - b.num_skipped();
  std::string text = with_commas(b.num_examples()) + " examples (" + with_commas(b.num_tokens()) + " tokens) in " +
                     where + ", packed " + fixed(static_cast<double>(packed) / static_cast<double>(rows), 1) +
                     " per row into " + with_commas(rows) + " rows of " + std::to_string(options_.seq_len()) +
                     " per epoch (" + fixed(100.0 * b.fill(epoch), 0) + "% filled, " + with_commas(b.num_truncated()) +
                     " truncated";
  if (b.num_skipped() > 0) text += ", " + with_commas(b.num_skipped()) + " of one token skipped";
  text += "), " + std::to_string(b.batches_per_epoch(epoch)) + " batches of " + std::to_string(options_.batch_size()) +
          " rows per epoch and rank";
  if (layout_ == PackedLayout::padded) text += ", fed one example per row (padded)";
  return text + loss_mask_summary(*corpus_);
}

}  // namespace mt::train
