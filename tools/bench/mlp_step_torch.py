#!/usr/bin/env python3
"""PyTorch's side of tools/bench/mlp_step: 4 x Linear(1024) with GELU between, batch 64,
fp16 autocast + GradScaler + fused AdamW, eager and with torch.compile.

Steps run back to back between two synchronisations, as mlp_step times them; the median over
--repeats spans of --steps steps is printed, in ms per step.
"""
import argparse
import statistics

import torch


def make_model(width, layers):
    modules = []
    for i in range(layers):
        modules.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            modules.append(torch.nn.GELU())
    return torch.nn.Sequential(*modules).cuda()


def time_steps(step, warmup, steps, repeats):
    for _ in range(warmup):
        step()
    spans = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end) / steps)
    return statistics.median(spans)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.width, device="cuda")
    target = torch.randn(args.batch, args.width, device="cuda")
    print(f"torch {torch.__version__}; {args.layers} x Linear({args.width}) + GELU, batch {args.batch}, "
          f"fp16 autocast + GradScaler + fused AdamW")
    for mode in ("eager", "compile"):
        model = make_model(args.width, args.layers)
        forward = torch.compile(model) if mode == "compile" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        scaler = torch.amp.GradScaler("cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(forward(x), target)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        ms = time_steps(step, args.warmup, args.steps, args.repeats)
        print(f"torch {mode:<8} {ms:.3f} ms per step")


if __name__ == "__main__":
    main()
