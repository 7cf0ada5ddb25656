#include "train/model_directory.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace mt::train {

namespace fs = std::filesystem;

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
      "merges.txt",     "tokenizer.model",       "added_tokens.json"};
  return names;
}

std::vector<std::string> copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir) {
  std::error_code error;
  if (!fs::is_directory(from_dir, error)) detail::fail_file(from_dir, "not a directory");
  std::vector<std::string> copied;
  for (const std::string& name : tokenizer_file_names()) {
    const fs::path source = fs::path(from_dir) / name;
    if (!fs::is_regular_file(source, error)) continue;
    std::ifstream in(source, std::ios::binary);
    if (!in) detail::fail_file(source.string(), "cannot open for reading");
    std::stringstream content;
    content << in.rdbuf();
    fs::create_directories(to_dir, error);
    if (error) detail::fail_file(to_dir, "cannot create the directory (", error.message(), ")");
    write_file_atomically((fs::path(to_dir) / name).string(), "tokenizer file", content.str());
    copied.push_back(name);
  }
  return copied;
}

}  // namespace mt::train
