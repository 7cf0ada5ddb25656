// Pretrains a language model from scratch on a token file, or goes on training one
// (--init-from), and saves it as a Hugging Face directory. A new model is a GPT-2 of the
// architecture flags, or any model a Hugging Face config.json describes (--config: gpt2, llama,
// mistral, qwen2).
//
//   build/examples/mt_tokenize --output train.tok licences/*
//   build/examples/mt_train --data train.tok --out model/ --layers 4 --heads 4 --embd 128
//   build/examples/mt_train --data train.tok --out model/ --config smollm2-135m/config.json
//
// The saved directory (config.json + model.safetensors, and the tokenizer files of --init-from's
// directory) is what mt_lora, mt_merge and mt_generate read, and what transformers'
// AutoModelForCausalLM.from_pretrained reads. With --save-dir, the model's config.json is written
// there too, so that mt_export can turn any checkpoint into such a directory.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "core/atomic_file.h"
#include "examples/lm/trainer.h"
#include "ops/ops.h"
#include "train/model_directory.h"

int main(int argc, char** argv) {
  CLI::App app{"Pretrain a language model (GPT-2 or Llama family) from scratch on a token file, or continue one"};
  example::setup(app, "mt_train");
  example::PlacementFlags placement_flags;
  lm_example::TrainFlags train_flags;
  mt::nn::GPTConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 128;
  config.n_positions = 0;  // 0: --seq-len
  std::string out, init_from, tokenizer_path, config_path;
  std::string prompt = "The ";
  int64_t sample_tokens = 200;
  placement_flags.add_to(app);
  train_flags.add_to(app, "training token file (from mt_tokenize)");
  app.add_option("--out", out, "directory to save the model to (config.json, model.safetensors)")->required();
  CLI::Option* init_option =
      app.add_option("--init-from", init_from,
                     "start from this model directory (config.json, model.safetensors) instead of a random model")
          ->check(CLI::ExistingDirectory);
  app.add_option("--tokenizer", tokenizer_path,
                 "tokenizer directory or file; sets a new model's vocabulary and is saved with the model "
                 "(default: --init-from's tokenizer, else bytes)");
  CLI::Option* config_option =
      app.add_option("--config", config_path, "a new model as this Hugging Face config.json describes it")
          ->check(CLI::ExistingFile)
          ->excludes(init_option);
  app.add_option("--layers", config.n_layer, "transformer blocks")->capture_default_str()->check(example::positive());
  app.add_option("--heads", config.n_head, "attention heads")->capture_default_str()->check(example::positive());
  app.add_option("--embd", config.n_embd, "model width")->capture_default_str()->check(example::positive());
  app.add_option("--context", config.n_positions, "longest sequence the model accepts (0: --seq-len)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--dropout", config.dropout, "dropout rate")->capture_default_str()->check(example::range(0.0, 0.99));
  for (const char* architecture : {"--layers", "--heads", "--embd", "--context", "--dropout"}) {
    init_option->excludes(architecture);  // the architecture comes from the directory's config.json
    config_option->excludes(architecture);
  }
  app.add_option("--prompt", prompt, "prompt of the sample printed after training")->capture_default_str();
  app.add_option("--sample-tokens", sample_tokens, "length of that sample (0: none)")
      ->capture_default_str()
      ->check(example::non_negative());
  CLI11_PARSE(app, argc, argv);

  try {
    if (train_flags.dry_run) {  // full training: every weight trains in f32 (MemorySetup's lora_r 0)
      MT_CHECK(!config_path.empty() || !init_from.empty(),
               "--dry-run plans a Llama-family model: give its --config or --init-from");
      lm_example::print_memory_plan("mt_train", config_path.empty() ? init_from + "/config.json" : config_path,
                                    train_flags, lm_example::MemorySetup{});
      return 0;
    }
    const example::Placement placement = placement_flags.resolve();
    if (config.n_positions == 0) config.n_positions = train_flags.seq_len;
    const auto tokenizer = lm_example::tokenizer_for(tokenizer_path, init_from);
    config.vocab_size = tokenizer->vocab_size();
    // The files saved beside the model: --tokenizer's, else --init-from's.
    const std::string tokenizer_dir =
        tokenizer_path.empty() ? init_from : lm_example::tokenizer_directory(tokenizer_path);
    mt::manual_seed(train_flags.seed);
    mt::Generator init(train_flags.seed);
    std::shared_ptr<mt::nn::CausalLM> loaded;
    if (!init_from.empty()) {
      loaded = mt::nn::load_causal_lm(init_from);
      loaded->to(mt::DType::f32);  // every weight trains: f32 master weights, whatever the checkpoint's dtype
    } else if (!config_path.empty()) {
      loaded = lm_example::model_from_config(config_path, &init);
    } else {
      loaded = std::make_shared<mt::nn::GPT>(config, &init);
    }
    mt::nn::CausalLM& model = *loaded;
    mt::tok::check_vocab_fits(*tokenizer, model.vocab_size(), "mt_train");
    model.to(placement.device);
    if (placement.is_main() && !train_flags.checkpoints.save_dir.empty()) {
      // mt_export reads it to rebuild the model of a checkpoint.
      std::filesystem::create_directories(train_flags.checkpoints.save_dir);
      mt::write_file_atomically(train_flags.checkpoints.save_dir + "/config.json", "model config", model.config_json());
      if (!tokenizer_dir.empty()) mt::train::copy_tokenizer_files(tokenizer_dir, train_flags.checkpoints.save_dir);
    }
    if (placement.is_main()) {
      std::printf("mt_train: tokenizer: %s\n", tokenizer->description().c_str());
      if (const auto* gpt = dynamic_cast<const mt::nn::GPT*>(&model)) {
        const mt::nn::GPTConfig& c = gpt->config();
        std::printf("mt_train: GPT %lld layers, %lld heads, width %lld, context %lld, vocab %lld: %s parameters\n",
                    static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
                    static_cast<long long>(c.n_embd), static_cast<long long>(c.n_positions),
                    static_cast<long long>(c.vocab_size), lm_example::with_commas(model.num_parameters()).c_str());
      } else {
        std::printf("mt_train: %s %lld layers, width %lld, context %lld, vocab %lld: %s parameters\n",
                    model.model_type().c_str(), static_cast<long long>(model.num_layers()),
                    static_cast<long long>(model.hidden_size()), static_cast<long long>(model.max_positions()),
                    static_cast<long long>(model.vocab_size()),
                    lm_example::with_commas(model.num_parameters()).c_str());
      }
    }

    const lm_example::TrainResult result = lm_example::train(model, train_flags, placement, "mt_train");
    if (result.interrupted || !placement.is_main()) return 0;  // rank 0 writes the model and prints the sample
    model.save_pretrained(out);
    if (!tokenizer_dir.empty()) mt::train::copy_tokenizer_files(tokenizer_dir, out);
    std::printf("mt_train: loss %.4f -> %.4f in %.1f s; saved %s\n", result.first_loss, result.last_loss,
                result.seconds, out.c_str());
    if (sample_tokens > 0) {
      model.eval();
      lm_example::SampleOptions sampling;  // temperature 0.8, top-k 40
      sampling.new_tokens = sample_tokens;
      sampling.seed = train_flags.seed;
      std::printf("mt_train: sample:\n%s\n", lm_example::sample_text(model, *tokenizer, prompt, sampling).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_train: %s\n", e.what());
    return 2;
  }
  return 0;
}
