// Samples text from a language model directory (GPT-2 from mt_train or Hugging Face; Llama,
// Mistral, Qwen2), with or without a LoRA adapter, through the tokenizer saved in the model directory (or --tokenizer).
//
//   build/examples/mt_generate --model model/ --adapter adapter/ --prompt "The " --tokens 300
#include <CLI/CLI.hpp>

#include <cstdio>

#include "examples/lm/trainer.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"

int main(int argc, char** argv) {
  CLI::App app{"Generate text with a GPT-2 or Llama-family model, optionally with a LoRA adapter"};
  example::setup(app, "mt_generate");
  example::PlacementFlags placement_flags;
  std::string model_dir, adapter_dir, tokenizer_path, prompt = "The ";
  int64_t tokens = 200, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = example::kDefaultSeed;
  bool merge = false;
  placement_flags.add_to(app, example::AmpFlag::without);  // sampling runs in f32
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--adapter", adapter_dir, "LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--tokenizer", tokenizer_path,
                 "tokenizer directory or file (default: the model directory's, else bytes)");
  app.add_flag("--merge", merge, "merge the adapter into the weights before sampling (same text, faster)");
  app.add_option("--prompt", prompt, "text to continue")->capture_default_str();
  app.add_option("--tokens", tokens, "tokens to generate")->capture_default_str()->check(example::positive());
  app.add_option("--temperature", temperature, "softmax temperature (0: greedy)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--top-k", top_k, "sample among the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(example::non_negative());
  example::add_seed(app, seed, "sampling");
  CLI11_PARSE(app, argc, argv);

  try {
    const example::Placement placement = placement_flags.resolve();
    const std::shared_ptr<mt::nn::CausalLM> model = mt::nn::load_causal_lm(model_dir);
    const auto tokenizer = lm_example::tokenizer_for(tokenizer_path, model_dir);
    model->to(placement.device);
    if (!adapter_dir.empty()) {
      mt::nn::load_adapter(*model, adapter_dir);
      if (merge) mt::nn::merge_lora(*model);
    }
    model->eval();
    std::printf("%s\n", lm_example::sample_text(*model, *tokenizer, prompt, tokens, temperature, top_k, seed).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_generate: %s\n", e.what());
    return 2;
  }
  return 0;
}
