#!/usr/bin/env python3
"""PyTorch's side of tools/bench/llama_step: the same Llama training step with transformers + PEFT.

transformers' LlamaForCausalLM built from the same config as llama_step's (--shape smollm2-135m or
llama-3.2-1b, or --config a config.json), SDPA attention, random weights, random token ids, bf16
autocast, AdamW (fused). Two kinds of training:

  --lora-r 0 (or --full)  full training: f32 weights under bf16 autocast, fused AdamW over all of them
  --lora-r R              PEFT LoRA r=R, alpha=2R, on q,k,v,o,gate,up,down_proj; the frozen base held
                          in bf16 (as users load it, torch_dtype=torch.bfloat16), the adapters in f32

Modes (--modes, a comma list; default eager,compile): eager; compile (torch.compile of the model);
blocks (eager with transformers' gradient checkpointing, non-reentrant); blocks-compile (the same
under torch.compile). --accumulate N runs N micro-batches of --batch sequences per optimizer step,
each loss divided by N (every token is real, so that is the mean over the whole batch); step time and
tokens/s are per optimizer step. Prints, per mode, peak
memory (torch.cuda.max_memory_allocated, reset after warm-up), the median step time over --steps
after --warmup steps timed with CUDA events, tokens/s and the last step's loss: llama_step's
columns. A mode that runs out of memory prints OOM and the next one runs.
"""
import argparse
import gc
import json
import statistics
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# The config.json fields of the released models whose shapes the benchmarks use. Keep in step
# with bench::llama_shape in tools/bench/bench_common.h.
_COMMON = dict(model_type="llama", hidden_act="silu", tie_word_embeddings=True, rms_norm_eps=1e-5,
               attention_bias=False, mlp_bias=False)
