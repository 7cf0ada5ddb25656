// Encoding many documents on all cores: each thread takes the next document, results in order.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace mt::tok {

// Calls work(i) for each i in [0, n) on `threads` fresh threads (<= 0: all hardware threads),
// each taking the next index. An exception on any thread is rethrown here once all have stopped.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work);

// The ids of each document, in the documents' order. threads <= 0: all hardware threads.
// An exception on any thread is rethrown here, after every thread has stopped.
std::vector<std::vector<TokenId>> encode_documents(const Tokenizer& tokenizer,
                                                   const std::vector<std::string_view>& documents,
                                                   bool add_special_tokens = false, int threads = 0);

}  // namespace mt::tok
