#!/usr/bin/env python3
"""mixtrain's GPT-2 training against PyTorch's, step by step, from the same weights on the same batches.

1. transformers builds a GPT-2 (by default GPT-2 124M's shape with vocab 50304) from a random
   config, dropout 0, and saves it with save_pretrained.
2. The batches come from a random sparse Markov chain over the vocabulary (every token has
   --successors possible next tokens), so the loss has somewhere to go: from ln(vocab) towards
   ln(successors).
3. tools/parity/gpt_train_steps (mixtrain) and PyTorch (transformers' GPT2LMHeadModel, the
   loss as F.cross_entropy on the logits) train that model on those batches: AdamW on every
   parameter; by default GPT-2's recipe, the lr warmed up linearly over --warmup steps and then
   a half cosine to 0 at the last step (mt::WarmupCosineLR, and the same factor here in a
   LambdaLR: that of transformers' get_cosine_schedule_with_warmup), the gradients' global norm
   clipped at --clip; under autocast (--amp bf16) or in f32 (--amp off). --schedule constant
   --warmup 0 --clip 0 is the setup without either.
4. The losses are printed side by side. Under --amp off they must agree within
   --f32-tolerance (relative). Under bf16 the yardstick is bf16's own noise: PyTorch also
   trains in f32, and our distance from PyTorch's bf16 run may be at most --noise-factor
   times the distance between PyTorch's bf16 and f32 runs (the larger over the steps of each).
   A last line, not part of the verdict, gives both bf16 runs' mean and largest gaps to the f32
   run. Why the warm-up and the clipping: at a constant 6e-4 from step 0 this model makes
   one-step loss spikes, a different one in each run (PyTorch's f32 and bf16 runs included),
   and after a spike runs that agreed to 1e-6 drift apart, so the largest gap measured which run
   spiked more rather than the numerics.

Usage (after building): python3 tools/parity/gpt2_loss_curve.py --bin build/tools/gpt_train_steps --device cuda
A small model for the CPU: --layers 2 --embd 64 --heads 4 --vocab 256 --batch 4 --seq 64 --amp off
Exit status 0 when the curves agree. TF32 is off on the PyTorch side (mixtrain never uses it).
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel


def markov_batches(steps, batch, seq, vocab, successors, seed):
    """[steps, batch, seq + 1] ids: a random walk over a fixed random successor table."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, size=(vocab, successors))
    rows = steps * batch
    ids = np.empty((rows, seq + 1), dtype=np.int64)
    ids[:, 0] = rng.integers(0, vocab, size=rows)
    for t in range(1, seq + 1):
        ids[:, t] = table[ids[:, t - 1], rng.integers(0, successors, size=rows)]
    return torch.from_numpy(ids.reshape(steps, batch, seq + 1))


