// Samples text from a language model directory (GPT-2 or the Llama family: llama, mistral,
// qwen2; from mt_train, mt_merge or Hugging Face), with or without a LoRA adapter, through the
// tokenizer saved in the model directory (or --tokenizer). The text is printed as it is drawn;
// a last line on stderr gives the count of tokens and the speed.
//
//   build/examples/mt_generate --model model/ --adapter adapter/ --prompt "The " --tokens 300
//   build/examples/mt_generate --model smollm2/ --prompt "Once upon a time" --top-p 0.9 --stop none
//
// Generation stops after --tokens tokens or after the stop token (the tokenizer's end-of-text
// token by default).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "examples/lm/trainer.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"

namespace {

// The id --stop names: a token id, a token's spelling in the vocabulary ("<|endoftext|>", "</s>"),
// or a text the tokenizer makes one token of ("\n"). Empty: the tokenizer's eos, if it has one.
std::optional<int64_t> stop_token(const std::string& flag, const mt::tok::Tokenizer& tokenizer, int64_t vocab_size) {
  if (flag == "none") return std::nullopt;
  if (flag.empty()) {
    const std::optional<mt::tok::TokenId> eos = tokenizer.special_tokens().eos;
    return eos ? std::optional<int64_t>(*eos) : std::nullopt;
  }
  if (std::all_of(flag.begin(), flag.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
    const int64_t id = flag.size() <= 18 ? std::stoll(flag) : vocab_size;
    MT_CHECK(id < vocab_size, "--stop ", flag, ": not a token id of this model (its vocabulary has ", vocab_size,
             " ids)");
    return id;
  }
  if (const std::optional<mt::tok::TokenId> id = tokenizer.token_to_id(flag)) return *id;
  const std::vector<mt::tok::TokenId> ids = tokenizer.encode(flag);
  std::string listed;
  for (const mt::tok::TokenId id : ids) listed += (listed.empty() ? "" : ", ") + std::to_string(id);
  MT_CHECK(ids.size() == 1, "--stop '", flag, "': not one token (the tokenizer makes ", ids.size(), " of it: [", listed,
           "]); give one token's text or its id, or none");
  return ids.front();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generate text with a GPT-2 or Llama-family model, optionally with a LoRA adapter"};
  example::setup(app, "mt_generate");
  example::PlacementFlags placement_flags;
  std::string model_dir, adapter_dir, tokenizer_path, prompt = "The ", stop, dtype = "auto";
  lm_example::SampleOptions sampling;
  sampling.new_tokens = 200;
  bool merge = false, no_cache = false;
  placement_flags.add_to(app, example::AmpFlag::without);  // --dtype instead: the weights' own
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--adapter", adapter_dir, "LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--tokenizer", tokenizer_path,
                 "tokenizer directory or file (default: the model directory's, else bytes)");
  app.add_flag("--merge", merge, "merge the adapter into the weights before sampling (same text, faster)");
  app.add_option("--dtype", dtype, "weights: auto (bf16 on a GPU, the checkpoint's dtype on the CPU), f32 or bf16")
      ->capture_default_str()
      ->check(example::one_of({"auto", "f32", "bf16"}));
  app.add_option("--prompt", prompt, "text to continue")->capture_default_str();
  app.add_option("--tokens", sampling.new_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--temperature", sampling.temperature, "softmax temperature (0: greedy)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--top-k", sampling.top_k, "sample among the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--top-p", sampling.top_p,
                 "nucleus sampling: among the most likely tokens whose probabilities add up to p (1: all)")
      ->capture_default_str()
      ->check(example::above_zero_up_to(1.0));
  app.add_option("--stop", stop,
                 "stop after this token: its id or its text (one token); default: the tokenizer's end-of-text "
                 "token, if it has one; none: never");
  app.add_flag("--no-cache", no_cache, "no KV cache: run the whole context again for every token (slower)");
  example::add_seed(app, sampling.seed, "sampling");
  CLI11_PARSE(app, argc, argv);

  try {
    const example::Placement placement = placement_flags.resolve();
    const std::shared_ptr<mt::nn::CausalLM> model = mt::nn::load_causal_lm(model_dir);
    const auto tokenizer = lm_example::tokenizer_for(tokenizer_path, model_dir);
    if (dtype == "f32" || dtype == "bf16") {
      model->to(mt::parse_dtype(dtype));
    } else if (placement.device.is_cuda()) {
      model->to(mt::DType::bf16);
    }
    model->to(placement.device);
    if (!adapter_dir.empty()) {
      mt::nn::load_adapter(*model, adapter_dir);  // LoRA factors in f32 (f64 over f64 weights), whatever the dtype
      if (merge) mt::nn::merge_lora(*model);
    }
    model->eval();
    sampling.stop_token = stop_token(stop, *tokenizer, model->vocab_size());
    sampling.use_cache = !no_cache;
    const lm_example::SampleResult result =
        lm_example::sample(*model, *tokenizer, prompt, sampling, [](const std::string& piece) {
          std::fputs(piece.c_str(), stdout);
          std::fflush(stdout);
        });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    std::fprintf(stderr, "mt_generate: %lld tokens in %.2f s (%.1f tokens/s), prompt %lld tokens\n",
                 static_cast<long long>(result.new_tokens), result.seconds,
                 result.seconds > 0 ? static_cast<double>(result.new_tokens) / result.seconds : 0.0,
                 static_cast<long long>(result.prompt_tokens));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_generate: %s\n", e.what());
    return 2;
  }
  return 0;
}
