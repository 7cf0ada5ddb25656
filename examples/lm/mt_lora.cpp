// Fine-tunes a language model (GPT-2 or Llama family: llama, mistral, qwen2; the type comes from
// the base's config.json) with LoRA adapters: the base model stays frozen, only the low-rank
// A and B matrices of the targeted projections train. Saves the adapter in PEFT's
// layout (adapter_config.json + adapter_model.safetensors) and, optionally, the merged model.
//
//   build/examples/mt_lora --base model/ --data new_text.tok --adapter-out adapter/ --r 8 --alpha 16
//
// A sample from the same prompt is printed before and after, so the change shows.
//
// --base-dtype fp8 holds the frozen base's Linear layers in E4M3 with a scale per output channel,
// cast as the checkpoint is loaded (one layer at a time on its way to the device), their forward
// and input-gradient GEMMs in FP8 (Note [FP8 frozen base]): half a bf16 base's memory. The adapter
// saves as ever; merging is refused (the base would be the rounded one): merge the saved adapter
// into the checkpoint with mt_merge.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <sstream>

#include "examples/lm/trainer.h"
#include "ops/nn/fp8_base.h"
#include "ops/nn/hf_checkpoint.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"
#include "train/model_directory.h"

namespace {

// The frozen base's dtype for the memory plan: --base-dtype, or with auto the checkpoint's, from
// its safetensors headers (no weight is read).
std::string planned_base_dtype(const std::string& flag, const std::string& dir) {
  if (flag != "auto") return flag;
  return mt::nn::hf_checkpoint_dtype(dir) == mt::DType::f32 ? "f32" : "bf16";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fine-tune a GPT-2 or Llama-family model with LoRA adapters"};
  example::setup(app, "mt_lora");
  example::PlacementFlags placement_flags;
  lm_example::TrainFlags train_flags;
  train_flags.steps = 200;
  train_flags.lr = 2e-3;
  train_flags.warmup = 20;
  train_flags.weight_decay = 0.0;
  std::string base, adapter_out, merged_out, tokenizer_path, targets, base_dtype = "auto";
  mt::nn::LoRAOptions lora;
  std::string prompt = "The ";
  int64_t sample_tokens = 200;
  placement_flags.add_to(app);
  train_flags.add_to(app, "token file of the fine-tuning text (from mt_tokenize)");
  app.add_option("--base", base, "base model directory (config.json, model.safetensors), e.g. from mt_train")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--tokenizer", tokenizer_path,
                 "tokenizer directory or file of the samples (default: --base's, else bytes)");
  app.add_option("--adapter-out", adapter_out, "directory to save the adapter to (PEFT layout)")->required();
  app.add_option("--merged-out", merged_out, "also merge the adapter into the base and save the model here");
  app.add_option("--base-dtype", base_dtype,
                 "the frozen base's dtype: auto (the checkpoint's), f32, bf16, or fp8 (its Linear layers in E4M3 with "
                 "a scale per output channel, their GEMMs in FP8; the rest keeps the checkpoint's dtype); the "
                 "adapters are f32")
      ->capture_default_str()
      ->check(example::one_of({"auto", "f32", "bf16", "fp8"}));
  app.add_option("--r", lora.r, "LoRA rank")->capture_default_str()->check(example::positive());
  app.add_option("--alpha", lora.alpha, "LoRA alpha (scale alpha/r)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--lora-dropout", lora.dropout, "dropout on the adapter's input")
      ->capture_default_str()
      ->check(example::range(0.0, 0.99));
  app.add_flag("--rslora", lora.use_rslora, "scale by alpha/sqrt(r) (rank-stabilised LoRA)");
  app.add_option("--targets", targets,
                 "comma-separated module names to adapt (PEFT's target_modules; default: c_attn,c_proj,c_fc "
                 "for GPT-2, the seven projections q_proj,...,down_proj for the Llama family)")
      ->capture_default_str();
  app.add_option("--prompt", prompt, "prompt of the samples printed before and after")->capture_default_str();
  app.add_option("--sample-tokens", sample_tokens, "length of those samples (0: none)")
      ->capture_default_str()
      ->check(example::non_negative());
  CLI11_PARSE(app, argc, argv);

