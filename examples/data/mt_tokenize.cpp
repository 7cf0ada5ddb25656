// Turns text into token files for training, with any tokenizer tokenizers/ loads.
//
//   mt_tokenize --tokenizer models/llama3 --output train.tok --val-output val.tok corpus/ extra.jsonl
//   mt_tokenize --tokenizer models/gpt2 --output shards/ --shard-tokens 100000000 corpus/
//   mt_tokenize --tokenizer models/llama3 --format prompt-completion --output sft.tok data.jsonl
//   mt_tokenize --tokenizer models/llama3 --format messages --output chat.tok chat.jsonl
//     --role-template 'user=<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>'
//     --role-template 'assistant=<|start_header_id|>assistant<|end_header_id|>\n\n{content}<|eot_id|>'
//
// --format text: inputs are text files (cut into documents at blank lines), .jsonl files (the
// --field string of each line) and directories of them (tokenizers/text_sources.h). Documents are
// encoded on all cores, in order; the documents of different files and lines are separated by the
// tokenizer's eos token, or by "\n\n" when it has none (the byte tokenizer).
// --format prompt-completion | messages: JSONL fine-tuning examples, written with a loss mask so
// that only completions are trained on (tokenizers/finetune_data.h), and with each example's
// start (core/data/token_file.h), so that a trainer can pack several examples into one row and
// keep them apart (core/data/packed_batcher.h). Every file then begins at an example start: the
// train/validation split and the shard ends move back to the nearest example start at or before
// them (forward past an example longer than a shard, so that no file is empty).
//
// With --val-output, the last --val-fraction of the tokens becomes the validation file: a held-out
// tail rather than a random sample, so no validation text also appears in training. The tokens are
// held in memory until written (5 bytes each with a mask, 4 without), which bounds the corpus one
// run takes; tokenize a larger one in parts, each into the same --shard-tokens directory with its
// own --shard-prefix.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "core/data/token_file.h"
#include "core/error.h"
#include "core/format.h"
#include "examples/common/cli.h"
#include "tokenizers/encode_parallel.h"
#include "tokenizers/finetune_data.h"
#include "tokenizers/text_sources.h"
#include "tokenizers/tokenizer.h"
#include "train/progress.h"

namespace {

using mt::with_commas;
using mt::tok::TokenId;

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

struct Options {
  std::string tokenizer = "bytes", format = "text", field = "text", output, val_output, shard_prefix = "shard";
  double val_fraction = 0.1;
  int64_t shard_tokens = 0;
  int threads = 0;
  std::vector<std::string> role_templates, inputs;
};

// All tokens of the run, with their loss mask and example starts when the format has them.
struct Stream {
  std::vector<TokenId> ids;
  std::vector<uint8_t> mask;
  std::vector<uint64_t> starts;  // ascending: the first token of each example (fine-tuning formats)
  bool masked = false;

  // The last example start at or before `at` that is after `after`, else the first after `at`,
  // else `end`: where a file that begins at `after` should end near `at`.
  size_t example_boundary(size_t after, size_t at, size_t end) const {
    auto it = std::upper_bound(starts.begin(), starts.end(), at);
    if (it != starts.begin() && *std::prev(it) > after) return *std::prev(it);
    return it != starts.end() && *it < end ? static_cast<size_t>(*it) : end;
  }
  // The starts in [from, to), relative to `from`.
  std::vector<uint64_t> starts_in(size_t from, size_t to) const {
    std::vector<uint64_t> relative;
    for (auto it = std::lower_bound(starts.begin(), starts.end(), from); it != starts.end() && *it < to; ++it) {
      relative.push_back(*it - from);
    }
    return relative;
  }
};

// Reads sources a batch of about kBatchBytes at a time, so that memory holds one batch of text.
constexpr uint64_t kBatchBytes = 64ull << 20;

class Tokenize {
 public:
  Tokenize(const Options& o, const mt::tok::Tokenizer& t)
      : o_(o), t_(t), sources_(mt::tok::list_text_sources(o.inputs)) {
    for (const auto& s : sources_) total_bytes_ += s.bytes;
    stream_.masked = o.format != "text";
    if (o.format == "messages") roles_ = mt::tok::RoleTemplate::parse(o.role_templates);
    MT_CHECK(o.format != "messages" || !roles_.empty(),
             "--format messages needs --role-template ROLE=TEXT for each role");
    const auto eos = t.special_tokens().eos;
    separator_ = eos ? std::vector<TokenId>{*eos} : t.encode("\n\n");
  }

