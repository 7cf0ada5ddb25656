// Where a Trainer's batches come from. A DataSource hands out one micro-batch per next() and
// can say where it stands, so that a checkpoint resumes with exactly the batches an
// uninterrupted run would have seen.
//
//   mt::train::TokenData data("train.tok", mt::data::BatcherOptions(16, 256).seed(1337));
//   mt::train::TokenData shards("data/fineweb_train_*.bin", mt::data::BatcherOptions(16, 1024));
//   mt::train::PackedTokenData sft("sft.tok", mt::data::BatcherOptions(8, 512));  // packed examples
//   mt::train::FunctionData data([&] { return mt::train::Batch{x, y}; });  // anything else
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/data/packed_batcher.h"
#include "core/data/token_corpus.h"
#include "core/data/token_dataset.h"
#include "core/tensor.h"

namespace mt::train {

// One micro-batch: what the loss function reads. The Trainer moves both tensors to its device.
struct Batch {
  Tensor inputs;   // e.g. [B, T] i64 token ids, or [N, features]
  Tensor targets;  // e.g. [B, T] i64 next tokens (-100: not trained on), or [N, outputs]
  // How many targets the loss's mean is taken over (token targets not equal to -100, rows of a
  // regression). Gradient accumulation weighs each micro-batch's mean loss by it, so that the
  // accumulated step equals one step on all the micro-batches at once. 0: weigh equally.
  int64_t count = 0;
  // Rows packed with several examples (PackedTokenData): each position's index within its own
  // example, and the example's index within its row, so that the model restarts its positions
  // per example and attention never crosses from one example into another. Undefined otherwise.
  Tensor positions{};  // [B, T] i64
  Tensor segments{};   // [B, T] i64
};

// Counts the targets that are not `ignore_index` (the cross-entropy's default, -100).
int64_t count_targets(const Tensor& targets, int64_t ignore_index = -100);

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch next() = 0;
  // The position of the next batch as named numbers (checkpoints store them), and back.
  virtual std::map<std::string, double> state() const { return {}; }
  virtual void restore(const std::map<std::string, double>& state) {}
  // One line for the start of a run: "1,234,567 tokens in train.tok, 120 batches of 16x256 per epoch".
  virtual std::string describe() const { return {}; }
};

// Next-token windows of a token file or a sharded corpus (a directory, a glob pattern: see
// mt::data::TokenCorpus), through mt::data::TokenBatcher: shuffled per epoch, rank-aware,
// targets under a loss mask ignored and not counted.
class TokenData : public DataSource {
 public:
  TokenData(const std::string& source, const data::BatcherOptions& options);
  Batch next() override;
  std::map<std::string, double> state() const override;
  void restore(const std::map<std::string, double>& state) override;
  std::string describe() const override;
  const data::TokenCorpus& corpus() const { return *corpus_; }
  int64_t batches_per_epoch() const { return batcher_->batches_per_epoch(); }

 private:
  std::string source_;
  data::BatcherOptions options_;
  std::unique_ptr<data::TokenCorpus> corpus_;  // the batcher keeps references: owned here, before it
  std::unique_ptr<data::TokenBatcher> batcher_;
};

// Fine-tuning examples of a token file or sharded corpus whose files record example starts
// (mt_tokenize --format prompt-completion or messages), through mt::data::PackedBatcher.
// PackedLayout::packed: rows of several examples, with positions and segments set.
// PackedLayout::padded: the same examples one per row ([examples, T], padded with id 0 and
// target -100; mt::data::pad_each_example), positions and segments undefined: the classic
// path, to compare the packed one against (same examples, same targets, same count).
enum class PackedLayout { packed, padded };

class PackedTokenData : public DataSource {
 public:
  PackedTokenData(const std::string& source, const data::BatcherOptions& options,
                  PackedLayout layout = PackedLayout::packed);
  Batch next() override;
  std::map<std::string, double> state() const override;
  void restore(const std::map<std::string, double>& state) override;
  // "1,234 examples (56,789 tokens) in train.tok, packed 3.4 per row into 120 rows of 512 per
  // epoch (91% filled, 2 truncated), 15 batches of 8 rows per epoch and rank".
  std::string describe() const override;
  const data::TokenCorpus& corpus() const { return *corpus_; }
  const data::PackedBatcher& batcher() const { return *batcher_; }

 private:
  std::string source_;
  data::BatcherOptions options_;
  PackedLayout layout_;
  std::unique_ptr<data::TokenCorpus> corpus_;  // the batcher keeps references: owned here, before it
  std::unique_ptr<data::PackedBatcher> batcher_;
};

// Batches from a function (in-memory data, a user's own reader). Its position is not saved:
// a resumed run continues with whatever the function returns next.
class FunctionData : public DataSource {
 public:
  explicit FunctionData(std::function<Batch()> next) : next_(std::move(next)) {}
  Batch next() override { return next_(); }

 private:
  std::function<Batch()> next_;
};

}  // namespace mt::train
