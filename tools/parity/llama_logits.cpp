// The mixtrain side of tools/parity/llama_parity.py: loads a Hugging Face Llama-family
// directory (llama, mistral, qwen2; whole or sharded), runs token ids through it and writes the
// logits; optionally saves the model again (save_pretrained) to check that transformers reads it.
//
//   llama_logits --model hf_dir --ids ids.safetensors --out logits.safetensors [--device cuda]
//                [--dtype f32|bf16] [--save-to dir --max-shard-bytes N]
//                [--make-adapter dir --r 8 --alpha 16 | --adapter dir]
// --make-adapter puts LoRA with random (non-zero) B on all seven projections and saves it in PEFT's
// layout before the logits; --adapter loads one (PEFT's) instead.
//
// ids.safetensors holds "ids" [B, T] (I64); the output holds "logits" [B, T, V] (F32).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/safetensors.h"
#include "examples/common/cli.h"
#include "ops/nn/llama.h"
#include "ops/nn/lora.h"
#include "ops/ops.h"

int main(int argc, char** argv) {
  CLI::App app{"Logits of a Hugging Face Llama-family checkpoint computed by mixtrain"};
  example::setup(app, "llama_logits");
  std::string model_dir, ids_path, out_path, device_name = "cpu", dtype_name = "f32", save_to;
  int64_t max_shard_bytes = int64_t{5} << 30;
  std::string make_adapter, adapter;
  mt::nn::LoRAOptions lora;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  app.add_option("--model", model_dir, "HF model directory")->required()->check(CLI::ExistingDirectory);
  app.add_option("--ids", ids_path, "safetensors file with \"ids\" [B, T] I64")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "safetensors file to write \"logits\" [B, T, V] F32 to")->required();
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_name, "f32 or bf16: the weights' and activations' dtype")->capture_default_str();
  app.add_option("--save-to", save_to, "also save the loaded model here with save_pretrained");
  app.add_option("--max-shard-bytes", max_shard_bytes, "shard size of --save-to")->capture_default_str();
  app.add_option("--make-adapter", make_adapter, "apply LoRA with random B, save the adapter here, use it");
  app.add_option("--adapter", adapter, "load this PEFT adapter and use it")->check(CLI::ExistingDirectory);
  app.add_option("--r", lora.r, "LoRA rank")->capture_default_str();
  app.add_option("--alpha", lora.alpha, "LoRA alpha")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const mt::Device device(device_name);
    const auto model = mt::nn::Llama::from_pretrained(model_dir);
    model->eval();
    if (!save_to.empty()) model->save_pretrained(save_to, max_shard_bytes);
    if (!make_adapter.empty()) {
      mt::Generator generator(7);
      mt::nn::apply_lora(*model, lora, &generator);
      mt::NoGradGuard no_grad;
      for (const auto& [path, layer] : mt::nn::lora_layers(*model)) {  // B = 0 would test nothing
        const mt::Tensor& b = layer->lora_B->weight;
        b.copy_(mt::mul(mt::randn(b.shape(), {}, &generator), 0.05));
      }
      mt::nn::save_adapter(*model, make_adapter);
    }
    if (!adapter.empty()) mt::nn::load_adapter(*model, adapter);
    model->to(dtype_name == "bf16" ? mt::DType::bf16 : mt::DType::f32);
    model->to(device);
    const mt::SafetensorsFile ids_file = mt::load_safetensors(ids_path);
    const auto ids = ids_file.tensors.find("ids");
    MT_CHECK(ids != ids_file.tensors.end(), ids_path, ": no tensor named \"ids\"");
    mt::NoGradGuard no_grad;
    const mt::Tensor logits = model->forward(ids->second.to(device));
    mt::save_safetensors(out_path, {{"logits", logits.to(mt::DType::f32)}});
    std::printf("llama_logits: %s logits %s written to %s\n", model->config().model_type.c_str(),
                mt::shape_str(logits.shape()).c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_logits: %s\n", e.what());
    return 2;
  }
  return 0;
}
