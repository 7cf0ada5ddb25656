// A tokenized corpus split over several token files (shards), opened as one.
//
// The source names the shards in one of three ways:
//   - a directory: every regular file in it (not in subdirectories) whose name ends in .bin,
//     .mtt, .tok or .tokens and does not start with a dot;
//   - a glob(3) pattern ("data/train_*.bin"), where the path is not itself a file or directory;
//   - a single token file.
// Shards are ordered by name, byte by byte (not by locale), so the order and every batch drawn
// from it are the same on every machine. Each shard is a TokenFile of any format it reads
// (MTTOKENS version 1 or 2, llm.c's .bin shards), opened and validated whole here; all of them
// must share one vocab_size. Windows are drawn from the shards by TokenBatcher, which never lets
// a window cross from one shard into the next.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/data/token_file.h"

namespace mt::data {

class TokenCorpus {
 public:
  // expected_vocab_size: as for TokenFile (the vocabulary of llm.c shards; MTTOKENS shards
  // must record this one). Throws FileError naming the source or the shard at fault.
  explicit TokenCorpus(const std::string& source, std::optional<int64_t> expected_vocab_size = std::nullopt);

  // The shard paths `source` names, in corpus order, without opening them. Throws FileError
  // when a directory holds no token file or a pattern matches nothing.
  static std::vector<std::string> shard_paths(const std::string& source);

  const std::string& source() const { return source_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const TokenFile& shard(int64_t i) const { return shards_.at(static_cast<size_t>(i)); }
  const std::vector<TokenFile>& shards() const { return shards_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t total_tokens() const { return total_tokens_; }
  bool has_loss_mask() const;  // true when any shard has one

 private:
  std::string source_;
  std::vector<TokenFile> shards_;  // [num_shards()], in name order
  int64_t vocab_size_ = 0;
  int64_t total_tokens_ = 0;
};

}  // namespace mt::data