  try {
    // LoRALinear runs its own bf16 forward (ops/nn/lora.h), so FP8 would reach only the layers
    // without an adapter: with the default targets, none.
    MT_CHECK(train_flags.precision != "fp8",
             "--precision fp8 is not supported for LoRA yet: the adapted layers run in bf16 (--precision amp; "
             "--base-dtype fp8 holds the frozen base in FP8 and runs its GEMMs in FP8)");
    MT_CHECK(base_dtype != "fp8" || merged_out.empty(),
             "--merged-out merges the adapter into the base's weights, which --base-dtype fp8 holds rounded to FP8; "
             "save the adapter (--adapter-out) and merge it into the checkpoint's base with mt_merge");
    lm_example::MemorySetup memory;  // for --dry-run and --max-memory (Llama family)
    memory.lora_r = lora.r;
    memory.lora_targets = lm_example::split_commas(targets);  // empty: the seven projections
    if (train_flags.dry_run || !train_flags.max_memory.empty()) {
      mt::nn::model_type_of(base + "/config.json");  // the config's errors before the weights'
      memory.base_dtype = planned_base_dtype(base_dtype, base);
    }
    if (train_flags.dry_run) {
      lm_example::print_memory_plan("mt_lora", base + "/config.json", train_flags, memory);
      return 0;
    }
    // A GPT-2 base or a budget nothing fits, refused before the weights load (train() plans again
    // with the loaded base's dtype).
    if (!train_flags.max_memory.empty()) lm_example::plan_memory(base + "/config.json", train_flags, memory);
    const example::Placement placement = placement_flags.resolve();
    mt::manual_seed(train_flags.seed);
    const std::shared_ptr<mt::nn::CausalLM> model = mt::nn::load_causal_lm(base);
    const auto tokenizer = lm_example::tokenizer_for(tokenizer_path, base);
    mt::tok::check_vocab_fits(*tokenizer, model->vocab_size(), "mt_lora");
    if (base_dtype == "f32" || base_dtype == "bf16") model->to(mt::parse_dtype(base_dtype));
    if (base_dtype == "fp8") {
      const std::vector<std::string> quantized = mt::nn::quantize_linears_fp8(*model, placement.device);
      if (placement.is_main()) {
        std::printf("mt_lora: base in FP8 (E4M3, a scale per output channel): %zu Linear layers\n", quantized.size());
      }
    }
    model->to(placement.device);
    model->eval();
    lm_example::SampleOptions sampling;  // temperature 0.8, top-k 40
    sampling.new_tokens = sample_tokens;
    sampling.seed = train_flags.seed;
    auto sample = [&](const char* when) {
      if (sample_tokens == 0 || !placement.is_main()) return;
      std::printf("mt_lora: sample %s fine-tuning:\n%s\n", when,
                  lm_example::sample_text(*model, *tokenizer, prompt, sampling).c_str());
    };
    sample("before");
    std::optional<double> val_before;
    if (!train_flags.val_data.empty()) {
      val_before = lm_example::evaluate(*model, train_flags.val_data, train_flags, placement);
      if (placement.is_main()) std::printf("mt_lora: validation loss of the base model %.4f\n", *val_before);
    }

    if (targets.empty()) {
      targets = model->model_type() == "gpt2" ? "c_attn,c_proj,c_fc"
                                              : "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    }
    lora.target_modules = lm_example::split_commas(targets);
    mt::Generator init(train_flags.seed);
    const std::vector<std::string> adapted = mt::nn::apply_lora(*model, lora, &init);
    if (placement.is_main()) {
      std::printf("mt_lora: LoRA r=%lld alpha=%g%s on %zu layers (%s)\n", static_cast<long long>(lora.r), lora.alpha,
                  lora.use_rslora ? " rsLoRA" : "", adapted.size(), targets.c_str());
      std::printf("mt_lora: %s\n", mt::nn::trainable_parameters_summary(*model).c_str());
    }

    memory.lora_targets = lora.target_modules;
    if (base_dtype == "auto") {  // the checkpoint's, as loaded
      memory.base_dtype = model->parameters().front().dtype() == mt::DType::f32 ? "f32" : "bf16";
    }
    const lm_example::TrainResult result = lm_example::train(*model, train_flags, placement, "mt_lora", memory);
    if (result.interrupted || !placement.is_main()) return 0;  // rank 0 writes the adapter and prints the samples
    mt::nn::AdapterSaveOptions save_options;
    save_options.fan_in_fan_out = model->adapters_fan_in_fan_out();  // GPT-2's Conv1D
    save_options.base_model_name_or_path = base;
    mt::nn::save_adapter(*model, adapter_out, save_options);
    std::printf("mt_lora: loss %.4f -> %.4f in %.1f s; adapter saved to %s\n", result.first_loss, result.last_loss,
                result.seconds, adapter_out.c_str());
    if (val_before && result.val_loss) {
      std::printf("mt_lora: validation loss %.4f -> %.4f\n", *val_before, *result.val_loss);
    }
    model->eval();
    sample("after");

    if (!merged_out.empty()) {
      mt::nn::merge_and_unload(*model);
      model->save_pretrained(merged_out);
      const std::string tokenizer_dir =
          tokenizer_path.empty() ? base : lm_example::tokenizer_directory(tokenizer_path);  // "": bytes
      if (!tokenizer_dir.empty()) mt::train::copy_tokenizer_files(tokenizer_dir, merged_out);
      std::printf("mt_lora: merged model saved to %s\n", merged_out.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_lora: %s\n", e.what());
    return 2;
  }
  return 0;
}
