#!/usr/bin/env python3
"""PyTorch's side of tools/bench/op_bench: the same ops at the same shapes, on CUDA.

  gemm           F.linear(x, W)                      x [rows, width], W [4 width, width], forward
  gemm_bias      F.linear(x, W, b)                   the same with a bias, forward
  layer_norm     F.layer_norm                        x [rows, width], forward + backward of a random dy
  add_layer_norm x + delta, then F.layer_norm under autocast (an f32 stream x, w, b; delta and the
                 output in --dtype), forward + backward of random gradients of the sum and the output
  attention      F.scaled_dot_product_attention(is_causal=True) on q, k, v [batch, heads, seq, width / heads],
                 forward + backward of a random dO
  cross_entropy  F.cross_entropy(F.linear(x, W).float(), target), x [rows, width], W [vocab, width],
                 forward + backward: the logits formed, then the loss in f32 as autocast runs it
  adamw          torch.optim.AdamW(fused=True).step() over GPT-2's parameter set (--layers blocks, the
                 LM head tied to wte), parameters and gradients in --adamw-dtype (f32 by default)

Timed as op_bench times them: --sets input sets per op used in turn (AdamW one), --warmup untimed
runs, then the runs over the sets, repeated until there are at least --graph-runs of them, captured in
one CUDA Graph (torch.cuda.graph) whose replays are timed between two CUDA events, divided by their
runs (so that a replay's own launch, which no op pays inside a step captured whole, is spread over
them); --eager times each run between events instead.
An op whose capture fails is timed eagerly and says so. The median is printed, then one
`op_bench_torch: <op> <median_ms>` line per op.
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

OPS = ("gemm", "gemm_bias", "layer_norm", "add_layer_norm", "attention", "attention_bthd", "cross_entropy", "adamw")
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def time_eager_ms(body, sets, warmup, iters):
    for i in range(warmup):
        body(i % sets)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (start, end) in enumerate(events):
        start.record()
        body(i % sets)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def time_op_ms(body, sets, args):
    """body(k) runs the op on input set k. Returns (median ms per run, how it was timed)."""
    if args.eager:
        return time_eager_ms(body, sets, args.warmup, args.iters), "eager"
    # Warm-up on a side stream, as torch.cuda.graph asks, then capture the sets, passes times over.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(args.warmup, 1)):
            for k in range(sets):
                body(k)
    torch.cuda.current_stream().wait_stream(side)
    passes = max(1, -(-args.graph_runs // sets))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(passes):
                for k in range(sets):
                    body(k)
    except Exception as e:  # noqa: BLE001 - any refusal: say it and time eagerly
        how = f"eager (capture failed: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
        print(f"op_bench_torch: {how}", file=sys.stderr)
        torch.cuda.synchronize()
        return time_eager_ms(body, sets, args.warmup, args.iters), how
    graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.iters)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) / (passes * sets) for start, end in events), "graph"


def clear_grads(*tensors):
    for t in tensors:
        t.grad = None


def bench_gemm(args, dtype, with_bias):
    n = 4 * args.width
    x = [torch.randn(args.rows, args.width, device="cuda", dtype=dtype) for _ in range(args.sets)]
    w = [torch.randn(n, args.width, device="cuda", dtype=dtype) for _ in range(args.sets)]
    b = [torch.randn(n, device="cuda", dtype=dtype) if with_bias else None for _ in range(args.sets)]
    return time_op_ms(lambda k: F.linear(x[k], w[k], b[k]), args.sets, args)


def bench_layer_norm(args, dtype):
    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)

    x = [leaf(args.rows, args.width) for _ in range(args.sets)]
    w = [leaf(args.width) for _ in range(args.sets)]
    b = [leaf(args.width) for _ in range(args.sets)]
    dy = [torch.randn(args.rows, args.width, device="cuda", dtype=dtype) for _ in range(args.sets)]

    def body(k):
        clear_grads(x[k], w[k], b[k])
        F.layer_norm(x[k], (args.width,), w[k], b[k], eps=1e-5).backward(dy[k])

    return time_op_ms(body, args.sets, args)


def bench_add_layer_norm(args, dtype):
    def leaf(*shape, dt=torch.float32):
        return torch.randn(*shape, device="cuda", dtype=dt, requires_grad=True)

    x = [leaf(args.rows, args.width) for _ in range(args.sets)]
    delta = [leaf(args.rows, args.width, dt=dtype) for _ in range(args.sets)]
    w = [leaf(args.width) for _ in range(args.sets)]
    b = [leaf(args.width) for _ in range(args.sets)]
    dsum = [torch.randn(args.rows, args.width, device="cuda") for _ in range(args.sets)]
    dy = [torch.randn(args.rows, args.width, device="cuda", dtype=dtype) for _ in range(args.sets)]

    def body(k):
        clear_grads(x[k], delta[k], w[k], b[k])
        with torch.autocast("cuda", dtype=dtype):
            s = x[k] + delta[k]
            y = F.layer_norm(s, (args.width,), w[k], b[k], eps=1e-5).to(dtype)
        torch.autograd.backward([s, y], [dsum[k], dy[k]])

    return time_op_ms(body, args.sets, args)


def bench_attention(args, dtype, bthd=False):
    """bthd: the operands are stored [B, T, H, D] and passed as [B, H, T, D] transposed views."""
    d = args.width // args.heads
    stored = (args.batch, args.seq, args.heads, d) if bthd else (args.batch, args.heads, args.seq, d)
    leaves = [[torch.randn(stored, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]
              for _ in range(args.sets)]
    dout = [torch.randn(stored, device="cuda", dtype=dtype) for _ in range(args.sets)]

    def view(t):
        return t.transpose(1, 2) if bthd else t

    def body(k):
        q, key, v = leaves[k]
        clear_grads(q, key, v)
        F.scaled_dot_product_attention(view(q), view(key), view(v), is_causal=True).backward(view(dout[k]))

    return time_op_ms(body, args.sets, args)


def bench_cross_entropy(args, dtype):
    x = [torch.randn(args.rows, args.width, device="cuda", dtype=dtype, requires_grad=True) for _ in range(args.sets)]
    w = [(0.02 * torch.randn(args.vocab, args.width, device="cuda", dtype=dtype)).requires_grad_()
         for _ in range(args.sets)]
    target = [torch.randint(0, args.vocab, (args.rows,), device="cuda") for _ in range(args.sets)]

    def body(k):
        clear_grads(x[k], w[k])
        logits = F.linear(x[k], w[k])
        # autocast runs cross_entropy in f32; this is what it does to bf16/f16 logits.
        F.cross_entropy(logits.float(), target[k]).backward()

    return time_op_ms(body, args.sets, args)


def gpt2_parameter_shapes(args):
    """op_bench.cpp's list: wte, wpe, per block ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj, then ln_f."""
    c = args.width
    shapes = [(args.vocab, c), (args.seq, c)]
    for _ in range(args.layers):
        shapes += [(c,), (c,), (3 * c, c), (3 * c,), (c, c), (c,), (c,), (c,), (4 * c, c), (4 * c,), (c, 4 * c), (c,)]
    return shapes + [(c,), (c,)]


