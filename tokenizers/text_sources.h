// Where training text comes from, as documents: the inputs of mt_tokenize.
//
//   a text file        cut into documents at blank lines ("\n\n"): each paragraph block is
//                      encoded on its own, so a corpus of one big file still uses every core
//   a .jsonl file      one document per line, the string in field `field` ("text")
//   a directory        every regular file under it, recursively, in byte order of the paths;
//                      names starting with a dot are skipped
//
// Errors name the file and, for JSONL, the line: a line that is not JSON, not an object, or
// lacks the field or has a non-string there.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace mt::tok {

struct TextSource {
  std::string path;
  bool jsonl = false;
  uint64_t bytes = 0;
};

// The files `inputs` name, in order (a directory's files in path order). Throws FileError for a
// path that does not exist, and for inputs that hold no file at all.
std::vector<TextSource> list_text_sources(const std::vector<std::string>& inputs);

// Reads the whole file (FileError naming it when that fails).
std::string read_whole_file(const std::string& path);

// Appends the documents of `text`, the contents of `source`, to `documents`.
void split_documents(const TextSource& source, const std::string& text, const std::string& field,
                     std::vector<std::string>& documents);

// The JSON object on line `line_number` of `path` (FileError naming both when it is not one).
nlohmann::json parse_jsonl_object(std::string_view line, const std::string& path, size_t line_number);

// The string `field` of the JSON object on line `line_number` of `path`.
std::string jsonl_string_field(std::string_view line, const std::string& field, const std::string& path,
                               size_t line_number);

}  // namespace mt::tok
