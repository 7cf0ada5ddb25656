#!/usr/bin/env python3
"""FP8 training against bf16 autocast from the same weights and batches, with our own programs.

Four runs, each pair from one seed (so one initialisation and one batch order):
  1. mt_train --precision amp  (bf16 autocast)           2. mt_train --precision fp8
  3. mt_lora on run 1's model, --base-dtype bf16          4. the same, --base-dtype fp8
and for each pair a table of the logged losses, then PASS or FAIL:
  * final loss: the mean of the training losses logged over the last 10% of the steps (one step's
    loss is one batch's, too noisy to compare at 1%), and the final validation loss when there is
    validation data; |fp8 - bf16| / bf16 <= --tolerance for both;
  * no divergence: every FP8 loss finite, and after the first 10% of the steps (the warm-up,
    where both sit on the initial loss) never above the bf16 loss of the same step by more than
    --divergence (relative).

By default the text is what every Debian/Ubuntu machine has, tokenized to bytes with mt_tokenize:
pretraining on /usr/share/common-licenses and up to ~3 MB of the Perl modules under
/usr/share/perl*, fine-tuning on perl-base's modules (which the pretraining text does not hold);
--pretrain-data and --lora-data take token files instead. The GPT-2 124M shape by default:

  tools/parity/fp8_convergence.py --workdir build/fp8_convergence

Exit status: 0 all pass, 1 a pair fails, 2 a program failed (the tail of its output is printed).
Standard library only; --plot draws the curves where matplotlib imports.
"""
import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from program_runs import Runner, program_env

PRETRAIN_PERL_BYTES = 3_000_000  # Perl modules added to the licences for pretraining


RUNNER = Runner("fp8_convergence")
fail, run = RUNNER.fail, RUNNER.run


def perl_base_dir():
    """perl-base's module folder, where strict.pm is (the way tools/demo.sh finds it)."""
    try:
        out = subprocess.run(["perl", "-Mstrict", "-e", 'print $INC{"strict.pm"}'], capture_output=True, text=True)
    except OSError:
        return None
    return Path(out.stdout).parent.resolve() if out.returncode == 0 and out.stdout else None


def default_corpora():
    """(pretraining files, fine-tuning files): disjoint, from the system's licences and Perl modules."""
    licences = sorted(p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file() and not p.is_symlink())
    if not licences:
        fail("no files in /usr/share/common-licenses; give --pretrain-data and --lora-data")
    base = perl_base_dir()
    base_modules = sorted(p for p in base.rglob("*.pm") if p.is_file()) if base else []
    # Other Perl modules (perl-modules-5.x), outside perl-base's folder, resolved to skip links.
    seen, others = set(), []
    for root in sorted(Path("/usr/share").glob("perl*")):
        for p in sorted(root.rglob("*.pm")):
            real = p.resolve()
            if real in seen or not real.is_file() or (base and base in real.parents):
                continue
            seen.add(real)
            others.append(real)
    if not base_modules and not others:
        fail("no Perl modules found (is perl installed?); give --pretrain-data and --lora-data")
    if others and base_modules:
        pretrain_perl, lora = others, base_modules
    else:  # only one set: every other file of it for each side
        modules = base_modules or others
        pretrain_perl, lora = modules[0::2], modules[1::2]
    chosen, total = [], 0
    for p in pretrain_perl:
        if total >= PRETRAIN_PERL_BYTES:
            break
        chosen.append(p)
        total += p.stat().st_size
    return licences + chosen, lora


def read_metrics(path):
    """{step: record} of a metrics JSON-lines file (train/metrics.cpp writes non-finite values as null)."""
    records = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{number}: not JSON ({e})")
        records[int(record["step"])] = {k: (math.nan if v is None else v) for k, v in record.items()}
    if not records:
        fail(f"{path}: no metrics records")
    return records


