// The tokenizer fixtures of tests/fixtures/tokenizers: which file each named tokenizer loads
// from, and the test strings (hex in cases.jsonl, so that invalid UTF-8 can be stored).
#pragma once

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::tok::fixtures {

inline const std::map<std::string, std::string>& tokenizer_files() {
  static const std::map<std::string, std::string> files = {{"gpt2", "gpt2/tokenizer.json"},
                                                           {"gpt2-files", "gpt2/vocab.json"},
                                                           {"llama3", "llama3/tokenizer.json"},
                                                           {"metaspace", "metaspace/tokenizer.json"},
                                                           {"sentencepiece", "sentencepiece/tokenizer.model"},
                                                           {"sentencepiece-json", "sentencepiece/tokenizer.json"}};
  return files;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

struct Case {
  std::string name, text;
};

inline std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<Case> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    cases.push_back({j.at("name").get<std::string>(), from_hex(j.at("hex").get<std::string>())});
  }
  return cases;
}

}  // namespace mt::tok::fixtures
