// Generation speed of a Llama with its KV cache: batch 1, a random prompt, greedy decoding of a
// fixed number of new tokens (no stop token, so a run never ends early). PyTorch's twin is
// generate_torch.py (transformers' model.generate).
//
//   generate_bench --shape llama-3.2-1b --prompt-len 128 --new-tokens 256 --repeats 3
//   generate_bench --config path/config.json --device cpu --dtype f32 --prompt-len 8 --new-tokens 4
//
// The weights are random (N(0, 0.02)), cast to --dtype (bf16 by default) on the device. Each run
// calls mt::nn::generate once and is timed on the host: its prompt ms run from the call to the
// first new token (the prompt's forward into an empty cache, then the first pick); its ms per
// token are the time from the first new token to the last over the tokens between them; tokens/s
// are the new tokens over the whole call, prompt included, as generate_torch.py measures them.
// Every figure is the median over --repeats runs after --warmup runs.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/common/cli.h"
#include "ops/nn/causal_lm.h"
#include "ops/nn/llama.h"
#include "ops/ops.h"
#include "tools/bench/bench_common.h"

int main(int argc, char** argv) {
  CLI::App app{"Time greedy generation with the KV cache of a Llama"};
  example::setup(app, "generate_bench");
  example::PlacementFlags placement_flags;
  placement_flags.add_to(app, example::AmpFlag::without);  // the weights' dtype is --dtype
  std::string shape = "llama-3.2-1b", config_path, dtype_name = "bf16";
  int64_t prompt_len = 128, new_tokens = 256, warmup = 1, repeats = 3;
  app.add_option("--shape", shape, "a released model's shape")
      ->capture_default_str()
      ->check(example::one_of({"smollm2-135m", "llama-3.2-1b", "llama-2-7b", "llama-3-8b", "llama-2-13b"}));
  app.add_option("--config", config_path, "a Hugging Face config.json to take the shape from instead of --shape")
      ->check(CLI::ExistingFile);
  app.add_option("--dtype", dtype_name, "the weights' dtype")
      ->capture_default_str()
      ->check(example::one_of({"bf16", "f32"}));
  app.add_option("--prompt-len", prompt_len, "tokens in the random prompt")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--new-tokens", new_tokens, "tokens generated per run")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--warmup", warmup, "untimed runs")->capture_default_str()->check(example::non_negative());
  app.add_option("--repeats", repeats, "timed runs (the median is reported)")
      ->capture_default_str()
      ->check(example::positive());
  CLI11_PARSE(app, argc, argv);

  try {
    const mt::Device device = example::resolve_device(placement_flags.device, /*group=*/nullptr);
    const mt::nn::LlamaConfig config = bench::llama_config(shape, config_path);
    MT_CHECK(prompt_len + new_tokens <= config.max_position_embeddings, "--prompt-len ", prompt_len, " + --new-tokens ",
             new_tokens, " exceed the model's ", config.max_position_embeddings,
             " positions (max_position_embeddings): the cache would be dropped on the way");
    mt::Generator init(0);
    mt::nn::Llama model(config, &init);
    model.to(dtype_name == "bf16" ? mt::DType::bf16 : mt::DType::f32);
    model.to(device);
    model.eval();
    mt::Generator data(1);
    std::vector<int64_t> prompt;
    for (const double id : mt::uniform({prompt_len}, 0, static_cast<double>(config.vocab_size), {}, &data)
                               .to(mt::DType::i64)
                               .to_vector<double>()) {
      prompt.push_back(static_cast<int64_t>(id));
    }
    std::printf(
        "generate_bench: %s, %s weights on %s, batch 1, prompt %lld tokens, %lld new tokens, greedy, "
        "KV cache\n",
        bench::llama_description(shape, config_path, config).c_str(), dtype_name.c_str(), device.str().c_str(),
        static_cast<long long>(prompt_len), static_cast<long long>(new_tokens));

    using Clock = std::chrono::steady_clock;
    std::vector<Clock::time_point> token_times;
    mt::nn::GenerateOptions options;
    options.max_new_tokens = new_tokens;
    options.temperature = 0;  // greedy
    options.use_cache = true;
    options.stop_token = std::nullopt;  // every run makes all new_tokens
    // Each token reaches the host (its pick reads the logits), so its time is after its work.
    options.on_token = [&](int64_t) { token_times.push_back(Clock::now()); };
    const auto ms_between = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    std::vector<double> prompt_ms, token_ms, tokens_per_s;
    for (int64_t run = 0; run < warmup + repeats; ++run) {
      token_times.clear();
      bench::synchronize(device);
      const Clock::time_point start = Clock::now();
      const std::vector<int64_t> out = mt::nn::generate(model, prompt, options);
      bench::synchronize(device);
      const Clock::time_point end = Clock::now();
      MT_CHECK(static_cast<int64_t>(out.size()) == prompt_len + new_tokens &&
                   static_cast<int64_t>(token_times.size()) == new_tokens,
               "generate stopped early: ", out.size() - prompt.size(), " of ", new_tokens, " new tokens");
      if (run < warmup) continue;
      prompt_ms.push_back(ms_between(start, token_times.front()));
      if (new_tokens > 1) {
        token_ms.push_back(ms_between(token_times.front(), token_times.back()) / static_cast<double>(new_tokens - 1));
      }
      tokens_per_s.push_back(static_cast<double>(new_tokens) / (ms_between(start, end) / 1e3));
    }
    std::printf("%12s %12s %12s\n", "prompt ms", "ms/token", "tokens/s");
    std::printf("%12.2f %12.3f %12.1f\n", bench::median(prompt_ms), token_ms.empty() ? 0.0 : bench::median(token_ms),
                bench::median(tokens_per_s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