  Stream run() {
    mt::train::ProgressBar bar("mt_tokenize", static_cast<int64_t>(total_bytes_));
    const auto start = std::chrono::steady_clock::now();
    for (size_t next = 0; next < sources_.size();) {
      uint64_t batch_bytes = 0;
      std::vector<size_t> batch;
      while (next < sources_.size() && (batch.empty() || batch_bytes < kBatchBytes)) {
        batch_bytes += sources_[next].bytes;
        batch.push_back(next++);
      }
      stream_.masked ? add_examples(batch) : add_documents(batch);
      done_bytes_ += batch_bytes;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::vector<std::string> fields = {
          mt::detail::str_cat(with_commas(static_cast<int64_t>(done_bytes_ >> 20)), " MiB"),
          mt::detail::str_cat(with_commas(static_cast<int64_t>(stream_.ids.size())), " tokens"),
          mt::detail::str_cat(fixed(static_cast<double>(stream_.ids.size()) / std::max(seconds, 1e-9) / 1e6, 2),
                              "M tokens/s")};
      if (bar.draws()) {
        bar.update(static_cast<int64_t>(done_bytes_), static_cast<int64_t>(done_bytes_), fields);
      }
    }
    bar.close();
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(stream_);
  }

  size_t num_sources() const { return sources_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }
  int64_t documents() const { return documents_; }
  double seconds() const { return seconds_; }

 private:
  void separate() {
    if (stream_.ids.empty()) return;
    stream_.ids.insert(stream_.ids.end(), separator_.begin(), separator_.end());
  }

  void add_documents(const std::vector<size_t>& batch) {
    std::vector<std::string> docs;
    std::vector<size_t> first_doc_of_file;
    for (const size_t s : batch) {
      first_doc_of_file.push_back(docs.size());
      mt::tok::split_documents(sources_[s], mt::tok::read_whole_file(sources_[s].path), o_.field, docs);
    }
    MT_CHECK(!docs.empty() || done_bytes_ > 0 || sources_.size() > batch.size(), "the input file '", o_.inputs[0],
             "' is empty; there is nothing to tokenize");
    const std::vector<std::string_view> views(docs.begin(), docs.end());
    const auto ids = mt::tok::encode_documents(t_, views, false, o_.threads);
    size_t file = 0;
    for (size_t d = 0; d < ids.size(); ++d) {
      const bool new_file = file < first_doc_of_file.size() && d == first_doc_of_file[file];
      while (file < first_doc_of_file.size() && d == first_doc_of_file[file]) ++file;
      // Documents from separate files or JSONL lines are separate texts; paragraphs of one file are not.
      if (new_file || sources_[batch[file - 1]].jsonl) separate();
      stream_.ids.insert(stream_.ids.end(), ids[d].begin(), ids[d].end());
    }
    documents_ += static_cast<int64_t>(docs.size());
  }

