#include "train/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "ops/nn/gpt.h"

namespace mt::train {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// ops/loss/loss.cpp's chunk of logits: the LM head never holds more than this many bytes of them.
constexpr int64_t kHeadChunkBytes = int64_t{1} << 30;
constexpr int64_t kReserveBytes = int64_t{256} << 20;  // cuBLASLt and cuDNN workspaces, allocator rounding
constexpr int64_t kTrainedBytes = 4 + 4 + 8 + 2;       // f32 value, f32 gradient, AdamW m and v, bf16 copy

bool targeted(const TrainingShape& shape, const std::string& name) {
  return shape.lora_r > 0 &&
         std::find(shape.lora_targets.begin(), shape.lora_targets.end(), name) != shape.lora_targets.end();
}

struct Projection {
  std::string name;
  int64_t in, out;
};

std::vector<Projection> projections(const nn::LlamaConfig& c) {
  const int64_t C = c.hidden_size, Q = c.num_attention_heads * c.dim_per_head(),
                KV = c.num_key_value_heads * c.dim_per_head(), I = c.intermediate_size;
  return {{"q_proj", C, Q},    {"k_proj", C, KV}, {"v_proj", C, KV},  {"o_proj", Q, C},
          {"gate_proj", C, I}, {"up_proj", C, I}, {"down_proj", I, C}};
}

// Note [Activation bytes of a Llama layer]: what the ops of one layer keep for backward under bf16
// autocast, per token (ops/norm, ops/attention, ops/matmul, ops/elementwise/swiglu):
//   each RMSNorm (fp32 policy): the residual sum in f32 (4C) and its rstd (4); its bf16 output (2C),
//     which the projections after it keep as their input, under checkpointing rebuilt in backward
//     from the sum instead (RebuildSavedGuard, autograd/grad_mode.h)
//   attention (cuDNN): q and k after RoPE, v (2Q + 4KV), the output, which o_proj keeps as its input
//     (2Q, a view of it), and the row statistics (4 per query head)
//   SwiGLU: gate and up (4I) and its output, down_proj's input (2I), which under checkpointing is
//     rebuilt in backward from gate and up instead
//   LoRA: each adapted projection's x A^T (2r)
// A recomputed layer keeps its f32 input (4C) alone and rebuilds the rest in backward.
int64_t layer_bytes_per_token(const nn::LlamaConfig& c, const TrainingShape& shape, bool checkpointing) {
  const int64_t C = c.hidden_size, Q = c.num_attention_heads * c.dim_per_head(),
                KV = c.num_key_value_heads * c.dim_per_head(), I = c.intermediate_size, H = c.num_attention_heads;
  int64_t adapted = 0;
  for (const Projection& p : projections(c)) adapted += targeted(shape, p.name) ? 1 : 0;
  const int64_t norm_output = checkpointing ? 0 : 2 * C, swiglu_output = checkpointing ? 0 : 2 * I;
  return 2 * (4 * C + 4 + norm_output) + (2 * Q + 4 * KV) + 2 * Q + 4 * H + 4 * I + swiglu_output +
         adapted * 2 * shape.lora_r;
}

// Gradients in flight during one layer's backward, per token: at SwiGLU's backward the gradient of
// its output and those of gate and up (6I), beside the f32 stream gradient and a projection's
// input gradient (8C).
int64_t backward_bytes_per_token(const nn::LlamaConfig& c) { return 6 * c.intermediate_size + 8 * c.hidden_size; }

int64_t weight_bytes(const nn::LlamaConfig& c, const TrainingShape& shape) {
  const bool full = shape.lora_r == 0;
  const int64_t dense = full || shape.base_dtype == "f32" ? 4 : 2;  // embeddings, head, norms, biases
  const int64_t projection = shape.base_dtype == "fp8" && !full ? 1 : dense;
  const int64_t C = c.hidden_size, V = c.vocab_size, Q = c.num_attention_heads * c.dim_per_head(),
                KV = c.num_key_value_heads * c.dim_per_head();
  int64_t layer = 2 * C * dense;  // the two norms
  for (const Projection& p : projections(c)) {
    layer += p.in * p.out * projection;
    if (projection == 1) layer += p.out * 4;  // an FP8 weight's f32 scale per output channel
  }
  if (c.attention_bias) layer += (Q + 2 * KV) * dense;
  if (c.o_proj_bias) layer += C * dense;
  const int64_t embeddings = V * C * (c.tie_word_embeddings ? 1 : 2) * dense;
  return embeddings + C * dense + c.num_hidden_layers * layer;
}

int64_t trainable_bytes(const nn::LlamaConfig& c, const TrainingShape& shape) {
  if (shape.lora_r == 0) return weight_bytes(c, shape) / 4 * (kTrainedBytes - 4);  // the f32 values are the weights
  int64_t adapter = 0;
  for (const Projection& p : projections(c)) {
    if (targeted(shape, p.name)) adapter += shape.lora_r * (p.in + p.out);
  }
  return c.num_hidden_layers * adapter * kTrainedBytes;
}

// The LM head at the end of forward (ops/loss/loss.cpp, linear_cross_entropy): one chunk of bf16
// logits, the f32 input gradient it forms there, the final norm's saved input and output, and when
// the head trains (full training) its f32 weight gradient, formed there too.
int64_t head_bytes(const nn::LlamaConfig& c, const TrainingShape& shape, int64_t tokens) {
  const int64_t row = c.vocab_size * 2;
  int64_t rows = std::max<int64_t>(1, kHeadChunkBytes / row);
  const int64_t chunks = (tokens + rows - 1) / rows;
  rows = (tokens + chunks - 1) / chunks;
  const int64_t weight_gradient = shape.lora_r == 0 ? c.vocab_size * c.hidden_size * 4 : 0;
  return std::min(tokens, rows) * row + tokens * (4 * c.hidden_size + 4 * c.hidden_size + 2 * c.hidden_size) +
         weight_gradient;
}

// `checkpointing` parsed as one of nn::Llama::set_checkpointing's modes.
nn::GPTCheckpointing llama_checkpointing(const std::string& checkpointing) {
  const nn::GPTCheckpointing parsed = nn::GPTCheckpointing::parse(checkpointing);
  MT_CHECK(parsed.mode != nn::GPTCheckpointing::Mode::selective,
           "memory plan: checkpointing 'selective' is not a Llama mode (off, blocks, blocks:K, layers:N)");
  return parsed;
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", static_cast<double>(bytes) / kGiB);
  return text;
}

}  // namespace

