#include "core/data/token_dataset.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/random.h"

namespace mt::data {
namespace {

// 64-bit draws from Philox: key `seed`, subsequence `epoch`, counters 0, 1, 2, ...; each
// counter yields two draws. Pure integer arithmetic, so every machine sees the same stream.
class EpochStream {
 public:
  EpochStream(uint64_t seed, uint64_t epoch) : seed_(seed), epoch_(epoch) {}
  uint64_t next() {
    if (lane_ == 0) words_ = philox::generate(seed_, counter_++, epoch_);
    const uint64_t value = (static_cast<uint64_t>(words_.w[2 * lane_ + 1]) << 32) | words_.w[2 * lane_];
    lane_ ^= 1;
    return value;
  }
  // Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
  // rejected, leaving a range that is a whole multiple of bound.
  uint64_t below(uint64_t bound) {
    const uint64_t reject_below = (0 - bound) % bound;  // == 2^64 mod bound
    uint64_t x = next();
    while (x < reject_below) x = next();
    return x % bound;
  }

 private:
  uint64_t seed_, epoch_;
  uint64_t counter_ = 0;
  int lane_ = 0;
  philox::Words words_{};
};

}  // namespace

TokenBatcher::TokenBatcher(const TokenFile& file, const BatcherOptions& options) : file_(file), options_(options) {
  const int64_t B = options.batch_size(), T = options.seq_len(), W = options.world_size();
  MT_CHECK(B >= 1, "TokenBatcher: ", file.path(), ": batch_size must be at least 1, got ", B);
  MT_CHECK(T >= 1, "TokenBatcher: ", file.path(), ": seq_len must be at least 1, got ", T);
  MT_CHECK(W >= 1, "TokenBatcher: ", file.path(), ": world_size must be at least 1, got ", W);
  MT_CHECK(options.rank() >= 0 && options.rank() < W, "TokenBatcher: ", file.path(), ": rank ", options.rank(),
           " is outside [0, world_size ", W, ")");
  MT_CHECK(file.size() >= 1, "TokenBatcher: the token file is empty (moved from?)");
  num_windows_ = (file.size() - 1) / T;
  MT_CHECK(num_windows_ >= 1, "TokenBatcher: ", file.path(), ": ", file.size(),
           " tokens are too few for one window of ", "seq_len ", T, " (a window needs seq_len + 1 = ", T + 1,
           " tokens)");
  batches_per_epoch_ = num_windows_ / W / B;
  MT_CHECK(batches_per_epoch_ >= 1, "TokenBatcher: ", file.path(), ": ", file.size(), " tokens make ", num_windows_,
           " windows of seq_len ", T, ", fewer than one batch of ", B, " per rank for world_size ", W, " (needs ",
           B * W, " windows)");
}

std::vector<int64_t> TokenBatcher::epoch_order(int64_t epoch) const {
  MT_CHECK(epoch >= 0, "TokenBatcher::epoch_order: epoch must be non-negative, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(num_windows_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options_.shuffle()) return order;
  EpochStream stream(options_.seed(), static_cast<uint64_t>(epoch));
  for (size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[stream.below(i + 1)]);  // Fisher-Yates: j uniform in [0, i]
  }
  return order;
}

const std::vector<int64_t>& TokenBatcher::order_for(int64_t epoch) {
  if (cached_epoch_ != epoch) {
    order_ = epoch_order(epoch);
    cached_epoch_ = epoch;
  }
  return order_;
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
    const int64_t start = order[static_cast<size_t>(options_.rank() + k * W)] * T;
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = file_.token(start + t);
      targets[b * T + t] = file_.token(start + t + 1);
    }
  }
  if (++index_ == batches_per_epoch_) {
    ++epoch_;
    index_ = 0;
  }
  return batch;
}

void TokenBatcher::restore(const BatcherState& state) {
  MT_CHECK(state.seed == options_.seed(), "TokenBatcher::restore: ", file_.path(), ": the state's seed ", state.seed,
           " differs from this batcher's seed ", options_.seed());
  MT_CHECK(state.epoch >= 0, "TokenBatcher::restore: ", file_.path(), ": epoch must be non-negative, got ",
           state.epoch);
  MT_CHECK(state.index >= 0 && state.index < batches_per_epoch_, "TokenBatcher::restore: ", file_.path(), ": index ",
           state.index, " is outside [0, batches_per_epoch ", batches_per_epoch_, ")");
  epoch_ = state.epoch;
  index_ = state.index;
}

}  // namespace mt::data