def compare(name, ref_path, fp8_path, steps, args):
    """Prints the pair's table and verdict; returns (passed, curves for the plot)."""
    ref, fp8 = read_metrics(ref_path), read_metrics(fp8_path)
    ref_loss = {s: r["loss"] for s, r in ref.items() if "loss" in r}
    fp8_loss = {s: r["loss"] for s, r in fp8.items() if "loss" in r}
    common = sorted(set(ref_loss) & set(fp8_loss))
    problems = []
    if sorted(fp8_loss) != sorted(ref_loss):
        problems.append(f"the runs logged different steps (bf16 {len(ref_loss)}, fp8 {len(fp8_loss)})")
    if not common:
        print(f"FAIL {name}: no common logged steps")
        return False, None

    stride = max(1, steps // 10)
    shown = [s for s in common if s == common[0] or s % stride == 0 or s == common[-1]]
    print(f"\n{name}: training loss at the logged steps (a row every {stride} steps)")
    print(f"{'step':>6} {'bf16':>10} {'fp8':>10} {'gap %':>8}")
    for s in shown:
        a, b = ref_loss[s], fp8_loss[s]
        gap = 100 * (b - a) / a if math.isfinite(a) and math.isfinite(b) and a != 0 else math.nan
        print(f"{s:>6} {a:>10.4f} {b:>10.4f} {gap:>+8.2f}")

    def rel_gap(a, b):
        return abs(b - a) / abs(a) if math.isfinite(a) and math.isfinite(b) and a != 0 else math.inf

    # Final training loss: the mean over the last 10% of the steps.
    tail_from = steps - max(1, round(0.1 * steps)) + 1
    tail = [s for s in common if s >= tail_from]
    if not tail:
        problems.append(f"no loss logged from step {tail_from} on")
    else:
        a = sum(ref_loss[s] for s in tail) / len(tail)
        b = sum(fp8_loss[s] for s in tail) / len(tail)
        g = rel_gap(a, b)
        print(f"final training loss (mean of the {len(tail)} logged steps {tail[0]}-{tail[-1]}): "
              f"bf16 {a:.4f}, fp8 {b:.4f}, gap {100 * g:.3f}% (tolerance {100 * args.tolerance:g}%)")
        if not g <= args.tolerance:
            problems.append(f"final training loss {100 * g:.3f}% apart")

    ref_val = [r["val_loss"] for s, r in sorted(ref.items()) if "val_loss" in r]
    fp8_val = [r["val_loss"] for s, r in sorted(fp8.items()) if "val_loss" in r]
    if ref_val and fp8_val:
        g = rel_gap(ref_val[-1], fp8_val[-1])
        print(f"final validation loss: bf16 {ref_val[-1]:.4f}, fp8 {fp8_val[-1]:.4f}, gap {100 * g:.3f}%")
        if not g <= args.tolerance:
            problems.append(f"final validation loss {100 * g:.3f}% apart")

    # Divergence: any non-finite FP8 loss, or one above bf16's by more than --divergence after warm-up.
    warmup = max(1, steps // 10)
    nonfinite = [s for s in sorted(fp8_loss) if not math.isfinite(fp8_loss[s])]
    if nonfinite:
        problems.append(f"fp8 loss not finite at step {nonfinite[0]} ({len(nonfinite)} steps)")
    excess = [(fp8_loss[s] / ref_loss[s] - 1, s) for s in common
              if s > warmup and math.isfinite(fp8_loss[s]) and math.isfinite(ref_loss[s]) and ref_loss[s] > 0]
    worst = max(excess) if excess else (0.0, 0)
    print(f"divergence check (steps {warmup + 1}-{common[-1]}): fp8 at most {100 * worst[0]:+.2f}% above bf16 "
          f"(step {worst[1]}; limit {100 * args.divergence:g}%), {len(nonfinite)} non-finite fp8 losses")
    if worst[0] > args.divergence:
        problems.append(f"fp8 loss {100 * worst[0]:.2f}% above bf16 at step {worst[1]}")
    if any(not math.isfinite(ref_loss[s]) for s in common):
        problems.append("the bf16 reference loss is not finite")
    overflows = sum(r.get("fp8_overflows", 0) for r in fp8.values() if math.isfinite(r.get("fp8_overflows", 0)))
    if any("fp8_overflows" in r for r in fp8.values()):
        print(f"fp8 overflows (the sum over the logged steps): {overflows:g}")

    curve = (common, [ref_loss[s] for s in common], [fp8_loss[s] for s in common])
    if problems:
        print(f"FAIL {name}: " + "; ".join(problems))
        return False, curve
    print(f"PASS {name}: final loss within {100 * args.tolerance:g}%, no divergence")
    return True, curve


def plot(path, curves):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fp8_convergence: no plot: matplotlib is missing (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (title, (steps, ref, fp8)) in zip(axes[0], curves):
        ax.plot(steps, ref, label="bf16", linewidth=1)
        ax.plot(steps, fp8, label="fp8", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"fp8_convergence: plot written to {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bin", default="build/examples", help="folder of mt_train, mt_lora and mt_tokenize")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--workdir", help="token files, models, metrics and logs (default: a new temporary folder)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16, help="pretraining sequences per step")
    p.add_argument("--steps", type=int, default=300, help="pretraining steps")
    p.add_argument("--lr", type=float, help="pretraining peak lr (default: mt_train's)")
    p.add_argument("--lora-steps", type=int, default=300)
    p.add_argument("--lora-batch-size", type=int, default=8)
    p.add_argument("--lora-lr", type=float, help="fine-tuning peak lr (default: mt_lora's)")
    p.add_argument("--seed", type=int, default=1337, help="one seed for every run")
    p.add_argument("--tolerance", type=float, default=0.01, help="largest relative gap of the final losses")
    p.add_argument("--divergence", type=float, default=0.10,
                   help="largest relative excess of an FP8 loss over bf16's at the same step, after warm-up")
    p.add_argument("--margin", type=int, help="mt_train --fp8-margin (the LoRA FP8 base has its own scales)")
    p.add_argument("--recipe", choices=["delayed", "current"], help="mt_train --fp8-recipe (default: mt_train's)")
    p.add_argument("--history", type=int, help="mt_train --fp8-history (delayed scaling; default: mt_train's)")
    p.add_argument("--pretrain-data", help="pretraining token file (default: licences and Perl modules)")
    p.add_argument("--pretrain-val", help="its validation token file")
    p.add_argument("--lora-data", help="fine-tuning token file (default: perl-base's modules)")
    p.add_argument("--lora-val", help="its validation token file")
    p.add_argument("--tokenizer", help="tokenizer for the default text and the model's vocabulary (default: bytes)")
    p.add_argument("--plot", help="write both pairs' loss curves to this PNG (needs matplotlib)")
    args = p.parse_args()

    programs = RUNNER.programs(args.bin, ("mt_train", "mt_lora", "mt_tokenize"))
    work = RUNNER.workdir(args.workdir)
    env = program_env()

    pretrain, pretrain_val = args.pretrain_data, args.pretrain_val
    lora, lora_val = args.lora_data, args.lora_val
    if pretrain is None or lora is None:
        pretrain_files, lora_files = default_corpora()
        tokenize = [programs["mt_tokenize"]] + (["--tokenizer", args.tokenizer] if args.tokenizer else [])

        def describe(files, out):
            size = sum(f.stat().st_size for f in files)
            return f"{len(files)} files ({size / 1e6:.2f} MB, first {files[0]}) -> {out}"
        if pretrain is None:
            pretrain, pretrain_val = work / "pretrain.tok", work / "pretrain_val.tok"
            run("tokenize pretraining text", [*tokenize, "--output", pretrain, "--val-output", pretrain_val,
                "--val-fraction", "0.05", *pretrain_files], work / "tokenize_pretrain.log", env,
                describe(pretrain_files, pretrain))
        if lora is None:
            lora, lora_val = work / "lora.tok", work / "lora_val.tok"
            run("tokenize fine-tuning text", [*tokenize, "--output", lora, "--val-output", lora_val,
                "--val-fraction", "0.05", *lora_files], work / "tokenize_lora.log", env, describe(lora_files, lora))

    # Both runs of a pair in bf16 autocast (FP8 runs inside it), on either device.
    common = ["--device", args.device, "--amp", "bf16", "--seed", args.seed, "--log-every", 1,
              "--eval-every", 0, "--sample-tokens", 0, "--progress", "lines"]
    shape = ["--layers", args.layers, "--heads", args.heads, "--embd", args.embd]
    pre = [programs["mt_train"], "--data", pretrain, "--seq-len", args.seq_len, "--batch-size", args.batch_size,
           "--steps", args.steps, *shape, *common]
    if pretrain_val:
        pre += ["--val-data", pretrain_val]
    if args.lr is not None:
        pre += ["--lr", args.lr]
    if args.tokenizer:
        pre += ["--tokenizer", args.tokenizer]
    fp8_flags = [] if args.margin is None else ["--fp8-margin", args.margin]
    fp8_flags += [] if args.recipe is None else ["--fp8-recipe", args.recipe]
    fp8_flags += [] if args.history is None else ["--fp8-history", args.history]
    for precision in ("amp", "fp8"):
        run(f"pretrain ({precision})", pre + ["--precision", precision, "--out", work / f"model_{precision}",
            "--metrics", work / f"pretrain_{precision}.jsonl", *(fp8_flags if precision == "fp8" else [])],
            work / f"pretrain_{precision}.log", env)

    ft = [programs["mt_lora"], "--base", work / "model_amp", "--data", lora, "--seq-len", args.seq_len,
          "--batch-size", args.lora_batch_size, "--steps", args.lora_steps, "--r", 16, "--alpha", 32,
          "--targets", "c_attn,c_proj,c_fc", *common]
    if lora_val:
        ft += ["--val-data", lora_val]
    if args.lora_lr is not None:
        ft += ["--lr", args.lora_lr]
    for dtype in ("bf16", "fp8"):
        run(f"LoRA ({dtype} base)", ft + ["--base-dtype", dtype, "--adapter-out", work / f"adapter_{dtype}",
            "--metrics", work / f"lora_{dtype}.jsonl"], work / f"lora_{dtype}.log", env)

    shape_text = (f"{args.layers} layers, {args.heads} heads, width {args.embd}, seq {args.seq_len}, "
                  f"{args.device}")
    ok_pre, curve_pre = compare(f"pretraining ({shape_text}, batch {args.batch_size}, {args.steps} steps)",
                                work / "pretrain_amp.jsonl", work / "pretrain_fp8.jsonl", args.steps, args)
    ok_lora, curve_lora = compare(f"LoRA r16 ({args.lora_batch_size} x {args.seq_len}, {args.lora_steps} steps), "
                                  "fp8 base vs bf16 base", work / "lora_bf16.jsonl", work / "lora_fp8.jsonl",
                                  args.lora_steps, args)
    if args.plot:
        curves = [(t, c) for t, c in (("pretraining", curve_pre), ("LoRA fine-tuning", curve_lora)) if c]
        if curves:
            plot(args.plot, curves)
    sys.exit(0 if ok_pre and ok_lora else 1)


if __name__ == "__main__":
    main()
