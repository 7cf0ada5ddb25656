#!/usr/bin/env python3
"""mixtrain's training of a causal LM against PyTorch's, step by step, from the same weights on the same batches.

1. transformers builds the model from a random config and saves it with save_pretrained:
   --model gpt2 (GPT2LMHeadModel, dropout 0), by default GPT-2 124M's shape with vocab 50304;
   --model llama (LlamaForCausalLM, SDPA attention), by default SmolLM2-135M's shape: 30 layers,
   hidden 576, 9 heads sharing 3 key/value heads, intermediate 1536, vocab 49152, tied
   embeddings, rope_theta 100000, RMSNorm eps 1e-5. --layers, --embd, --heads, --vocab (and for
   llama --kv-heads, --intermediate) replace the shape's numbers.
2. The batches come from a random sparse Markov chain over the vocabulary (every token has
   --successors possible next tokens), so the loss has somewhere to go: from ln(vocab) towards
   ln(successors).
3. tools/parity/train_steps (mixtrain) and PyTorch (transformers' model, the loss as
   F.cross_entropy on the logits) train that model on those batches: AdamW on every
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

Usage (after building): python3 tools/parity/loss_curve.py --bin build/tools/train_steps --device cuda
  [--model llama --batch 8 --seq 512]
A small model for the CPU: --layers 2 --embd 64 --heads 4 --vocab 256 --batch 4 --seq 64 --amp off
  (llama: --model llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --intermediate 128 --vocab 256 ...)
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
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

# Each model's shapes (--shape; the first is the default). The size flags replace their numbers.
SHAPES = {
    "gpt2": {"gpt2-124m": dict(layers=12, embd=768, heads=12, vocab=50304)},
    # SmolLM2-135M's config.json, less its tokenizer's ids.
    "llama": {"smollm2-135m": dict(layers=30, embd=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152,
                                   max_positions=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                   initializer_range=0.041666666666666664)},
}
MODEL_CLASSES = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM}


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
    model = MODEL_CLASSES[args.model].from_pretrained(model_dir, attn_implementation="sdpa").to(device).train()
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
        sys.exit(f"loss_curve: {args.bin} printed {len(losses)} losses, not {args.steps}:\n{out}")
    return losses


def resolve_shape(p, args):
    """The model's numbers: the preset's, each replaced by its flag where one is given; checked."""
    shapes = SHAPES[args.model]
    name = args.shape or next(iter(shapes))
    if name not in shapes:
        p.error(f"--shape {name} is not a {args.model} shape ({', '.join(shapes)})")
    shape = dict(shapes[name])
    for key in ("layers", "embd", "heads", "kv_heads", "intermediate", "vocab"):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in shape:
            p.error(f"--{key.replace('_', '-')} is for --model llama")
        shape[key] = value
    if args.model == "llama" and args.embd is not None and args.intermediate is None:
        shape["intermediate"] = 64 * math.ceil(8 * args.embd / 3 / 64)  # SmolLM2's ratio (576 -> 1536)
    for key, value in shape.items():
        if isinstance(value, int) and value < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {value}")
    if shape["embd"] % shape["heads"]:
        p.error(f"--embd {shape['embd']} is not a multiple of --heads {shape['heads']}")
    if "kv_heads" in shape and shape["heads"] % shape["kv_heads"]:
        p.error(f"--heads {shape['heads']} is not a multiple of --kv-heads {shape['kv_heads']}")
    return shape


def make_model(model, shape, seq):
    """A randomly initialised transformers model of `shape` and a line that describes it."""
    if model == "gpt2":
        config = GPT2Config(vocab_size=shape["vocab"], n_positions=seq, n_embd=shape["embd"], n_layer=shape["layers"],
                            n_head=shape["heads"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(config), (f"GPT-2 {shape['layers']} layers, width {shape['embd']}, {shape['heads']} "
                                         f"heads, vocab {shape['vocab']}")
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["embd"], intermediate_size=shape["intermediate"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"],
                         max_position_embeddings=max(seq, shape["max_positions"]), rope_theta=shape["rope_theta"],
                         rms_norm_eps=shape["rms_norm_eps"], initializer_range=shape["initializer_range"],
                         attention_bias=False, tie_word_embeddings=True)
    return LlamaForCausalLM(config), (f"Llama {shape['layers']} layers, width {shape['embd']}, {shape['heads']} "
                                      f"heads ({shape['kv_heads']} key/value), intermediate {shape['intermediate']}, "
                                      f"vocab {shape['vocab']}, tied embeddings, rope_theta {shape['rope_theta']:g}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="path of the built train_steps program")
    p.add_argument("--model", default="gpt2", choices=sorted(SHAPES), help="the architecture")
    p.add_argument("--shape", default=None, help="the size preset: gpt2-124m (gpt2), smollm2-135m (llama); "
                   "default the model's")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", default=None, choices=["off", "bf16"], help="default: bf16 on cuda, off on cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--layers", type=int, default=None, help="default: the shape's")
    p.add_argument("--embd", type=int, default=None, help="width (hidden size); default: the shape's")
    p.add_argument("--heads", type=int, default=None, help="attention heads; default: the shape's")
    p.add_argument("--kv-heads", type=int, default=None, help="llama: key/value heads; default: the shape's")
    p.add_argument("--intermediate", type=int, default=None,
                   help="llama: MLP width; default: the shape's, or 8/3 x --embd rounded up to a multiple of 64 "
                   "when --embd is given")
    p.add_argument("--vocab", type=int, default=None, help="default: the shape's")
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
    shape = resolve_shape(p, args)
    for name in ("steps", "batch", "seq", "successors"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.clip < 0:
        p.error(f"--warmup and --clip must be >= 0, got {args.warmup} and {args.clip}")
    if args.schedule == "constant" and args.warmup:
        p.error("--warmup needs --schedule warmup-cosine")
    if args.schedule == "warmup-cosine" and args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} must be below --steps {args.steps}")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="loss_curve_")
    os.makedirs(work, exist_ok=True)
    model, described = make_model(args.model, shape, args.seq)
    model_dir = os.path.join(work, "model")
    model.save_pretrained(model_dir, safe_serialization=True)
    batches = markov_batches(args.steps, args.batch, args.seq, shape["vocab"], args.successors, args.seed)
    batches_path = os.path.join(work, "batches.safetensors")
    save_file({"ids": batches}, batches_path)
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}; {described}; "
          f"B={args.batch} T={args.seq}, {args.steps} steps on {args.device}, amp {amp}; AdamW lr {args.lr:g} betas "
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
        print(f"loss_curve: {args.model} f32, max |diff| {diff:.3e}, max relative {worst:.3e} "
              f"(tolerance {args.f32_tolerance:g}): {'PASS' if ok else 'FAIL'}")
    else:
        noise = max(abs(a - b) for a, b in zip(theirs, reference))
        ok = diff <= args.noise_factor * noise
        print(f"loss_curve: {args.model} {amp}, max |mixtrain - PyTorch| {diff:.3e}; bf16 noise (max |PyTorch {amp} - "
              f"PyTorch f32|) {noise:.3e}; allowed {args.noise_factor:g}x: {'PASS' if ok else 'FAIL'}")
        # Not part of the verdict: both half runs against the f32 one, on average as well as at the worst step
        # (one loss spike in either run decides the largest gap).
        def gaps(losses):
            each = [abs(a - b) for a, b in zip(losses, reference)]
            worst = max(range(len(each)), key=lambda k: each[k])
            return f"mean {sum(each) / len(each):.3e}, max {each[worst]:.3e} (step {worst})"
        print(f"loss_curve: {args.model} against PyTorch f32: mixtrain {amp} {gaps(ours)}; "
              f"PyTorch {amp} {gaps(theirs)}")
    print(f"loss_curve: {args.model} loss {ours[0]:.4f} -> {ours[-1]:.4f} (mixtrain), "
          f"{theirs[0]:.4f} -> {theirs[-1]:.4f} (PyTorch)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
