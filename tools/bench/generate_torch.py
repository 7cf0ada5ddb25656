#!/usr/bin/env python3
"""PyTorch's side of tools/bench/generate_bench: greedy generation with transformers' model.generate.

transformers' LlamaForCausalLM of the same shape as generate_bench's (--shape llama-3.2-1b by
default, or --config a config.json), random weights in bf16 (--dtype), batch 1, a random prompt of
--prompt-len tokens, do_sample=False, use_cache=True, max_new_tokens = min_new_tokens =
--new-tokens, so that no run ends early. tokens/s: the new tokens over a whole generate call,
timed with torch.cuda.synchronize() around it, the median of --repeats calls after --warmup calls.
Then as many calls again with a streamer that stamps each token as it reaches the host, for the
prompt ms (from the call to the first new token) and the ms per token after it: generate_bench's
columns.
"""
import argparse
import statistics
import time

import torch
import transformers
from transformers import LlamaForCausalLM

from llama_step_torch import LLAMA_SHAPES, describe, llama_config

try:
    from transformers.generation.streamers import BaseStreamer
except ImportError:  # generate only calls put() and end()
    BaseStreamer = object


class TokenStamps(BaseStreamer):
    """The host time at each put(): first the prompt, then each new token (already on the host)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.2-1b", choices=sorted(LLAMA_SHAPES))
    p.add_argument("--config", default=None, help="a Hugging Face config.json to take the shape from instead")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f32"), help="the weights' dtype")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (to try the script on small shapes)")
    args = p.parse_args()
    if args.prompt_len < 1 or args.new_tokens < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--prompt-len, --new-tokens and --repeats must be positive, --warmup not negative")
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = llama_config(args.shape, args.config)
    config.use_cache = True
    if args.prompt_len + args.new_tokens > config.max_position_embeddings:
        p.error(f"--prompt-len + --new-tokens exceed the model's {config.max_position_embeddings} positions")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(dtype).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=device)
    options = dict(attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=args.new_tokens,
                   min_new_tokens=args.new_tokens, use_cache=True, pad_token_id=config.eos_token_id)
    print(f"generate_torch: torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{describe(args.shape, args.config, config)}, {args.dtype} weights on {device}, batch 1, "
          f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, KV cache (model.generate)",
          flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def call(streamer=None):
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, streamer=streamer, **options)
        sync()
        seconds = time.perf_counter() - start
        made = out.shape[1] - args.prompt_len
        if made != args.new_tokens:
            raise RuntimeError(f"generate stopped early: {made} of {args.new_tokens} new tokens")
        return start, seconds

    tokens_per_s, prompt_ms, token_ms = [], [], []
    for run in range(args.warmup + args.repeats):
        _, seconds = call()
        if run >= args.warmup:
            tokens_per_s.append(args.new_tokens / seconds)
    for _ in range(args.repeats):
        stamps = TokenStamps()
        start, _ = call(stamps)
        new = stamps.times[1:]  # times[0]: the prompt, put before any work
        prompt_ms.append((new[0] - start) * 1e3)
        if len(new) > 1:
            token_ms.append((new[-1] - new[0]) * 1e3 / (len(new) - 1))
    print(f"{'prompt ms':>12} {'ms/token':>12} {'tokens/s':>12}")
    print(f"{statistics.median(prompt_ms):12.2f} {statistics.median(token_ms) if token_ms else 0.0:12.3f} "
          f"{statistics.median(tokens_per_s):12.1f}", flush=True)


if __name__ == "__main__":
    main()
