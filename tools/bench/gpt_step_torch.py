#!/usr/bin/env python3
"""PyTorch's side of tools/bench/gpt_step: the same GPT-2 step with transformers + PEFT.

GPT-2's shape from --layers/--heads/--embd/--vocab (default 124M: 12 layers, 768 wide, 12 heads,
vocab 50304; medium: --layers 24 --heads 16 --embd 1024; XL: --layers 48 --heads 25 --embd 1600),
B=16, T=1024, bf16 autocast, SDPA attention, LoRA r=8 alpha=16 on c_attn (PEFT), AdamW; without and
with gradient checkpointing (transformers' gradient_checkpointing_enable, non-reentrant). With
--full: full training (every parameter, fused AdamW), eager and with torch.compile. Prints peak
memory (torch.cuda.max_memory_allocated) and the median step time over --steps after --warmup
steps, timed with CUDA events.

--linear (with --full) replaces transformers' Conv1D layers (c_attn, c_proj, c_fc: weight
[in, out]) by equivalent nn.Linear layers (weight [out, in]), the modules the float8 runs use.

--float8 (with --full; implies --linear; default mode compile only) trains the blocks' Linear
layers in float8 under the bf16 autocast, lm_head (tied to the embedding) and any layer whose
features are not multiples of 16 excluded, then compiles the model:
  torchao     torchao.float8.convert_to_float8_training with the "tensorwise" recipe
  scaled_mm   the same recipe by hand (Float8LinearFn): dynamic per-tensor (current) scaling, x and
              W in E4M3 (scale 448/amax), dy in E5M2 (scale 57344/amax), the three GEMMs by
              torch._scaled_mm (y with fast accumulation, as torchao's recipe; y and dx in bf16,
              dW in f32); the forward's fp8 x and W saved for the backward
A missing torchao is an error (exit 2), not a fallback.

--self-check runs on the CPU and exits: the Conv1D replacement leaves a tiny GPT-2's logits
unchanged, and Float8LinearFn (its GEMMs by an emulation of _scaled_mm that enforces the CUDA
op's layouts, and by torch._scaled_mm itself where it runs on the CPU) matches an f32 linear
forward and backward within float8's error.
"""
import argparse
import statistics
import sys

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SHAPE_NAMES = {(12, 12, 768): "124M", (24, 16, 1024): "medium", (36, 20, 1280): "large", (48, 25, 1600): "XL"}


def replace_modules(model, pick, make):
    """Replaces each submodule m named n with pick(m, n) by make(m); returns how many it replaced."""
    hits = [(name, m) for name, m in model.named_modules() if name and pick(m, name)]
    for name, m in hits:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, make(m))
    return len(hits)


def linear_from_conv1d(conv):
    linear = nn.Linear(conv.nx, conv.nf, device="meta")
    linear.weight = nn.Parameter(conv.weight.detach().t().contiguous(), requires_grad=conv.weight.requires_grad)
    linear.bias = conv.bias
    return linear


def conv1d_to_linear(model):
    """Replaces every transformers Conv1D (y = x W + b, W [in, out]) by the same nn.Linear."""
    return replace_modules(model, lambda m, name: isinstance(m, Conv1D), linear_from_conv1d)


def float8_filter(module, fqn):
    """The Linear layers trained in float8: all but lm_head and those with features not multiples of 16."""
    return (isinstance(module, nn.Linear) and fqn.split(".")[-1] != "lm_head"
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def to_float8(t, dtype):
    """t cast to dtype with the per-tensor scale fmax/amax; returns it and the inverse scale (f32, 0-dim)."""
    fmax = torch.finfo(dtype).max
    scale = fmax / t.detach().abs().max().float().clamp(min=1e-12)
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


class Float8LinearFn(torch.autograd.Function):
    """y = x W^T in float8, tensorwise current scaling. torch._scaled_mm(a, b) takes a row-major
    [M, K] and b column-major [K, N] (the .t() of a row-major [N, K]) with the inverse scales."""

    @staticmethod
    def forward(ctx, x, weight):
        x8, x_inv = to_float8(x.reshape(-1, x.shape[-1]), E4M3)
        w8, w_inv = to_float8(weight, E4M3)
        y = torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype, use_fast_accum=True)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_float8(dy.reshape(-1, dy.shape[-1]), E5M2)
        # dx [M, K] = dy [M, N] . W [N, K]; dW [N, K] = dy^T [N, M] . x [M, K]
        dx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.x_dtype)
        dw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=g_inv, scale_b=x_inv,
                              out_dtype=ctx.w_dtype)
        return dx.reshape(ctx.x_shape), dw


