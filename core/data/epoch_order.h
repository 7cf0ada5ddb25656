// The per-epoch visiting order shared by the batchers (core/data/token_dataset.h,
// core/data/packed_batcher.h): one Fisher-Yates shuffle of [0, n) drawing from Philox
// (core/random.h) with rejection sampling, fixed by (seed, epoch) alone, so it is the same on
// every machine and standard library. Internal to core/data.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "core/random.h"

namespace mt::data::internal {

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

// [0, n) in the order of `epoch` (epoch >= 0): shuffled by (seed, epoch), or ascending when
// `shuffle` is false.
inline std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle || order.empty()) return order;
  EpochStream stream(seed, static_cast<uint64_t>(epoch));
  for (size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[stream.below(i + 1)]);  // Fisher-Yates: j uniform in [0, i]
  }
  return order;
}

}  // namespace mt::data::internal
