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

namespace {

// Draws an index from softmax(logits / temperature) restricted to the top_k largest.
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
  const double u = rand({1}, {}, generator).item() * total;
  double running = 0;
  for (int64_t i = 0; i < n; ++i) {
    running += logits[i];
    if (u < running) return i;
  }
  return std::max_element(logits.begin(), logits.end()) - logits.begin();  // u rounded up to total
}

}  // namespace

std::vector<int64_t> generate(const CausalLM& model, std::vector<int64_t> prompt, const GenerateOptions& options,
                              Generator* generator) {
  MT_CHECK(!prompt.empty(), "generate: the prompt is empty");
  MT_CHECK(options.temperature >= 0, "generate: temperature must be >= 0, got ", options.temperature);
  MT_CHECK(options.top_k >= 0, "generate: top_k must be >= 0, got ", options.top_k);
  for (size_t i = 0; i < prompt.size(); ++i) {
    MT_CHECK(prompt[i] >= 0 && prompt[i] < model.vocab_size(), "generate: prompt token ", prompt[i], " at position ", i,
             " is outside the vocabulary [0, ", model.vocab_size(), ")");
  }
  NoGradGuard no_grad;
  const Device device = model.parameters().front().device();
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const auto context =
        static_cast<int64_t>(std::min<size_t>(prompt.size(), static_cast<size_t>(model.max_positions())));
    std::vector<double> window(prompt.end() - context, prompt.end());
    const Tensor ids = from_vector(window, {1, context}, DType::i64).to(device);  // [1, T]
    const Tensor last = model.forward(ids).slice(1, context - 1, context);        // [1, 1, V]
    prompt.push_back(sample_token(last.to_vector<double>(), options, generator));
  }
  return prompt;
}

}  // namespace mt::nn
