// Encoding speed of a tokenizer on a text file: the file is cut into documents at blank lines,
// and each run encodes all of them, on one thread and then on all cores (encode_documents).
// Prints the median MB/s of --repeat runs of each, the token count and an FNV-1a hash of all
// ids in order, so that tools/bench/tokenize_bench.py can check that every tokenizer it times
// produced the same ids.
//   tokenize_bench --tokenizer DIR_OR_FILE --text FILE [--repeat 5] [--threads 0]
#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tokenizers/encode_parallel.h"
#include "tokenizers/tokenizer.h"
#include "tools/bench/bench_common.h"

namespace {

std::vector<std::string_view> documents_of(const std::string& text) {
  std::vector<std::string_view> docs;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find("\n\n", begin);
    end = end == std::string::npos ? text.size() : end + 2;
    docs.emplace_back(text.data() + begin, end - begin);
    begin = end;
  }
  return docs;
}

uint64_t fnv1a(const std::vector<std::vector<mt::tok::TokenId>>& all, size_t& count) {
  uint64_t h = 1469598103934665603ull;
  count = 0;
  for (const auto& ids : all) {
    for (const auto id : ids) {
      h = (h ^ id) * 1099511628211ull;
      ++count;
    }
  }
  return h;
}

double seconds_to_encode(const mt::tok::Tokenizer& t, const std::vector<std::string_view>& docs, int threads,
                         std::vector<std::vector<mt::tok::TokenId>>& out) {
  const auto start = std::chrono::steady_clock::now();
  out = mt::tok::encode_documents(t, docs, false, threads);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encoding speed of a tokenizer, one thread and all cores"};
  std::string tokenizer_path, text_path;
  int repeat = 5, threads = 0;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer directory or file")->required();
  app.add_option("--text", text_path, "text file")->required()->check(CLI::ExistingFile);
  app.add_option("--repeat", repeat, "timed runs of each (median)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "threads of the parallel runs (0: all cores)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto tokenizer = mt::tok::load_tokenizer(tokenizer_path);
    std::ifstream in(text_path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    const auto docs = documents_of(text);
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::vector<std::vector<mt::tok::TokenId>> ids;
    for (const int t : {1, threads}) {
      seconds_to_encode(*tokenizer, docs, t, ids);  // warm-up: pages, allocator; each run's word cache starts empty
      std::vector<double> runs;
      for (int r = 0; r < repeat; ++r) runs.push_back(seconds_to_encode(*tokenizer, docs, t, ids));
      size_t count = 0;
      const uint64_t hash = fnv1a(ids, count);
      std::printf(
          "tokenize_bench: %s threads=%s: %.2f MB/s (median of %d, %.1f MB, %zu documents), %zu tokens, "
          "ids fnv1a %016llx\n",
          t == 1 ? "one thread" : "all cores", t == 1 ? "1" : (threads ? std::to_string(threads).c_str() : "all"),
          mb / bench::median(runs), repeat, mb, docs.size(), count, static_cast<unsigned long long>(hash));
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenize_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