  void add_examples(const std::vector<size_t>& batch) {
    for (const size_t s : batch) {
      const std::string text = mt::tok::read_whole_file(sources_[s].path);
      std::vector<std::string_view> lines;
      for (size_t begin = 0; begin < text.size();) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        lines.emplace_back(text.data() + begin, end - begin);
        begin = end + 1;
      }
      std::vector<mt::tok::MaskedIds> examples(lines.size());
      mt::tok::parallel_for(lines.size(), o_.threads, [&](size_t i) {
        if (lines[i].find_first_not_of(" \t\r") == std::string_view::npos) return;
        examples[i] = o_.format == "messages"
                          ? mt::tok::encode_messages(t_, roles_, lines[i], sources_[s].path, i + 1)
                          : mt::tok::encode_prompt_completion(t_, lines[i], sources_[s].path, i + 1);
      });
      for (auto& e : examples) {
        if (e.ids.empty()) continue;
        stream_.starts.push_back(stream_.ids.size());
        stream_.ids.insert(stream_.ids.end(), e.ids.begin(), e.ids.end());
        stream_.mask.insert(stream_.mask.end(), e.loss_mask.begin(), e.loss_mask.end());
        ++documents_;
      }
    }
  }

  const Options& o_;
  const mt::tok::Tokenizer& t_;
  std::vector<mt::tok::TextSource> sources_;
  mt::tok::RoleTemplate roles_;
  std::vector<TokenId> separator_;
  uint64_t total_bytes_ = 0, done_bytes_ = 0;
  int64_t documents_ = 0;
  double seconds_ = 0;
  Stream stream_;
};

// What write_tokens wrote: where, how many examples (fine-tuning formats), and how many shards
// hold more than --shard-tokens because one example is longer.
struct Written {
  std::string where;
  int64_t examples = 0;
  int64_t oversized = 0;
};

// Writes tokens [begin, end) to `path`, or as shards of about --shard-tokens into the directory
// `path`; with example starts, each shard ends at one (see the top of this file).
Written write_tokens(const Options& o, const Stream& s, size_t begin, size_t end, const std::string& path,
                     int64_t vocab, bool shard) {
  Written written;
  const auto write_one = [&](const std::string& file, size_t from, size_t to) {
    const std::vector<uint64_t> starts = s.masked ? s.starts_in(from, to) : std::vector<uint64_t>();
    mt::data::write_token_file(file, s.ids.data() + from, to - from, vocab, s.masked ? s.mask.data() + from : nullptr,
                               s.masked ? starts.data() : nullptr, starts.size());
    written.examples += static_cast<int64_t>(starts.size());
  };
  if (!shard) {
    write_one(path, begin, end);
    written.where = path;
    return written;
  }
  std::filesystem::create_directories(path);
  int index = 0;
  for (size_t from = begin; from < end; ++index) {
    const size_t goal = std::min(end, from + static_cast<size_t>(o.shard_tokens));
    const size_t to = s.masked && goal < end ? s.example_boundary(from, goal, end) : goal;
    written.oversized += to - from > static_cast<size_t>(o.shard_tokens);
    char name[64];
    std::snprintf(name, sizeof name, "%s-%06d.mtt", o.shard_prefix.c_str(), index);
    write_one((std::filesystem::path(path) / name).string(), from, to);
    from = to;
  }
  written.where = mt::detail::str_cat(path, "/", o.shard_prefix, "-*.mtt, ", index, index == 1 ? " shard" : " shards");
  return written;
}

// " in 1,234 examples" for the fine-tuning formats; "" for text.
std::string examples_of(const Stream& s, const Written& w) {
  return s.masked ? mt::detail::str_cat(" in ", with_commas(w.examples), w.examples == 1 ? " example" : " examples")
                  : std::string();
}