def torch_losses(model_dir, batches, device, amp, args):
    model = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="sdpa").to(device).train()
    fused = device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                                  weight_decay=args.weight_decay, fused=fused)
    scheduler = None
    if args.schedule == "warmup-cosine":
        warmup, total = args.warmup, batches.shape[0]

        def factor(step):  # step / warmup, then a half cosine from 1 to 0 at `total`
            if step < warmup:
                return step / warmup
            return max(0.0, 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    losses = []
    for step in range(batches.shape[0]):
        ids = batches[step].to(device)
        x, y = ids[:, :-1], ids[:, 1:]
        with torch.autocast(device_type=device.split(":")[0], dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        if scheduler:
            scheduler.step()
        losses.append(loss.item())
    return losses


def our_losses(args, model_dir, batches_path, amp):
    cmd = [args.bin, "--model", model_dir, "--batches", batches_path, "--device", args.device, "--amp", amp,
           "--lr", repr(args.lr), "--beta1", repr(args.beta1), "--beta2", repr(args.beta2), "--eps", repr(args.eps),
           "--weight-decay", repr(args.weight_decay), "--schedule", args.schedule, "--warmup", str(args.warmup),
           "--clip", repr(args.clip)]
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    if len(losses) != args.steps:
        sys.exit(f"gpt2_loss_curve: {args.bin} printed {len(losses)} losses, not {args.steps}:\n{out}")
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="path of the built gpt_train_steps program")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", default=None, choices=["off", "bf16"], help="default: bf16 on cuda, off on cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--successors", type=int, default=4, help="next tokens each token may have in the data")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--schedule", default="warmup-cosine", choices=["warmup-cosine", "constant"],
                   help="lr: linear warm-up then a half cosine to 0 at the last step, or constant")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps of warmup-cosine")
    p.add_argument("--clip", type=float, default=1.0, help="largest global gradient norm (0: no clipping)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--f32-tolerance", type=float, default=1e-4, help="relative, per step, under --amp off")
    p.add_argument("--noise-factor", type=float, default=2.0, help="bf16: allowed multiple of PyTorch's bf16-vs-f32")
    p.add_argument("--workdir", default=None, help="where to write the model and the batches")
    args = p.parse_args()
    amp = args.amp or ("bf16" if args.device.startswith("cuda") else "off")
    for name in ("steps", "layers", "embd", "heads", "vocab", "batch", "seq", "successors"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.clip < 0:
        p.error(f"--warmup and --clip must be >= 0, got {args.warmup} and {args.clip}")
    if args.schedule == "constant" and args.warmup:
        p.error("--warmup needs --schedule warmup-cosine")
    if args.schedule == "warmup-cosine" and args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} must be below --steps {args.steps}")
    if args.embd % args.heads:
        p.error(f"--embd {args.embd} is not a multiple of --heads {args.heads}")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="gpt2_loss_curve_")
    os.makedirs(work, exist_ok=True)
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.embd, n_layer=args.layers,
                        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model_dir = os.path.join(work, "model")
    GPT2LMHeadModel(config).save_pretrained(model_dir, safe_serialization=True)
    batches = markov_batches(args.steps, args.batch, args.seq, args.vocab, args.successors, args.seed)
    batches_path = os.path.join(work, "batches.safetensors")
    save_file({"ids": batches}, batches_path)
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}; GPT-2 "
          f"{args.layers} layers, width {args.embd}, {args.heads} heads, vocab {args.vocab}; B={args.batch} "
          f"T={args.seq}, {args.steps} steps on {args.device}, amp {amp}; AdamW lr {args.lr:g} betas "
          f"({args.beta1:g}, {args.beta2:g}) wd {args.weight_decay:g}; data: {args.successors} successors per token "
          f"(loss floor ln {args.successors} = {math.log(args.successors):.3f})", flush=True)

    ours = our_losses(args, model_dir, batches_path, amp)
    theirs = torch_losses(model_dir, batches, args.device, amp, args)
    reference = torch_losses(model_dir, batches, args.device, "off", args) if amp != "off" else None

    header = f"{'step':>4} {'mixtrain':>10} {'PyTorch':>10} {'|diff|':>9}"
    if reference:
        header += f" {'PyTorch f32':>11} {'bf16 noise':>10}"
    print(header)
    for s in range(args.steps):
        line = f"{s:4d} {ours[s]:10.5f} {theirs[s]:10.5f} {abs(ours[s] - theirs[s]):9.2e}"
        if reference:
            line += f" {reference[s]:11.5f} {abs(theirs[s] - reference[s]):10.2e}"
        print(line)

    diff = max(abs(a - b) for a, b in zip(ours, theirs))
    if reference is None:
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
        ok = worst <= args.f32_tolerance
        print(f"gpt2_loss_curve: f32, max |diff| {diff:.3e}, max relative {worst:.3e} "
              f"(tolerance {args.f32_tolerance:g}): {'PASS' if ok else 'FAIL'}")
    else:
        noise = max(abs(a - b) for a, b in zip(theirs, reference))
        ok = diff <= args.noise_factor * noise
        print(f"gpt2_loss_curve: {amp}, max |mixtrain - PyTorch| {diff:.3e}; bf16 noise (max |PyTorch {amp} - "
              f"PyTorch f32|) {noise:.3e}; allowed {args.noise_factor:g}x: {'PASS' if ok else 'FAIL'}")
        # Not part of the verdict: both half runs against the f32 one, on average as well as at the worst step
        # (one loss spike in either run decides the largest gap).
        def gaps(losses):
            each = [abs(a - b) for a, b in zip(losses, reference)]
            worst = max(range(len(each)), key=lambda k: each[k])
            return f"mean {sum(each) / len(each):.3e}, max {each[worst]:.3e} (step {worst})"
        print(f"gpt2_loss_curve: against PyTorch f32: mixtrain {amp} {gaps(ours)}; PyTorch {amp} {gaps(theirs)}")
    print(f"gpt2_loss_curve: loss {ours[0]:.4f} -> {ours[-1]:.4f} (mixtrain), {theirs[0]:.4f} -> {theirs[-1]:.4f} "
          "(PyTorch)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
