// The mixtrain side of tools/parity/gpt2_parity.py: loads a Hugging Face GPT-2 directory,
// runs token ids through it in f32 and writes the logits, optionally after putting a
// LoRA adapter with random (non-zero) B matrices on it and saving that adapter.
//
//   gpt_logits --model hf_dir --ids ids.safetensors --out logits.safetensors [--device cuda]
//              [--make-adapter adapter_dir --r 8 --alpha 16 --targets c_attn,c_proj,c_fc]
//
// ids.safetensors holds "ids" [B, T] (I64); the output holds "logits" [B, T, V] (F32).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/safetensors.h"
#include "examples/common/cli.h"
#include "examples/lm/trainer.h"
#include "ops/nn/gpt.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"

int main(int argc, char** argv) {
  CLI::App app{"Logits of a Hugging Face GPT-2 checkpoint computed by mixtrain (f32)"};
  example::setup(app, "gpt_logits");
  std::string model_dir, ids_path, out_path, device_name = "cpu", adapter_dir, targets = "c_attn,c_proj,c_fc";
  mt::nn::LoRAOptions lora;
  uint64_t seed = 0;
  app.add_option("--model", model_dir, "HF GPT-2 directory")->required()->check(CLI::ExistingDirectory);
  app.add_option("--ids", ids_path, "safetensors file with \"ids\" [B, T] I64")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "safetensors file to write \"logits\" [B, T, V] F32 to")->required();
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--make-adapter", adapter_dir, "apply LoRA with random B, save the adapter here, use it");
  app.add_option("--r", lora.r, "LoRA rank")->capture_default_str();
  app.add_option("--alpha", lora.alpha, "LoRA alpha")->capture_default_str();
  app.add_option("--targets", targets, "comma-separated target modules")->capture_default_str();
  app.add_option("--seed", seed, "seed for the adapter's A and B")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const mt::Device device(device_name);
    const auto model = mt::nn::GPT::from_pretrained(model_dir);
    model->eval();
    if (!adapter_dir.empty()) {
      lora.target_modules = lm_example::split_commas(targets);
      mt::Generator generator(seed);
      mt::nn::apply_lora(*model, lora, &generator);
      mt::NoGradGuard no_grad;
      for (const auto& [path, layer] : mt::nn::lora_layers(*model)) {  // B = 0 would test nothing
        const mt::Tensor& b = layer->lora_B->weight;
        b.copy_(mt::mul(mt::randn(b.shape(), {}, &generator), 0.05));
      }
      mt::nn::AdapterSaveOptions options;
      options.fan_in_fan_out = true;
      mt::nn::save_adapter(*model, adapter_dir, options);
      std::printf("gpt_logits: %s\n", mt::nn::trainable_parameters_summary(*model).c_str());
    }
    model->to(device);
    const mt::SafetensorsFile ids_file = mt::load_safetensors(ids_path);
    const auto ids = ids_file.tensors.find("ids");
    MT_CHECK(ids != ids_file.tensors.end(), ids_path, ": no tensor named \"ids\"");
    mt::NoGradGuard no_grad;
    const mt::Tensor logits = model->forward(ids->second.to(device));
    mt::save_safetensors(out_path, {{"logits", logits.to(mt::DType::f32)}});
    std::printf("gpt_logits: logits %s written to %s\n", mt::shape_str(logits.shape()).c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_logits: %s\n", e.what());
    return 2;
  }
  return 0;
}
