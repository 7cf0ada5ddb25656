// Encodes and decodes every fixture case with every fixture tokenizer and prints one JSON line
// per (tokenizer, case), in the format of tests/fixtures/tokenizers/expected.jsonl, for
// check_ids.py to compare with Hugging Face's tokenizers run there and then.
//   tokenize_cases FIXTURE_DIR
#include <iostream>

#include "tests/tokenizers/fixture_cases.h"
#include "tokenizers/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenize_cases FIXTURE_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    const auto cases = mt::tok::fixtures::read_cases(dir + "/cases.jsonl");
    for (const auto& [name, file] : mt::tok::fixtures::tokenizer_files()) {
      const auto tokenizer = mt::tok::load_tokenizer(dir + "/" + file);
      for (const auto& c : cases) {
        const auto ids = tokenizer->encode(c.text);
        nlohmann::json line = {{"tokenizer", name},
                               {"name", c.name},
                               {"ids", ids},
                               {"ids_special", tokenizer->encode(c.text, true)},
                               {"decoded_hex", mt::tok::fixtures::to_hex(tokenizer->decode(ids))}};
        std::cout << line.dump() << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenize_cases: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
