#include "tokenizers/bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "tokenizers/utf8.h"

namespace mt::tok {
namespace {

std::atomic<uint64_t> next_cache_owner{1};

// One cache per thread, for the model used last on that thread (a thread normally encodes with
// one tokenizer); cleared when full so memory stays bounded on text with endless new words.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>> words;
  static constexpr size_t kMaxWords = 1 << 16;
};
thread_local WordCache word_cache;

std::string byte_token(unsigned b) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", b);
  return name;
}

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, TokenId> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
                   const std::string& where)
    : vocab_(std::move(vocab)), options_(options), cache_owner_(next_cache_owner++) {
  TokenId largest = 0;
  for (const auto& [token, id] : vocab_) largest = std::max(largest, id);
  // Ids index a table, so they must be about as dense as real vocabularies are: a stray huge id
  // would otherwise ask for gigabytes.
  if (largest >= 4 * vocab_.size() + 65536) {
    detail::fail_file(where, "the vocabulary's ids are sparse: the largest is ", largest, " for ", vocab_.size(),
                      " tokens");
  }
  id_to_token_.resize(vocab_.empty() ? 0 : size_t{largest} + 1);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    const int n = utf8_sequence_length(token, 0);
    if (!token.empty() && n == static_cast<int>(token.size())) char_ids_[decode_code_point(token, 0, n)] = id;
  }
  const auto id_of = [&](const std::string& token, size_t rank, const char* role) {
    const auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      detail::fail_file(where, "merge ", rank + 1, " ('", merges[rank].first, " ", merges[rank].second, "') names ",
                        role, " '", token, "', which is not in the vocabulary");
    }
    return it->second;
  };
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const TokenId left = id_of(merges[rank].first, rank, "the token");
    const TokenId right = id_of(merges[rank].second, rank, "the token");
    const TokenId merged = id_of(merges[rank].first + merges[rank].second, rank, "the merged token");
    merges_.emplace(pair_key(left, right), Merge{static_cast<uint32_t>(rank), merged});  // the first rank wins
  }
  for (unsigned b = 0; b < 256; ++b) {
    const auto it = vocab_.find(byte_token(b));
    if (it != vocab_.end()) byte_ids_[b] = it->second;
  }
  if (options_.unk_token) {
    const auto it = vocab_.find(*options_.unk_token);
    if (it == vocab_.end())
      detail::fail_file(where, "the unknown token '", *options_.unk_token, "' is not in the vocabulary");
    unk_id_ = it->second;
  }
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::id_to_token(TokenId id) const {
  static const std::string none;
  return id < id_to_token_.size() ? id_to_token_[id] : none;
}

// One symbol per character (its token id), or per byte for characters taken by byte_fallback;
// `bytes` gets each symbol's length (only used to find unknown runs).
void BpeModel::initial_symbols(std::string_view word, std::vector<TokenId>& ids, std::vector<uint32_t>& bytes) const {
  bool previous_unknown = false;
  for (size_t i = 0; i < word.size();) {
    int n = utf8_sequence_length(word, i);
    if (n == 0) n = 1;  // not reached: the text was made valid UTF-8 before
    const auto known = char_ids_.find(decode_code_point(word, i, n));
    if (known != char_ids_.end()) {
      ids.push_back(known->second);
      bytes.push_back(n);
      previous_unknown = false;
    } else if (options_.byte_fallback && [&] {
                 for (int k = 0; k < n; ++k) {
                   if (!byte_ids_[static_cast<unsigned char>(word[i + k])]) return false;
                 }
                 return true;
               }()) {
      for (int k = 0; k < n; ++k) {
        ids.push_back(*byte_ids_[static_cast<unsigned char>(word[i + k])]);
        bytes.push_back(1);
      }
      previous_unknown = false;
    } else if (unk_id_) {
      if (options_.fuse_unk && previous_unknown) {
        bytes.back() += n;
      } else {
        ids.push_back(*unk_id_);
        bytes.push_back(n);
      }
      previous_unknown = true;
    }
    i += n;
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  std::vector<TokenId> ids;
  std::vector<uint32_t> bytes;
  initial_symbols(word, ids, bytes);
  const int n = static_cast<int>(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;
    TokenId merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const auto it = merges_.find(pair_key(ids[left], ids[next[left]]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int right = next[top.pos];
    if (!alive[top.pos] || right < 0) continue;
    // Stale when either side changed since the candidate was pushed.
    const auto it = merges_.find(pair_key(ids[top.pos], ids[right]));
    if (it == merges_.end() || it->second.merged != top.merged) continue;
    ids[top.pos] = top.merged;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push_pair(prev[top.pos]);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

// A word's ids without the cache: with ignore_merges a word in the vocabulary is that one token.
void BpeModel::tokenize_uncached(std::string_view word, std::vector<TokenId>& out) const {
  if (options_.ignore_merges) {
    const auto whole = vocab_.find(std::string(word));
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  merge_word(word, out);
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (word.size() > kCachedWordBytes) {
    tokenize_uncached(word, out);
    return;
  }
  WordCache& cache = word_cache;
  if (cache.owner != cache_owner_ || cache.words.size() >= WordCache::kMaxWords) {
    cache.words.clear();
    cache.owner = cache_owner_;
  }
  auto [it, inserted] = cache.words.try_emplace(std::string(word));
  if (inserted) tokenize_uncached(word, it->second);
  out.insert(out.end(), it->second.begin(), it->second.end());
}

}  // namespace mt::tok
