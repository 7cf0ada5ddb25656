#include "tokenizers/text_sources.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt::tok {
namespace fs = std::filesystem;
namespace {

bool is_jsonl(const fs::path& p) { return p.extension() == ".jsonl"; }

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

void add_directory(const fs::path& dir, std::vector<TextSource>& out) {
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  for (const auto& f : files) out.push_back({f.string(), is_jsonl(f), static_cast<uint64_t>(fs::file_size(f))});
}

}  // namespace

std::vector<TextSource> list_text_sources(const std::vector<std::string>& inputs) {
  std::vector<TextSource> out;
  for (const auto& input : inputs) {
    const fs::path p(input);
    std::error_code ec;
    const auto status = fs::status(p, ec);
    if (ec || !fs::exists(status)) detail::fail_file(input, "cannot open: No such file or directory");
    if (fs::is_directory(status)) {
      const size_t before = out.size();
      add_directory(p, out);
      if (out.size() == before) detail::fail_file(input, "the directory holds no files");
    } else {
      const auto bytes = fs::file_size(p, ec);  // a pipe has no size: its progress shows as 0 bytes
      out.push_back({input, is_jsonl(p), ec ? 0 : static_cast<uint64_t>(bytes)});
    }
  }
  MT_CHECK(!out.empty(), "no input files");
  return out;
}

std::string read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) detail::fail_file(path, "cannot open: ", std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;  // a directory opens but fails here with EISDIR
  const int err = errno;
  std::fclose(f);
  if (failed) detail::fail_file(path, "cannot read: ", std::strerror(err));
  return text;
}

nlohmann::json parse_jsonl_object(std::string_view line, const std::string& path, size_t line_number) {
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers too large
    detail::fail_file(path, "line ", line_number, ": not valid JSON: ", e.what());
  }
  if (!object.is_object()) detail::fail_file(path, "line ", line_number, ": not a JSON object");
  return object;
}

std::string jsonl_string_field(std::string_view line, const std::string& field, const std::string& path,
                               size_t line_number) {
  const nlohmann::json object = parse_jsonl_object(line, path, line_number);
  const auto it = object.find(field);
  if (it == object.end()) detail::fail_file(path, "line ", line_number, ": no \"", field, "\" field");
  if (!it->is_string()) detail::fail_file(path, "line ", line_number, ": \"", field, "\" is not a string");
  return it->get<std::string>();
}

void split_documents(const TextSource& source, const std::string& text, const std::string& field,
                     std::vector<std::string>& documents) {
  size_t begin = 0, line_number = 0;
  while (begin < text.size()) {
    if (source.jsonl) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      ++line_number;
      const std::string_view line(text.data() + begin, end - begin);
      if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
        documents.push_back(jsonl_string_field(line, field, source.path, line_number));
      }
      begin = end + 1;
    } else {
      size_t end = text.find("\n\n", begin);
      end = end == std::string::npos ? text.size() : end + 2;
      documents.push_back(text.substr(begin, end - begin));
      begin = end;
    }
  }
}

}  // namespace mt::tok