LLAMA_SHAPES = {
    "smollm2-135m": dict(_COMMON, num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
                         max_position_embeddings=8192, bos_token_id=0, eos_token_id=0),
    "llama-3.2-1b": dict(_COMMON, num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                         rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192),
                         max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001),
    "llama-2-7b": dict(_COMMON, tie_word_embeddings=False, num_hidden_layers=32, hidden_size=4096,
                       num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                       rope_theta=10000.0, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
    "llama-3-8b": dict(_COMMON, tie_word_embeddings=False, num_hidden_layers=32, hidden_size=4096,
                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                       rope_theta=500000.0, max_position_embeddings=8192, bos_token_id=128000, eos_token_id=128001),
    "llama-2-13b": dict(_COMMON, tie_word_embeddings=False, num_hidden_layers=40, hidden_size=5120,
                        num_attention_heads=40, num_key_value_heads=40, intermediate_size=13824, vocab_size=32000,
                        rope_theta=10000.0, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
}


def llama_config(shape, config_path):
    """The LlamaConfig of --config (a config.json) or of the named --shape, SDPA attention."""
    if config_path:
        with open(config_path) as f:
            fields = json.load(f)
    else:
        fields = dict(LLAMA_SHAPES[shape])
    # from_dict, as a config.json is read: it takes the rope_theta / rope_scaling keys of every
    # transformers version.
    config = LlamaConfig.from_dict(fields)
    config._attn_implementation = "sdpa"
    return config


def describe(shape, config_path, c):
    """llama_step's description of the model: "smollm2-135m (llama: 30 layers, hidden 576, ...)"."""
    return (f"{config_path or shape} ({c.model_type}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_attention_heads}/{c.num_key_value_heads} heads, intermediate {c.intermediate_size}, "
            f"vocab {c.vocab_size}{', tied' if c.tie_word_embeddings else ''})")


class Timer:
    """Times a region with CUDA events on a GPU, with the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop_ms(self):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            return self.begin.elapsed_time(self.end)
        return (time.perf_counter() - self.begin) * 1e3


def build_model(config, args, mode, device):
    # LoRA: the frozen base made in bf16 (as users load it, torch_dtype=torch.bfloat16), never in f32
    # first (a 13B model is 52 GB in f32). Full training: f32 weights.
    dtype = torch.bfloat16 if args.lora_r > 0 else torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if mode.startswith("blocks"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_r > 0:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                                 target_modules=LORA_TARGETS))
        for p in model.parameters():  # PEFT makes them f32 already (autocast_adapter_dtype); made sure of
            if p.requires_grad:
                p.data = p.data.float()
    return model


def run_mode(config, args, mode, device, x, y):
    """(peak GiB, median step ms, last loss) of one mode."""
    model = build_model(config, args, mode, device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    forward = torch.compile(model) if mode.endswith("compile") else model
    timer = Timer(device)
    times = []
    loss = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timer.start()
        for micro in range(args.accumulate):
            rows = slice(micro * args.batch, (micro + 1) * args.batch)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = forward(input_ids=x[rows]).logits  # [B, T, V]
                # The loss over the logits upcast to f32, as gpt_step_torch.py computes it. transformers'
                # own loss path (labels=) would materialise the [B, T, V] logits too, and upcast them.
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y[rows].reshape(-1))
            del logits
            (loss / args.accumulate).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = timer.stop_ms()
        if step >= args.warmup:
            times.append(ms)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return peak, statistics.median(times), loss.item()


def is_oom(error):
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(LLAMA_SHAPES))
    p.add_argument("--config", default=None, help="a Hugging Face config.json to take the shape from instead")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank on the seven projections, alpha 2r (0: full)")
    p.add_argument("--full", action="store_true", help="full training (the same as --lora-r 0)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches of --batch sequences per optimizer step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="eager,compile", help="comma list of eager, compile, blocks, blocks-compile")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (to try the script on small shapes)")
    args = p.parse_args()
    if args.full and args.lora_r > 0:
        p.error("--full and --lora-r > 0 contradict each other")
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.seq_len < 1 or args.lora_r < 0 or args.accumulate < 1:
        p.error("--steps, --batch, --seq-len and --accumulate must be positive, --warmup and --lora-r not negative")
    all_modes = ("eager", "compile", "blocks", "blocks-compile")
    modes = tuple(m for m in args.modes.split(",") if m)
    for m in modes:
        if m not in all_modes:
            p.error(f"--modes: unknown mode '{m}' (known: {','.join(all_modes)})")
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = llama_config(args.shape, args.config)
    config.use_cache = False
    if args.seq_len > config.max_position_embeddings:
        p.error(f"--seq-len {args.seq_len} is longer than the model's {config.max_position_embeddings} positions")
    ids = torch.randint(0, config.vocab_size, (args.accumulate * args.batch, args.seq_len + 1), device=device)
    x, y = ids[:, :-1], ids[:, 1:]
    if args.lora_r > 0:
        import peft
        what = (f"PEFT {peft.__version__} LoRA r={args.lora_r} alpha={2 * args.lora_r} on q,k,v,o,gate,up,down_proj "
                f"(frozen base bf16, adapters f32)")
    else:
        what = "full training (f32 weights, fused AdamW)"
    print(f"llama_step_torch: torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{describe(args.shape, args.config, config)}, B={args.batch} T={args.seq_len} x{args.accumulate} "
          f"micro-batches per step, {device}, "
          f"bf16 autocast, SDPA, {what}", flush=True)
    print(f"{'mode':<10} {'peak GiB':>20} {'step ms':>16} {'tokens/s':>12} {'loss':>10}", flush=True)
    tokens = args.accumulate * args.batch * args.seq_len  # per optimizer step
    for mode in modes:
        try:
            peak, ms, loss = run_mode(config, args, mode, device, x, y)
            memory = "n/a (cpu)" if peak is None else f"{peak:.2f}"
            print(f"{mode:<10} {memory:>20} {ms:16.1f} {tokens / (ms / 1e3):12.0f} {loss:10.4f}",
                  flush=True)
        except Exception as error:  # noqa: BLE001 - out of memory only; anything else is raised again
            if not is_oom(error):
                raise
            print(f"{mode:<10} {'OOM':>20}", flush=True)
        finally:
            gc.collect()
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
