// The memory plan (train/memory_plan.h): its weight bytes are the model's own, each recomputed
// layer frees the same bytes (and checkpointing the outputs each kept layer rebuilds), the plan is
// the fewest recomputed layers that fit, sizes parse, and layers:N spreads N recomputed layers over
// all but the last. Its activation bytes against the peak the allocator measures:
// tools/bench/llama_step prints both on the GPU.
#include <gtest/gtest.h>

#include "ops/nn/fp8_base.h"
#include "ops/nn/llama.h"
#include "ops/nn/lora.h"
#include "ops/nn/parameter_init.h"
#include "tests/nn/tiny_llama.h"
#include "tests/test_util.h"
#include "train/memory_plan.h"

namespace mt::train {
namespace {

// A Llama of the tiny config with sizes a multiple of FP8's 16-byte rows, LoRA r=4 on all seven.
nn::LlamaConfig plan_config() {
  nn::LlamaConfig c = nn::tiny_llama_config();
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 5;
  c.tie_word_embeddings = false;
  return c;
}

TrainingShape lora_shape(const std::string& base) {
  TrainingShape s;
  s.batch = 2;
  s.seq_len = 16;
  s.lora_r = 4;
  s.base_dtype = base;
  return s;
}

// The frozen base's bytes as the model holds them, after apply_lora (and quantize_linears_fp8).
int64_t frozen_bytes(const nn::Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) bytes += p.numel() * static_cast<int64_t>(element_size(p.dtype()));
  }
  for (const auto& [name, b] : model.named_buffers())
    bytes += b.numel() * static_cast<int64_t>(element_size(b.dtype()));
  return bytes;
}

int64_t trainable_count(const nn::Module& model) {
  int64_t n = 0;
  for (const Tensor& p : model.trainable_parameters()) n += p.numel();
  return n;
}

TEST(MemoryPlan, WeightAndTrainableBytesAreThoseOfTheModelItDescribes) {
  for (const std::string base : {"bf16", "fp8", "f32"}) {
    SCOPED_TRACE(base);
    const nn::LlamaConfig config = plan_config();
    Generator g(1);
    nn::Llama model(config, &g);
    if (base != "f32") model.to(DType::bf16);
    nn::LoRAOptions lora;
    lora.r = 4;
    lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    nn::apply_lora(model, lora, &g);
    if (base == "fp8") nn::quantize_linears_fp8(model);
    const MemoryEstimate e = estimate_training_memory(config, lora_shape(base), "off");
    EXPECT_EQ(e.weights, frozen_bytes(model));
    EXPECT_EQ(e.trainable, trainable_count(model) * 18);  // f32 value and gradient, two moments, bf16 copy
  }
}

TEST(MemoryPlan, EachRecomputedLayerFreesTheSameBytesAndThePlanIsTheFewestThatFit) {
  const nn::LlamaConfig config = plan_config();
  const TrainingShape shape = lora_shape("bf16");
  const MemoryEstimate off = estimate_training_memory(config, shape, "off");
  const MemoryEstimate one = estimate_training_memory(config, shape, "layers:1");
  const MemoryEstimate two = estimate_training_memory(config, shape, "layers:2");
  const MemoryEstimate all = estimate_training_memory(config, shape, "blocks");
  EXPECT_EQ(one.recomputed_layers, 1);
  EXPECT_EQ(all.recomputed_layers, config.num_hidden_layers - 1);  // never the last
  const int64_t freed = one.activations - two.activations;
  EXPECT_GT(freed, 0);
  // Under checkpointing every kept layer also rebuilds its two norm outputs and its SwiGLU output
  // (2 bytes a value) in backward instead of keeping them.
  const int64_t rebuilt = 2 * (2 * config.hidden_size + config.intermediate_size) * shape.batch * shape.seq_len;
  // Over the frozen embedding the first layer's input norm output is kept whole where that layer is
  // kept (layers:1 and layers:2 keep layer 0, blocks recomputes it).
  const int64_t first_norm_output = 2 * config.hidden_size * shape.batch * shape.seq_len;
  EXPECT_EQ(off.activations - one.activations, freed + config.num_hidden_layers * rebuilt - first_norm_output);
  EXPECT_EQ(one.activations - all.activations, freed * (all.recomputed_layers - 1) + first_norm_output);
  EXPECT_EQ(estimate_training_memory(config, shape, "blocks:2").recomputed_layers, 2);  // layers 0 and 2 of 0..3

  EXPECT_EQ(plan_checkpointing(config, shape, off.peak()).checkpointing, "off");
  EXPECT_EQ(plan_checkpointing(config, shape, off.peak() - 1).checkpointing, "layers:1");
  EXPECT_EQ(plan_checkpointing(config, shape, two.peak()).checkpointing, "layers:2");
  EXPECT_EQ(plan_checkpointing(config, shape, all.peak()).checkpointing, "blocks");
  const std::string msg = error_message_of([&] { plan_checkpointing(config, shape, all.peak() - 1); });
  EXPECT_NE(msg.find("2 x 16 tokens per micro-batch do not fit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--base-dtype fp8"), std::string::npos) << msg;
}

TEST(MemoryPlan, MoreTokensNeedMoreActivationsAndAnFp8BaseLessWeight) {
  const nn::LlamaConfig config = plan_config();
  TrainingShape longer = lora_shape("bf16");
  longer.seq_len *= 2;
  EXPECT_EQ(estimate_training_memory(config, longer, "off").activations,
            2 * estimate_training_memory(config, lora_shape("bf16"), "off").activations);
  EXPECT_LT(estimate_training_memory(config, lora_shape("fp8"), "off").weights,
            estimate_training_memory(config, lora_shape("bf16"), "off").weights);
  const std::string msg = error_message_of([&] { estimate_training_memory(config, lora_shape("bf16"), "selective"); });
  EXPECT_NE(msg.find("selective"), std::string::npos) << msg;
}

TEST(MemoryPlan, SizesParseInBinaryAndDecimalUnitsAndBadOnesAreNamed) {
  EXPECT_EQ(parse_memory_size("22GiB"), int64_t{22} << 30);
  EXPECT_EQ(parse_memory_size("21.5 G"), int64_t{43} << 29);
  EXPECT_EQ(parse_memory_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("24GB"), int64_t{24000000000});
  for (const std::string bad : {"", "GiB", "22", "22TB", "-1GiB", "0G", "1e400GiB", "1e10GiB", "1e-12GiB"}) {
    const std::string msg = error_message_of([&] { parse_memory_size(bad); });
    EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(MemoryPlan, LayersNRecomputesNLayersSpreadEvenlyNeverTheLast) {
  for (int64_t n = 0; n <= 9; ++n) {
    const nn::GPTCheckpointing c = nn::GPTCheckpointing::parse("layers:" + std::to_string(n));
    EXPECT_EQ(c.str(), "layers:" + std::to_string(n));
    EXPECT_EQ(c.recomputed(8), std::min<int64_t>(n, 7)) << n;
    EXPECT_FALSE(c.recomputes(7, 8));
  }
  const nn::GPTCheckpointing half = nn::GPTCheckpointing::parse("layers:3");
  std::string picked;
  for (int64_t i = 0; i < 7; ++i) picked += half.recomputes(i, 7) ? '1' : '0';
  EXPECT_EQ(picked, "0101010");  // 3 of the first 6, evenly
  EXPECT_THROW(nn::GPTCheckpointing::parse("layers:-1"), Error);
  EXPECT_THROW(nn::GPTCheckpointing::parse("layers:"), Error);
}

}  // namespace
}  // namespace mt::train
