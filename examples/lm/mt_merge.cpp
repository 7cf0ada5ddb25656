// Merges a LoRA adapter (from mt_lora or PEFT) into its base model (GPT-2 or the Llama family)
// and saves the result as a plain model directory: PEFT's merge_and_unload, then
// save_pretrained. The merged model loads without the adapter in mt_generate, mt_lora --base,
// mt_train --init-from and transformers. The weights keep the base's dtype: a bf16 base gives a
// bf16 model, rounded once (Note [LoRA merge precision] in ops/nn/lora.h). The tokenizer files of
// the base (or of --tokenizer) are copied beside it.
//
//   build/examples/mt_merge --model model/ --adapter adapter/ --out merged/
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "examples/lm/trainer.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "train/model_directory.h"

int main(int argc, char** argv) {
  CLI::App app{"Merge a LoRA adapter into its GPT-2 or Llama-family base model and save the merged model"};
  example::setup(app, "mt_merge");
  example::PlacementFlags placement_flags;
  std::string model_dir, adapter_dir, out, tokenizer_path;
  placement_flags.add_to(app, example::AmpFlag::without);  // the weights keep their dtype
  app.add_option("--model", model_dir, "base model directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--adapter", adapter_dir, "LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--out", out, "directory to save the merged model to (config.json, model.safetensors)")->required();
  app.add_option("--tokenizer", tokenizer_path,
                 "copy the tokenizer files of this directory or file (default: --model's, if it has any)");
  CLI11_PARSE(app, argc, argv);

  namespace fs = std::filesystem;
  try {
    // The base's weights may still be read from its files while the merged ones are written.
    MT_CHECK(!fs::exists(out) || !fs::equivalent(out, model_dir), "--out ", out,
             " is the base model's directory; write the merged model to another one");
    const example::Placement placement = placement_flags.resolve();
    const std::shared_ptr<mt::nn::CausalLM> model = mt::nn::load_causal_lm(model_dir);
    const mt::DType dtype = model->parameters().front().dtype();
    const int64_t parameters = model->num_parameters();
    model->to(placement.device);
    mt::nn::load_adapter(*model, adapter_dir);  // checked against the model before it changes anything
    const auto layers = mt::nn::lora_layers(*model);
    const mt::nn::LoRAOptions& lora = layers.front().second->options();
    std::string targets = lora.target_regex;
    for (const std::string& target : lora.target_modules) targets += (targets.empty() ? "" : ",") + target;
    std::printf("mt_merge: %s model %s (%s parameters, %s) + adapter %s (LoRA r=%lld alpha=%g%s on %zu layers: %s)\n",
                model->model_type().c_str(), model_dir.c_str(), lm_example::with_commas(parameters).c_str(),
                mt::dtype_name(dtype), adapter_dir.c_str(), static_cast<long long>(lora.r), lora.alpha,
                lora.use_rslora ? " rsLoRA" : "", layers.size(), targets.c_str());

    mt::nn::merge_and_unload(*model);
    model->save_pretrained(out);
    const std::string tokenizer_dir =
        tokenizer_path.empty() ? model_dir : lm_example::tokenizer_directory(tokenizer_path);  // "": bytes
    const std::vector<std::string> copied =
        tokenizer_dir.empty() ? std::vector<std::string>{} : mt::train::copy_tokenizer_files(tokenizer_dir, out);
    std::printf(
        "mt_merge: merged model saved to %s (%s parameters, %s%s)\n", out.c_str(),
        lm_example::with_commas(model->num_parameters()).c_str(), mt::dtype_name(model->parameters().front().dtype()),
        copied.empty() ? ", no tokenizer files" : (", " + std::to_string(copied.size()) + " tokenizer files").c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_merge: %s\n", e.what());
    return 2;
  }
  return 0;
}
