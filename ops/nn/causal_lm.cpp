#include "ops/nn/causal_lm.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/nn/gpt.h"
#include "ops/nn/llama.h"
#include "ops/ops.h"

namespace mt::nn {

void CausalLM::set_checkpointing(const std::string& mode) {
  MT_CHECK(mode == "off", "gradient checkpointing '", mode, "' is not implemented for ", model_type(),
           " models (only 'off')");
}

std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir) {
  const std::string config = dir + "/config.json";
  const std::string type = model_type_of(config);
  if (type == "gpt2" || type.empty()) return GPT::from_pretrained(dir);  // GPT-2 configs may omit model_type
  if (type == "llama" || type == "mistral" || type == "qwen2") return Llama::from_pretrained(dir);
  detail::fail_file(config, "model_type \"", type, "\" is not supported (gpt2, llama, mistral, qwen2)");
}

// ------------------------------------------------------------------ sampling

Tensor CausalLM::packed_loss(const Tensor&, const Tensor&, const PackedSequences&) const {
  MT_CHECK_T(NotImplementedError, false, "packed sequences: ", model_type(),
             " models do not implement them (the Llama family does: llama, mistral, qwen2)");
  return {};
}

Tensor CausalLM::forward_cached(const Tensor&, KVCache&) const {
  MT_CHECK_T(NotImplementedError, false, "forward_cached: ", model_type(), " models have no KV cache");
}

namespace {

// Draws an index from softmax(logits / temperature), restricted to the top_k largest and then to
// the smallest set of most likely tokens whose probabilities reach top_p.
int64_t sample_token(std::vector<double> logits, const GenerateOptions& options, Generator* generator) {
  const auto n = static_cast<int64_t>(logits.size());
  if (options.temperature == 0.0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (options.top_k > 0 && options.top_k < n) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[options.top_k - 1];
    for (double& l : logits) {
      if (l < kth) l = -INFINITY;
    }
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (double& l : logits) total += (l = std::exp((l - top) / options.temperature));
  if (options.top_p < 1.0) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    double kept = 0;
    size_t i = 0;
    for (; i < order.size() && kept < options.top_p * total; ++i) kept += logits[order[i]];
    for (; i < order.size(); ++i) logits[order[i]] = 0;
    total = kept;
  }
  const double u = rand({1}, {}, generator).item() * total;
  double running = 0;
  for (int64_t i = 0; i < n; ++i) {
    running += logits[i];
    if (u < running) return i;
  }
  return std::max_element(logits.begin(), logits.end()) - logits.begin();  // u rounded up to total
}

// The logits of the last position: [1, T, V] -> V values.
std::vector<double> last_logits(const Tensor& logits) {
  const int64_t t = logits.size(1);
  return logits.slice(1, t - 1, t).to_vector<double>();
}

}  // namespace

std::vector<int64_t> generate(const CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options,
                              Generator* generator) {
  MT_CHECK(!prompt.empty(), "generate: the prompt is empty");
  MT_CHECK(options.temperature >= 0, "generate: temperature must be >= 0, got ", options.temperature);
  MT_CHECK(options.top_k >= 0, "generate: top_k must be >= 0, got ", options.top_k);
  MT_CHECK(options.top_p > 0 && options.top_p <= 1, "generate: top_p must be in (0, 1], got ", options.top_p);
  for (size_t i = 0; i < prompt.size(); ++i) {
    MT_CHECK(prompt[i] >= 0 && prompt[i] < model.vocab_size(), "generate: prompt token ", prompt[i], " at position ", i,
             " is outside the vocabulary [0, ", model.vocab_size(), ")");
  }
  NoGradGuard no_grad;
  const Device device = model.parameters().front().device();
  const auto ids_tensor = [&](std::vector<int64_t>::const_iterator begin, std::vector<int64_t>::const_iterator end) {
    const std::vector<double> window(begin, end);
    return from_vector(window, {1, static_cast<int64_t>(window.size())}, DType::i64).to(device);
  };
  const int64_t limit = model.max_positions();
  KVCache cache;
  bool cached = options.use_cache && model.has_kv_cache() && static_cast<int64_t>(prompt.size()) < limit;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    std::vector<double> logits;
    if (cached && cache.length == 0) {
      logits = last_logits(model.forward_cached(ids_tensor(prompt.begin(), prompt.end()), cache));
    } else if (cached) {
      logits = last_logits(model.forward_cached(ids_tensor(prompt.end() - 1, prompt.end()), cache));
    } else {
      const auto context = std::min<int64_t>(static_cast<int64_t>(prompt.size()), limit);
      logits = last_logits(model.forward(ids_tensor(prompt.end() - context, prompt.end())));
    }
    const int64_t token = sample_token(std::move(logits), options, generator);
    prompt.push_back(token);
    if (options.on_token) options.on_token(token);
    if (options.stop_token && token == *options.stop_token) break;
    cached = cached && static_cast<int64_t>(prompt.size()) < limit;  // full context: recompute from the window
  }
  return prompt;
}

}  // namespace mt::nn
