// What the benchmark programs of tools/bench share: the median, host-timed steps with the
// allocator's peak reset after warm-up, the table the training-step benchmarks print, and the
// named Llama shapes that llama_step and generate_bench build (the same as
// llama_step_torch.py's LLAMA_SHAPES).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "core/device.h"
#include "core/error.h"
#include "ops/nn/llama_config.h"

namespace bench {

// The median of the timings (the upper middle one of an even count): every benchmark reports it.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits for the work queued on `device` (a no-op on the CPU), so that a host clock read after it
// has seen the work end.
inline void synchronize(const mt::Device& device) {
  if (device.is_cuda()) mt::cuda::synchronize_device(device.index);
}

// Runs run(step) for step = 0 .. warmup + steps - 1 and returns the seconds of the last `steps`
// of them, each timed on the host between two device synchronisations. The allocator's peak is
// reset when the warm-up ends, so that peak_gib() afterwards is the timed steps' high-water mark.
inline std::vector<double> time_steps(const mt::Device& device, int64_t warmup, int64_t steps,
                                      const std::function<void(int64_t step)>& run) {
  std::vector<double> seconds;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup && device.is_cuda()) mt::cuda::reset_peak_memory(device.index);
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    run(step);
    synchronize(device);
    if (step >= warmup)
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

// The allocator's high-water mark since its last reset, in GiB; 0 on the CPU (no counters there).
inline double peak_gib(const mt::Device& device) {
  if (!device.is_cuda()) return 0;
  return static_cast<double>(mt::cuda::memory_stats(device.index).peak_allocated) / (1 << 30);
}

// The table of the training-step benchmarks (gpt_step, llama_step), one row per mode:
//
//   mode                   peak GiB          step ms     tokens/s       loss
//   off          12.34 (1.00x less)     95.2 (1.00x)       172101    10.8282
//
// The first row printed is the base the ratios of the later ones compare with.
class StepTable {
 public:
  explicit StepTable(const mt::Device& device) : device_(device) {}

  void print_header() const {
    std::printf("%-10s %20s %16s %12s %10s\n", "mode", "peak GiB", "step ms", "tokens/s", "loss");
  }

  // One mode's row: its median step `ms`, the tokens a step trains, the last step's loss. The
  // peak is read from the allocator (peak_gib) unless `memory_note` replaces the column.
  void print_row(const std::string& mode, double ms, double tokens_per_step, double loss,
                 const char* memory_note = nullptr) {
    const double gib = peak_gib(device_);
    if (!has_base_) {
      has_base_ = true;
      base_ms_ = ms;
      base_gib_ = gib;
    }
    char memory[48] = "n/a (cpu)";
    if (device_.is_cuda()) std::snprintf(memory, sizeof(memory), "%.2f (%.2fx less)", gib, base_gib_ / gib);
    if (memory_note != nullptr) std::snprintf(memory, sizeof(memory), "%s", memory_note);
    std::printf("%-10s %20s %8.1f (%.2fx) %12.0f %10.4f\n", mode.c_str(), memory, ms, ms / base_ms_,
                tokens_per_step / (ms / 1e3), loss);
    std::fflush(stdout);
  }

  // A mode that did not run (a checkpointing mode the model lacks, memory exhausted), in its row.
  void print_failure(const std::string& mode, const std::string& why) const {
    std::printf("%-10s not run: %s\n", mode.c_str(), why.c_str());
    std::fflush(stdout);
  }

 private:
  mt::Device device_;
  bool has_base_ = false;  // set by the first row
  double base_ms_ = 0, base_gib_ = 0;
};

// A Llama of a released model's shape (random weights: the shape is what the timing depends on).
//   smollm2-135m: HuggingFaceTB/SmolLM2-135M's config.json
//   llama-3.2-1b: meta-llama/Llama-3.2-1B's config.json
//   llama-2-7b, llama-2-13b, llama-3-8b: meta-llama/Llama-2-7b-hf's, Llama-2-13b-hf's and
//   Meta-Llama-3-8B's config.json (untied heads; Llama 2 without grouped-query attention)
// Keep in step with LLAMA_SHAPES in llama_step_torch.py.
inline mt::nn::LlamaConfig llama_shape(const std::string& name) {
  mt::nn::LlamaConfig c;
  c.tie_word_embeddings = true;
  c.rms_norm_eps = 1e-5;
  if (name == "smollm2-135m") {
    c.num_hidden_layers = 30;
    c.hidden_size = 576;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.intermediate_size = 1536;
    c.vocab_size = 49152;
    c.rope_theta = 100000;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 0;
    c.eos_token_id = 0;
  } else if (name == "llama-3.2-1b") {
    c.num_hidden_layers = 16;
    c.hidden_size = 2048;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.intermediate_size = 8192;
    c.vocab_size = 128256;
    c.rope_theta = 500000;
    c.rope_scaling = mt::nn::RopeScaling{/*factor=*/32.0, /*low_freq_factor=*/1.0, /*high_freq_factor=*/4.0,
                                         /*original_max_position_embeddings=*/8192};
    c.max_position_embeddings = 131072;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (name == "llama-2-7b" || name == "llama-2-13b") {
    const bool big = name == "llama-2-13b";
    c.tie_word_embeddings = false;
    c.num_hidden_layers = big ? 40 : 32;
    c.hidden_size = big ? 5120 : 4096;
    c.num_attention_heads = big ? 40 : 32;
    c.num_key_value_heads = c.num_attention_heads;
    c.intermediate_size = big ? 13824 : 11008;
    c.vocab_size = 32000;
    c.rope_theta = 10000;
    c.max_position_embeddings = 4096;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
  } else if (name == "llama-3-8b") {
    c.tie_word_embeddings = false;
    c.num_hidden_layers = 32;
    c.hidden_size = 4096;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.intermediate_size = 14336;
    c.vocab_size = 128256;
    c.rope_theta = 500000;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else {
    throw mt::Error("--shape: expected smollm2-135m, llama-3.2-1b, llama-2-7b, llama-3-8b or llama-2-13b, got '" +
                    name + "'");
  }
  c.validate();
  return c;
}

// --config when given (a config.json), else the named --shape.
inline mt::nn::LlamaConfig llama_config(const std::string& shape, const std::string& config_path) {
  return config_path.empty() ? llama_shape(shape) : mt::nn::LlamaConfig::from_json_file(config_path);
}

// "smollm2-135m" or "config.json's llama (4 layers, hidden 64, ...)": what the header line names.
inline std::string llama_description(const std::string& shape, const std::string& config_path,
                                     const mt::nn::LlamaConfig& c) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "%s (%s: %lld layers, hidden %lld, %lld/%lld heads, intermediate %lld, vocab %lld%s)",
                config_path.empty() ? shape.c_str() : config_path.c_str(), c.model_type.c_str(),
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
                static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size),
                c.tie_word_embeddings ? ", tied" : "");
  return text;
}

}  // namespace bench
