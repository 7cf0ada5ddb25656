// Turns a training checkpoint of mt_train into a model directory (config.json +
// model.safetensors, loadable by mt_lora, mt_merge, mt_generate and transformers), with the
// tokenizer files copied beside it, while the run goes on or after it stopped. Any model mt_train
// trains: GPT-2 or the Llama family (llama, mistral, qwen2).
//
//   build/examples/mt_export --checkpoint run/ --out model-step-2000/      # the newest in run/
//   build/examples/mt_export --checkpoint run/step-000002000.safetensors --out model/
//
// The model's type and shape come from the config.json that mt_train writes into its --save-dir.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "core/format.h"
#include "examples/common/cli.h"
#include "examples/lm/trainer.h"
#include "optim/training_checkpoint.h"
#include "train/model_directory.h"

int main(int argc, char** argv) {
  CLI::App app{"Write the model of an mt_train checkpoint (GPT-2 or Llama family) as a model directory"};
  example::setup(app, "mt_export");
  std::string checkpoint, out, config_path, tokenizer_dir;
  app.add_option("--checkpoint", checkpoint, "a checkpoint file, or a --save-dir (its newest checkpoint)")
      ->required()
      ->check(CLI::ExistingPath);
  app.add_option("--out", out, "model directory to write (config.json, model.safetensors)")->required();
  app.add_option("--config", config_path, "the model's config.json (default: the one in the checkpoint's directory)")
      ->check(CLI::ExistingFile);
  app.add_option("--tokenizer", tokenizer_dir,
                 "copy the tokenizer files from this directory (default: the checkpoint's directory, where "
                 "mt_train --init-from put them)")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  namespace fs = std::filesystem;
  try {
    std::string file = checkpoint;
    if (fs::is_directory(checkpoint)) {
      // Not through mt::CheckpointDirectory, which would remove the temporary file of a write in progress.
      std::string newest;  // the step numbers are zero-padded: the greatest name is the newest step
      for (const auto& entry : fs::directory_iterator(checkpoint)) {
        const std::string name = entry.path().filename().string();
        const bool complete =
            name.rfind("step-", 0) == 0 && name.size() > 17 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
        if (complete && name > newest) newest = name;
      }
      MT_CHECK_T(mt::FileError, !newest.empty(), checkpoint, ": no checkpoint (step-*.safetensors) in it");
      file = (fs::path(checkpoint) / newest).string();
    }
    const std::string directory = fs::path(file).parent_path().string();
    if (config_path.empty()) config_path = (fs::path(directory) / "config.json").string();
    MT_CHECK_T(mt::FileError, fs::exists(config_path), config_path,
               ": no model config here; pass --config (mt_train writes one into its --save-dir)");
    // Built at random, then overwritten by the checkpoint's model state.
    const std::shared_ptr<mt::nn::CausalLM> built = lm_example::model_from_config(config_path, /*generator=*/nullptr);
    mt::nn::CausalLM& model = *built;
    mt::TrainingState state{&model, nullptr, nullptr, nullptr, {}};
    mt::load_training_checkpoint(file, state);
    model.save_pretrained(out);
    const std::vector<std::string> copied =
        mt::train::copy_tokenizer_files(tokenizer_dir.empty() ? directory : tokenizer_dir, out);
    const auto step = state.extra.count("step") ? static_cast<long long>(state.extra.at("step")) : -1LL;
    std::printf(
        "mt_export: step %lld of %s -> %s (%s, %s parameters%s)\n", step, file.c_str(), out.c_str(),
        model.model_type().c_str(), mt::with_commas(model.num_parameters()).c_str(),
        copied.empty() ? ", no tokenizer files" : (", " + std::to_string(copied.size()) + " tokenizer files").c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_export: %s\n", e.what());
    return 2;
  }
  return 0;
}
