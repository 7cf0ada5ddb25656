#include "tokenizers/encode_parallel.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

namespace mt::tok {

std::vector<std::vector<TokenId>> encode_documents(const Tokenizer& tokenizer,
                                                   const std::vector<std::string_view>& documents,
                                                   bool add_special_tokens, int threads) {
  std::vector<std::vector<TokenId>> out(documents.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(documents.size(), 1)));
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto work = [&] {
    try {
      for (size_t i; (i = next++) < documents.size();) out[i] = tokenizer.encode(documents[i], add_special_tokens);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = documents.size();
    }
  };
  // Fresh threads even for one: each starts with an empty word cache (tokenizers/bpe.h), so a
  // call costs the same whatever ran on the calling thread before.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
  return out;
}

}  // namespace mt::tok
