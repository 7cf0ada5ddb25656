#!/usr/bin/env python3
"""PyTorch's side of tools/bench/gpt_step: the same GPT-2 step with transformers + PEFT.

GPT-2 124M's shape (12 layers, 768 wide, 12 heads, vocab 50304), B=16, T=1024, bf16 autocast,
SDPA attention, LoRA r=8 alpha=16 on c_attn (PEFT), AdamW; without and with gradient
checkpointing (transformers' gradient_checkpointing_enable, non-reentrant). With --full: full
training (every parameter, fused AdamW), eager and with torch.compile. Prints peak memory
(torch.cuda.max_memory_allocated) and the median step time over --steps after --warmup steps,
timed with CUDA events.
"""
import argparse
import statistics

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--full", action="store_true", help="full training, eager and torch.compile, instead of LoRA")
    p.add_argument("--modes", default=None,
                   help="comma list of the modes to run (full: eager,compile; LoRA: off,blocks); default all")
    args = p.parse_args()
    all_modes = ("eager", "compile") if args.full else ("off", "blocks")
    modes = all_modes if args.modes is None else tuple(m for m in args.modes.split(",") if m)
    for m in modes:
        if m not in all_modes:
            p.error(f"--modes: unknown mode '{m}' for {'--full' if args.full else 'LoRA'} (known: {','.join(all_modes)})")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50304, n_positions=args.seq_len, n_embd=768, n_layer=12, n_head=12,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len + 1), device="cuda")
    x, y = ids[:, :-1], ids[:, 1:]
    what = "full training" if args.full else "PEFT LoRA r=8 on c_attn"
    print(f"torch {torch.__version__}; GPT-2 124M shape, B={args.batch} T={args.seq_len}, bf16 autocast, {what}")
    print(f"{'mode':<10} {'peak GiB':>10} {'step ms':>10} {'tokens/s':>12}")
    for mode in modes:
        model = GPT2LMHeadModel(config).cuda()
        if mode == "blocks":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not args.full:
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"],
                                                     fan_in_fan_out=True))
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, fused=True)
        forward = torch.compile(model) if mode == "compile" else model
        times = []
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = forward(input_ids=x).logits
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end.record()
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(start.elapsed_time(end))
        ms = statistics.median(times)
        print(f"{mode:<10} {torch.cuda.max_memory_allocated() / 2**30:10.2f} {ms:10.1f} "
              f"{args.batch * args.seq_len / (ms / 1e3):12.0f}")
        del model, opt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
