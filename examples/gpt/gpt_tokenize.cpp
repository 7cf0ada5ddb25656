// Turns text files into token files for GPT training, with the byte-level tokenizer.
//
//   build/examples/gpt_tokenize --output train.tok --val-output val.tok --val-fraction 0.1 a.txt b.txt
//
// The files are concatenated in the order given, separated by "\n\n" (a paragraph break the
// model can learn as a document boundary), and tokenized byte for byte. With --val-output the
// last --val-fraction of the tokens (rounded to the nearest token) becomes the validation file: a held-out tail
// rather than a random sample, so no validation text also appears in training.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/data/byte_tokenizer.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "core/format.h"
#include "examples/common/cli.h"

namespace {

std::string read_text_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw mt::FileError(mt::detail::str_cat(path, ": cannot open: ", std::strerror(errno)));
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;  // a directory opens but fails here with EISDIR
  const int err = errno;
  std::fclose(f);
  if (failed) throw mt::FileError(mt::detail::str_cat(path, ": cannot read: ", std::strerror(err)));
  return text;
}

using mt::with_commas;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize text files (byte-level, vocabulary 256) into token files for GPT training"};
  example::setup(app, "gpt_tokenize");
  std::string output;
  std::string val_output;
  double val_fraction = 0.1;
  std::vector<std::string> inputs;
  app.add_option("--output", output, "token file for the training tokens")->required();
  auto* val_option = app.add_option("--val-output", val_output, "token file for the validation tokens (the tail)");
  app.add_option("--val-fraction", val_fraction, "fraction of the tokens, taken from the end, for --val-output")
      ->capture_default_str()
      ->check(example::range(0.0, 1.0))
      ->needs(val_option);
  app.add_option("files", inputs, "text files, concatenated in this order")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    std::string text;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (i > 0) text += "\n\n";
      text += read_text_file(inputs[i]);
    }
    MT_CHECK(!text.empty(), "the input file '", inputs[0], "' is empty; there is nothing to tokenize");
    const std::vector<uint16_t> tokens = mt::data::ByteTokenizer().encode(text);
    const int64_t vocab = mt::data::ByteTokenizer::kVocabSize;
    const size_t n_val =
        val_output.empty() ? 0 : static_cast<size_t>(std::llround(val_fraction * static_cast<double>(tokens.size())));
    const size_t n_train = tokens.size() - n_val;
    MT_CHECK(n_train >= 1, with_commas(tokens.size()), " tokens leave no training tokens with ", "--val-fraction ",
             val_fraction);
    MT_CHECK(val_output.empty() || n_val >= 1, with_commas(tokens.size()),
             " tokens leave no validation tokens with --val-fraction ", val_fraction);
    mt::data::write_token_file(output, tokens.data(), n_train, vocab);
    std::string summary = mt::detail::str_cat("gpt_tokenize: ", inputs.size(),
                                              inputs.size() == 1 ? " file, " : " files, ", with_commas(text.size()),
                                              " bytes -> train ", with_commas(n_train), " tokens (", output, ")");
    if (!val_output.empty()) {
      mt::data::write_token_file(val_output, tokens.data() + n_train, n_val, vocab);
      summary += mt::detail::str_cat(", val ", with_commas(n_val), " tokens (", val_output, ")");
    }
    std::printf("%s\n", summary.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_tokenize: %s\n", e.what());
    return 2;
  }
  return 0;
}