std::string MemoryEstimate::summary() const {
  return gib(peak()) + " GiB (weights " + gib(weights) + ", trainable with gradients and AdamW " + gib(trainable) +
         ", activations " + gib(activations) + " with " + std::to_string(recomputed_layers) +
         " layers recomputed, transient " + gib(transient) + ", workspaces " + gib(reserve) + ")";
}

MemoryEstimate estimate_training_memory(const nn::LlamaConfig& config, const TrainingShape& shape,
                                        const std::string& checkpointing) {
  MT_CHECK(shape.batch > 0 && shape.seq_len > 0, "memory plan: batch and sequence length must be positive, got ",
           shape.batch, " x ", shape.seq_len);
  MT_CHECK(shape.base_dtype == "f32" || shape.base_dtype == "bf16" || shape.base_dtype == "fp8",
           "memory plan: the base dtype must be f32, bf16 or fp8, got '", shape.base_dtype, "'");
  const int64_t tokens = shape.batch * shape.seq_len, layers = config.num_hidden_layers;
  MemoryEstimate e;
  e.checkpointing = checkpointing;
  const nn::GPTCheckpointing parsed = llama_checkpointing(checkpointing);
  e.recomputed_layers = parsed.recomputed(layers);
  e.weights = weight_bytes(config, shape);
  e.trainable = trainable_bytes(config, shape);
  const bool checkpointed = parsed.mode != nn::GPTCheckpointing::Mode::off;
  const int64_t full_layer = layer_bytes_per_token(config, shape, checkpointed) * tokens;
  e.activations = (layers - e.recomputed_layers) * full_layer + e.recomputed_layers * 4 * config.hidden_size * tokens;
  // Over a frozen embedding the first layer's input norm records nothing (no input or weight needs
  // a gradient), so its output, which q, k and v save, cannot be rebuilt: kept, it is kept whole.
  if (checkpointed && shape.lora_r > 0 && !parsed.recomputes(0, layers)) {
    e.activations += 2 * config.hidden_size * tokens;
  }
  // A recomputed layer's rebuilt activations never add to the peak: when backward reaches it, the
  // layers after it (the last one, kept whole, among them) have freed theirs.
  e.transient = std::max(head_bytes(config, shape, tokens), backward_bytes_per_token(config) * tokens);
  e.reserve = kReserveBytes;
  return e;
}

MemoryEstimate plan_checkpointing(const nn::LlamaConfig& config, const TrainingShape& shape, int64_t budget_bytes) {
  MT_CHECK(budget_bytes > 0, "memory plan: the budget must be positive, got ", budget_bytes, " bytes");
  // Every recomputed layer frees the same bytes: off, then layers:N for N = 1, 2, ..., then blocks.
  const int64_t candidates = config.num_hidden_layers > 1 ? config.num_hidden_layers - 1 : 1;
  MemoryEstimate smallest;
  for (int64_t n = 0; n <= candidates; ++n) {
    const std::string mode = n == 0 ? "off" : n == candidates ? "blocks" : "layers:" + std::to_string(n);
    const MemoryEstimate e = estimate_training_memory(config, shape, mode);
    if (e.peak() <= budget_bytes) return e;
    smallest = e;
  }
  throw Error(detail::str_cat("memory plan: ", shape.batch, " x ", shape.seq_len, " tokens per micro-batch do not fit ",
                              gib(budget_bytes), " GiB even with every layer recomputed: ", smallest.summary(),
                              "; lower the batch or the sequence length, or hold the base in FP8 (--base-dtype fp8)"));
}

int64_t parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::out_of_range&) {
    throw Error(detail::str_cat("memory size '", text, "' is out of range"));
  } catch (const std::exception&) {
    throw Error(detail::str_cat("memory size '", text, "' does not start with a number (e.g. 22GiB)"));
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }), unit.end());
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit == "gib" || unit == "g") scale = kGiB;
  if (unit == "mib" || unit == "m") scale = 1024.0 * 1024.0;
  if (unit == "gb") scale = 1e9;
  if (unit == "mb") scale = 1e6;
  MT_CHECK(scale > 0, "memory size '", text, "': the unit must be GiB, G, MiB, M, GB or MB");
  MT_CHECK(std::isfinite(value) && value > 0, "memory size '", text, "' must be positive");
  const double bytes = value * scale;
  MT_CHECK(bytes >= 1 && bytes < 9.0e18, "memory size '", text, "' is out of range (1 byte to 8 EiB)");
  return static_cast<int64_t>(bytes);
}

}  // namespace mt::train
