#include "tokenizers/encode_parallel.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

namespace mt::tok {

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(n, 1)));
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto run = [&] {
    try {
      for (size_t i; (i = next++) < n;) work(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = n;
    }
  };
  // Fresh threads even for one: each starts with an empty word cache (tokenizers/bpe.h), so a
  // call costs the same whatever ran on the calling thread before.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(run);
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

std::vector<std::vector<TokenId>> encode_documents(const Tokenizer& tokenizer,
                                                   const std::vector<std::string_view>& documents,
                                                   bool add_special_tokens, int threads) {
  std::vector<std::vector<TokenId>> out(documents.size());
  parallel_for(documents.size(), threads,
               [&](size_t i) { out[i] = tokenizer.encode(documents[i], add_special_tokens); });
  return out;
}

}  // namespace mt::tok
