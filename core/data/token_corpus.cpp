#include "core/data/token_corpus.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;
using detail::fail_file;

constexpr std::array<const char*, 4> kShardExtensions = {".bin", ".mtt", ".tok", ".tokens"};

bool is_shard_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;  // hidden files, and the writer's temporaries
  const std::string extension = fs::path(name).extension().string();
  return std::find(kShardExtensions.begin(), kShardExtensions.end(), extension) != kShardExtensions.end();
}

// std::string's operator< compares bytes, never the locale's collation.
void sort_by_name(std::vector<std::string>& paths) { std::sort(paths.begin(), paths.end()); }

std::vector<std::string> directory_shards(const std::string& dir) {
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error) fail_file(dir, "cannot list the corpus directory: ", error.message());
  std::vector<std::string> paths;
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    std::error_code status_error;  // a dangling link is no shard: skipped
    if (it->is_regular_file(status_error) && is_shard_name(it->path().filename().string())) {
      paths.push_back(it->path().string());
    }
  }
  if (error) fail_file(dir, "cannot list the corpus directory: ", error.message());
  if (paths.empty()) {
    fail_file(dir, "the corpus directory holds no token file (*.bin, *.mtt, *.tok or *.tokens)");
  }
  sort_by_name(paths);
  return paths;
}

std::vector<std::string> glob_shards(const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + (rc == 0 ? matches.gl_pathc : 0));
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH) fail_file(pattern, "no file matches this corpus pattern");
  if (rc != 0)
    fail_file(pattern, "cannot expand the corpus pattern: ",
              rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory");
  sort_by_name(paths);
  return paths;
}

bool has_glob_characters(const std::string& source) { return source.find_first_of("*?[") != std::string::npos; }

}  // namespace

std::vector<std::string> TokenCorpus::shard_paths(const std::string& source) {
  MT_CHECK(!source.empty(), "TokenCorpus: the corpus source is empty (a directory, a glob pattern or a file)");
  struct stat st {};
  const bool exists = ::stat(source.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) return directory_shards(source);
  if (!exists && has_glob_characters(source)) return glob_shards(source);
  return {source};  // one file; TokenFile says what is wrong with it, if anything
}

TokenCorpus::TokenCorpus(const std::string& source, std::optional<int64_t> expected_vocab_size) : source_(source) {
  for (const std::string& path : shard_paths(source)) {
    TokenFile shard(path, expected_vocab_size);
    if (!shards_.empty() && shard.vocab_size() != vocab_size_) {
      fail_file(path, "vocab_size ", shard.vocab_size(), " differs from the vocab_size ", vocab_size_, " of ",
                shards_.front().path(), ": the shards of the corpus ", source, " must share one vocabulary");
    }
    vocab_size_ = shard.vocab_size();
    total_tokens_ += shard.size();
    shards_.push_back(std::move(shard));
  }
}

bool TokenCorpus::has_loss_mask() const {
  return std::any_of(shards_.begin(), shards_.end(), [](const TokenFile& f) { return f.has_loss_mask(); });
}

}  // namespace mt::data