class Float8Linear(nn.Linear):
    """nn.Linear through Float8LinearFn; under CUDA autocast its input is cast to the autocast dtype
    (as F.linear's) and the f32 weight straight to float8."""

    @classmethod
    def from_linear(cls, linear):
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x):
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        y = Float8LinearFn.apply(x, self.weight)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def import_torchao():
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:  # an ImportError, or a torchao built for another torch
        print(f"--float8 torchao: torchao.float8 does not import ({type(e).__name__}: {e}); "
              f"install torchao, or run --float8 scaled_mm", file=sys.stderr)
        sys.exit(2)
    return torchao.__version__, Float8LinearConfig, convert_to_float8_training


def to_float8_training(model, recipe, torchao_api):
    """Converts the model's Linear layers per float8_filter; returns how many it converted."""
    if recipe == "scaled_mm":
        return replace_modules(model, lambda m, name: type(m) is nn.Linear and float8_filter(m, name),
                               Float8Linear.from_linear)
    _, config_cls, convert = torchao_api
    convert(model, module_filter_fn=float8_filter, config=config_cls.from_recipe_name("tensorwise"))
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def gpt2_config(args):
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.embd, n_layer=args.layers,
                        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    config._attn_implementation = "sdpa"
    return config


def build_model(config, args, mode, torchao_api):
    """The model of one mode on the GPU, and how many Linear layers run in float8."""
    model = GPT2LMHeadModel(config)
    if args.linear:
        conv1d_to_linear(model)
    n_float8 = to_float8_training(model, args.float8, torchao_api) if args.float8 != "off" else 0
    model = model.cuda()
    if mode == "blocks":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not args.full:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True))
    return model, n_float8


def time_steps(forward, opt, args, x, y):
    """The median step time (ms) over args.steps after args.warmup steps; peak memory reset after warm-up."""
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
    return statistics.median(times)


def describe(args, torchao_api):
    """The header lines: torch, the shape, the step, and which float8 recipe runs."""
    shape = (args.layers, args.heads, args.embd)
    name = SHAPE_NAMES.get(shape, "custom") if args.vocab == 50304 else "custom"
    what = "full training" if args.full else "PEFT LoRA r=8 on c_attn"
    if args.linear:
        what += ", Conv1D as nn.Linear"
    lines = [f"torch {torch.__version__}; GPT-2 {name} shape ({args.layers} layers, {args.embd} wide, "
             f"{args.heads} heads, vocab {args.vocab}), B={args.batch} T={args.seq_len}, bf16 autocast, {what}"]
    if args.float8 == "torchao":
        lines.append(f"float8: torchao {torchao_api[0]} convert_to_float8_training, recipe tensorwise")
    elif args.float8 == "scaled_mm":
        lines.append("float8: torch._scaled_mm tensorwise current scaling (E4M3 x, W; E5M2 dy)")
    return lines


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--full", action="store_true", help="full training, eager and torch.compile, instead of LoRA")
    p.add_argument("--linear", action="store_true", help="with --full: Conv1D layers replaced by nn.Linear")
    p.add_argument("--float8", choices=("off", "torchao", "scaled_mm"), default="off",
                   help="with --full: the blocks' Linear layers in float8 (implies --linear; default modes: compile)")
    p.add_argument("--modes", default=None,
                   help="comma list of the modes to run (full: eager,compile; LoRA: off,blocks); default all")
    p.add_argument("--self-check", action="store_true",
                   help="check the Conv1D replacement and Float8LinearFn on the CPU")
    args = p.parse_args()
    if args.self_check:
        return args
    if (args.linear or args.float8 != "off") and not args.full:
        p.error("--linear and --float8 need --full")
    args.linear = args.linear or args.float8 != "off"
    all_modes = ("eager", "compile") if args.full else ("off", "blocks")
    default_modes = ("compile",) if args.float8 != "off" else all_modes
    args.modes = default_modes if args.modes is None else tuple(m for m in args.modes.split(",") if m)
    for m in args.modes:
        if m not in all_modes:
            p.error(f"--modes: unknown mode '{m}' for {'--full' if args.full else 'LoRA'} "
                    f"(known: {','.join(all_modes)})")
    if args.embd % args.heads:
        p.error(f"--embd {args.embd} is not a multiple of --heads {args.heads}")
    return args


