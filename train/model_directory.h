// A model directory in Hugging Face's layout (config.json, model.safetensors) keeps the files of
// its tokenizer beside the weights, so that whoever loads the model can turn text into its ids.
// Programs that write a model directory from another one (a fine-tune, an export from a
// checkpoint) carry those files over with copy_tokenizer_files.
#pragma once

#include <string>
#include <vector>

namespace mt::train {

// The file names a tokenizer may consist of: tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, vocab.json, merges.txt, tokenizer.model, added_tokens.json.
const std::vector<std::string>& tokenizer_file_names();

// Copies those of them present in `from_dir` into `to_dir` (created if needed), each atomically;
// returns the names copied. A `from_dir` that does not exist is a FileError; one without any of
// the files copies nothing.
std::vector<std::string> copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir);

}  // namespace mt::train