int run(const Options& o) {
  const auto tokenizer = mt::tok::load_tokenizer(o.tokenizer);
  Tokenize job(o, *tokenizer);
  const Stream stream = job.run();
  MT_CHECK(!stream.ids.empty(), "the input file '", o.inputs[0], "' is empty; there is nothing to tokenize");
  const size_t n = stream.ids.size();
  size_t n_val = o.val_output.empty() ? 0 : static_cast<size_t>(std::llround(o.val_fraction * static_cast<double>(n)));
  // The validation file must begin at an example start too.
  const size_t fraction_split = n - n_val;
  if (stream.masked && n_val > 0 && n_val < n) n_val = n - stream.example_boundary(0, fraction_split, n);
  const size_t n_train = n - n_val;
  MT_CHECK(n_train >= 1, with_commas(static_cast<int64_t>(n)), " tokens leave no training tokens with --val-fraction ",
           o.val_fraction);
  MT_CHECK(o.val_output.empty() || n_val >= 1, with_commas(static_cast<int64_t>(n)),
           " tokens leave no validation tokens with --val-fraction ", o.val_fraction);
  const int64_t vocab = tokenizer->vocab_size();
  const Written train = write_tokens(o, stream, 0, n_train, o.output, vocab, o.shard_tokens > 0);
  std::string summary = mt::detail::str_cat(
      "mt_tokenize: ", job.num_sources(), job.num_sources() == 1 ? " file, " : " files, ",
      with_commas(static_cast<int64_t>(job.total_bytes())), " bytes, ", with_commas(job.documents()),
      stream.masked ? " examples" : " documents", " -> train ", with_commas(static_cast<int64_t>(n_train)), " tokens",
      examples_of(stream, train), " (", train.where, ")");
  if (n_val > 0) {
    const Written val = write_tokens(o, stream, n_train, n, o.val_output, vocab, false);
    summary += mt::detail::str_cat(", val ", with_commas(static_cast<int64_t>(n_val)), " tokens",
                                   examples_of(stream, val), " (", o.val_output, ")");
  }
  if (n_train != fraction_split && n_val > 0) {
    summary += mt::detail::str_cat(", the split moved from token ", with_commas(static_cast<int64_t>(fraction_split)),
                                   " to the example start at ", with_commas(static_cast<int64_t>(n_train)));
  }
  if (train.oversized > 0) {
    summary += mt::detail::str_cat(", ", train.oversized, train.oversized == 1 ? " shard holds" : " shards hold",
                                   " more than --shard-tokens to end at an example start");
  }
  if (stream.masked) {
    size_t trained = 0;
    for (const auto m : stream.mask) trained += m;
    summary += mt::detail::str_cat(", ", fixed(100.0 * trained / n, 1), "% of tokens trained on");
  }
  summary += mt::detail::str_cat("; ", fixed(job.total_bytes() / std::max(job.seconds(), 1e-9) / 1e6, 1), " MB/s; ",
                                 tokenizer->description());
  std::printf("%s\n", summary.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize text, JSONL and fine-tuning examples into token files"};
  example::setup(app, "mt_tokenize");
  Options o;
  app.add_option("--tokenizer", o.tokenizer,
                 "tokenizer directory or file (tokenizer.json, vocab.json + merges.txt, tokenizer.model) or 'bytes'")
      ->capture_default_str();
  app.add_option("--format", o.format, "text, prompt-completion or messages (JSONL fine-tuning examples)")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "prompt-completion", "messages"}));
  app.add_option("--field", o.field, "the string field of .jsonl lines (--format text)")->capture_default_str();
  app.add_option("--role-template", o.role_templates, "ROLE=TEXT with {content}, one per role (--format messages)");
  app.add_option("--output", o.output, "token file, or directory of shards with --shard-tokens")->required();
  auto* val_option = app.add_option("--val-output", o.val_output, "token file for the validation tokens (the tail)");
  app.add_option("--val-fraction", o.val_fraction, "fraction of the tokens, taken from the end, for --val-output")
      ->capture_default_str()
      ->check(example::range(0.0, 1.0))
      ->needs(val_option);
  app.add_option("--shard-tokens", o.shard_tokens, "tokens per shard; --output becomes a directory (0: one file)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--shard-prefix", o.shard_prefix, "shard file names: PREFIX-000000.mtt, ...")->capture_default_str();
  app.add_option("--threads", o.threads, "encoding threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("inputs", o.inputs, "text files, .jsonl files and directories, in this order")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_tokenize: %s\n", e.what());
    return 2;
  }
}