def main():
    args = parse_args()
    if args.self_check:
        _self_check()
        return
    torchao_api = import_torchao() if args.float8 == "torchao" else None
    torch.manual_seed(0)
    config = gpt2_config(args)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len + 1), device="cuda")
    x, y = ids[:, :-1], ids[:, 1:]
    print("\n".join(describe(args, torchao_api)))
    print(f"{'mode':<10} {'peak GiB':>10} {'step ms':>10} {'tokens/s':>12}")
    for mode in args.modes:
        model, n_float8 = build_model(config, args, mode, torchao_api)
        if mode == args.modes[0] and args.float8 != "off":
            print(f"float8: {n_float8} Linear layers converted")
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, fused=True)
        forward = torch.compile(model) if mode == "compile" else model
        ms = time_steps(forward, opt, args, x, y)
        print(f"{mode:<10} {torch.cuda.max_memory_allocated() / 2**30:10.2f} {ms:10.1f} "
              f"{args.batch * args.seq_len / (ms / 1e3):12.0f}")
        del model, opt, forward
        torch.cuda.empty_cache()


def _emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype=None, use_fast_accum=False):
    """torch._scaled_mm in f32 on any device, refusing what the CUDA op refuses."""
    assert a.dtype in (E4M3, E5M2) and b.dtype in (E4M3, E5M2) and (a.dtype, b.dtype) != (E5M2, E5M2)
    assert a.stride(1) == 1 and a.stride(0) == a.shape[1], "a must be row-major"
    assert b.stride(0) == 1 and b.stride(1) == b.shape[0], "b must be column-major"
    assert a.shape[1] == b.shape[0] and all(d % 16 == 0 for d in (*a.shape, b.shape[1])), (a.shape, b.shape)
    assert scale_a.dtype == scale_b.dtype == torch.float32 and scale_a.dim() == scale_b.dim() == 0
    return (a.float() @ b.float() * (scale_a * scale_b)).to(out_dtype or a.dtype)


def _rel_err(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _check_conv1d_to_linear():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (2, 32))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        n = conv1d_to_linear(model)
        got = model(input_ids=ids).logits
    diff = (got - want).abs().max().item()
    left = sum(isinstance(m, Conv1D) for m in model.modules())
    print(f"conv1d_to_linear: {n} Conv1D replaced, {left} left, logits max abs diff {diff:.2e}")
    assert n == 8 and left == 0 and diff < 1e-5
    converted = to_float8_training(model, "scaled_mm", None)
    print(f"scaled_mm swap: {converted} Linear layers, lm_head {type(model.lm_head).__name__}")
    assert converted == 8 and type(model.lm_head) is nn.Linear


def _check_float8_linear(label):
    torch.manual_seed(0)
    x = torch.randn(4, 16, 96, requires_grad=True)
    layer = nn.Linear(96, 160)
    nn.init.normal_(layer.weight, std=0.02)
    dy = torch.randn(4, 16, 160)
    want = layer(x)
    want_dx, want_dw, want_db = torch.autograd.grad(want, (x, layer.weight, layer.bias), dy)
    fp8 = Float8Linear.from_linear(layer)
    got = fp8(x)
    got_dx, got_dw, got_db = torch.autograd.grad(got, (x, fp8.weight, fp8.bias), dy)
    errs = [_rel_err(got, want), _rel_err(got_dx, want_dx), _rel_err(got_dw, want_dw), _rel_err(got_db, want_db)]
    print(f"Float8LinearFn vs f32 ({label}): relative error y {errs[0]:.4f}, dx {errs[1]:.4f}, dW {errs[2]:.4f}, "
          f"db {errs[3]:.1e}")
    assert max(errs) < 0.1 and got_dw.dtype == torch.float32


def _self_check():
    _check_conv1d_to_linear()
    real = torch._scaled_mm
    try:
        torch._scaled_mm = _emulated_scaled_mm
        _check_float8_linear("emulated _scaled_mm")
    finally:
        torch._scaled_mm = real
    try:
        real(torch.zeros(16, 16, dtype=E4M3), torch.zeros(16, 16, dtype=E4M3).t(), torch.tensor(1.0),
             torch.tensor(1.0), out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError):
        print("torch._scaled_mm does not run on this CPU build: checked with the emulation only")
    else:
        _check_float8_linear("torch._scaled_mm on the CPU")
    print("self-check passed")


if __name__ == "__main__":
    main()