def bench_adamw(args, dtype):
    params = []
    for shape in gpt2_parameter_shapes(args):
        p = (0.02 * torch.randn(shape, device="cuda", dtype=dtype)).requires_grad_()
        p.grad = 1e-3 * torch.randn(shape, device="cuda", dtype=dtype)
        params.append(p)
    # capturable keeps the step count on the device, which a captured step needs.
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True, capturable=not args.eager)
    return time_op_ms(lambda k: opt.step(), 1, args)  # its 2 GB of state outruns L2: one set


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def op_list(text):
    ops = [op for op in text.split(",") if op]
    if not ops:
        raise argparse.ArgumentTypeError(f"expected a comma list of ops, got '{text}'")
    for op in ops:
        if op not in OPS:
            raise argparse.ArgumentTypeError(f"unknown op '{op}' (known: {', '.join(OPS)})")
    return ops


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--warmup", type=non_negative, default=5)
    p.add_argument("--iters", type=positive, default=50)
    p.add_argument("--sets", type=positive, default=4, help="input sets per op, used in turn (AdamW one)")
    p.add_argument("--graph-runs", type=positive, default=32,
                   help="CUDA graphs: the fewest runs of an op per captured graph (its sets repeated)")
    p.add_argument("--eager", action="store_true",
                   help="time each run between events, launch gaps included, instead of graph replays")
    p.add_argument("--ops", type=op_list, default=list(OPS))
    p.add_argument("--rows", type=positive, default=16384, help="B * T of gemm, layer_norm and cross_entropy")
    p.add_argument("--width", type=positive, default=768)
    p.add_argument("--batch", type=positive, default=16)
    p.add_argument("--seq", type=positive, default=1024)
    p.add_argument("--heads", type=positive, default=12)
    p.add_argument("--vocab", type=positive, default=50304)
    p.add_argument("--layers", type=positive, default=12, help="GPT-2 blocks in adamw's parameter set")
    p.add_argument("--adamw-dtype", choices=sorted(DTYPES), default="f32")
    args = p.parse_args()
    if ("attention" in args.ops or "attention_bthd" in args.ops) and args.width % args.heads:
        p.error(f"--width {args.width} is not a multiple of --heads {args.heads} (attention's head size)")
    torch.manual_seed(0)
    dtype = DTYPES[args.dtype]
    print(f"op_bench_torch on {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}: "
          + (f"median of {args.iters} timed runs after {args.warmup} warm-up, {args.sets} input sets in turn"
             if args.eager else
             f"median of {args.iters} timed replays of a CUDA Graph of at least {args.graph_runs} runs over "
             f"{args.sets} input sets in turn, after {args.warmup} warm-up runs per set (device time per run)"))
    results = []
    for op in args.ops:
        if op in ("gemm", "gemm_bias"):
            ms, how = bench_gemm(args, dtype, with_bias=op == "gemm_bias")
        elif op == "layer_norm":
            ms, how = bench_layer_norm(args, dtype)
        elif op == "add_layer_norm":
            ms, how = bench_add_layer_norm(args, dtype)
        elif op in ("attention", "attention_bthd"):
            ms, how = bench_attention(args, dtype, bthd=op == "attention_bthd")
        elif op == "cross_entropy":
            ms, how = bench_cross_entropy(args, dtype)
        else:
            ms, how = bench_adamw(args, DTYPES[args.adamw_dtype])
        print(f"{op:<14} {ms:10.3f} ms  {how}", flush=True)
        results.append((op, ms))
    for op, ms in results:
        print(f"op_bench_torch: {op} {ms:.4f}")


if __name__ == "__main__":
    main()
