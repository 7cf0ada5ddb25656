#!/usr/bin/env python3
"""A LoRA fine-tune of a small Llama-shaped model with the memory mechanisms on gives the plain run's losses.

Two mt_lora runs from the same base, seed and fine-tuning examples, LoRA r=8 on all seven projections:
  plain       --examples padded (one example per row), --batch-size B, --checkpoint off
  mechanisms  --examples packed (several examples per row, each with its own positions and
              attention), --batch-size B/2 --grad-accum 2 (the loss averaged over the real targets of
              both micro-batches), and --max-memory set between the planned peaks of `off` and
              `blocks` (mt_lora --dry-run), so that the plan recomputes some layers but not all
Both runs see the same examples at every step (the padded layout lays out the packed batch's
examples one per row). The training losses logged at every step must agree within --tolerance
(relative): packing changes only which rows the examples share, accumulation only reorders sums,
and a recomputed layer repeats its forward exactly. The base comes from mt_train on a config.json
of the given shape; the examples are cut from the given text files (prompt and completion of
varied lengths, bytes) and tokenized by mt_tokenize --format prompt-completion; the steps stay
within one epoch. Exit status 0 when every step agrees, 1 otherwise.

  tools/parity/lora_mechanisms.py --bin build/examples --device cpu --steps 200 docs/*.md
"""
import argparse
import json
import math
import random
import re
import sys
from pathlib import Path

from program_runs import Runner, program_env


RUNNER = Runner("lora_mechanisms")
fail = RUNNER.fail


def run(label, argv, log, env):
    return RUNNER.run(label, argv, log, env, shown=label)


def planned_peak(text):
    """GiB of mt_lora --dry-run's 'planned peak X GiB' line."""
    match = re.search(r"planned peak ([0-9.]+) GiB", text)
    if not match:
        fail(f"no planned peak in mt_lora --dry-run's output:\n{text}")
    return float(match.group(1))


def write_examples(texts, path, seq_len):
    """Prompt-completion JSONL cut from the text: consecutive pieces of 8 to seq_len / 2 bytes, one in
    eight up to seq_len (so that several share a packed row and some nearly fill one), a quarter to a
    half of each the prompt."""
    text = " ".join(" ".join(Path(t).read_text(errors="replace").split()) for t in texts)
    text = text.encode("ascii", "replace").decode()
    draw = random.Random(1)
    count, at = 0, 0
    with open(path, "w") as out:
        while at + seq_len < len(text):
            n = draw.randint(8, seq_len if draw.random() < 0.125 else seq_len // 2)
            piece = text[at:at + n]
            cut = draw.randint(n // 4, n // 2)
            out.write(json.dumps({"prompt": piece[:cut], "completion": piece[cut:]}) + "\n")
            at += n
            count += 1
    return count


def losses(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        if record.get("loss") is not None:
            out[int(record["step"])] = float(record["loss"])
    if not out:
        fail(f"{path}: no losses")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("text", nargs="+", help="text files to tokenize (bytes) for pretraining and fine-tuning")
    p.add_argument("--bin", default="build/examples", help="folder of mt_train, mt_lora and mt_tokenize")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--workdir", help="default: a new temporary folder")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="the plain run's; the other runs half, twice")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative gap of a step's loss")
    args = p.parse_args()
    if args.batch_size % 2 or args.batch_size < 2:
        p.error("--batch-size must be even")
    programs = RUNNER.programs(args.bin, ("mt_train", "mt_lora", "mt_tokenize"))
    work = RUNNER.workdir(args.workdir)
    env = program_env()

    config = dict(model_type="llama", vocab_size=256, hidden_size=args.hidden, intermediate_size=3 * args.hidden // 2,
                  num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=args.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32")
    (work / "config.json").write_text(json.dumps(config))
    data = work / "data.tok"
    run("tokenize (text)", [programs["mt_tokenize"], "--output", data, *args.text], work / "tokenize.log", env)
    examples = work / "examples.jsonl"
    count = write_examples(args.text, examples, args.seq_len)
    sft = work / "sft.tok"
    run(f"tokenize ({count} examples)", [programs["mt_tokenize"], "--format", "prompt-completion", "--output", sft,
        examples], work / "tokenize_sft.log", env)
    common = ["--device", args.device, "--seq-len", args.seq_len, "--sample-tokens", 0, "--progress", "lines",
              "--log-every", 1]
    run("base model (mt_train, 20 steps)", [programs["mt_train"], *common, "--data", data, "--config",
        work / "config.json", "--out", work / "base", "--steps", 20], work / "base.log", env)

    lora = [programs["mt_lora"], *common, "--data", sft, "--base", work / "base", "--r", 8, "--alpha", 16,
            "--steps", args.steps, "--lr", "2e-3", "--warmup", 10]
    half = ["--batch-size", args.batch_size // 2, "--grad-accum", 2]
    # The budget: the smallest whole MiB between the planned peaks of `blocks` and `off` whose plan
    # recomputes some layers but not all.
    peaks = {}
    for mode in ("off", "blocks"):
        text = run(f"mt_lora --dry-run --checkpoint {mode}", lora + half + ["--adapter-out", work / "dry",
                   "--checkpoint", mode, "--dry-run"], work / f"dry_{mode}.log", env)
        peaks[mode] = planned_peak(text)
    budget_mib = None
    for mib in range(math.floor(1024 * peaks["blocks"]), math.ceil(1024 * peaks["off"]) + 1):
        text = run(f"mt_lora --dry-run --max-memory {mib}MiB", lora + half + ["--adapter-out", work / "dry",
                   "--max-memory", f"{mib}MiB", "--dry-run"], work / "dry_budget.log", env) \
            if mib > 1024 * peaks["blocks"] else ""
        if "checkpointing layers:" in text:
            budget_mib = mib
            break
    if budget_mib is None:
        fail(f"no budget between the planned peaks of blocks ({peaks['blocks']} GiB) and off ({peaks['off']} GiB) "
             "gives a plan that recomputes some layers but not all: give a larger --hidden or --seq-len")
    plain = run("plain: one example per row, one batch, no checkpointing",
                lora + ["--examples", "padded", "--batch-size", args.batch_size, "--checkpoint", "off",
                        "--adapter-out", work / "a_plain", "--metrics", work / "plain.jsonl"], work / "plain.log", env)
    rows = re.search(r"into ([0-9,]+) rows of", plain)
    if not rows:
        fail("mt_lora did not say how many packed rows an epoch has (see plain.log)")
    if args.steps * args.batch_size > int(rows.group(1).replace(",", "")):
        # Past an epoch's end the runs would group rows differently (each drops its own partial batch).
        fail(f"{args.steps} steps of {args.batch_size} rows need more than the {rows.group(1)} packed rows the "
             "examples give: give more text or fewer --steps")
    mech = run(f"mechanisms: packed, {args.batch_size // 2} x 2 micro-batches, --max-memory {budget_mib}MiB",
               lora + half + ["--examples", "packed", "--max-memory", f"{budget_mib}MiB", "--adapter-out",
                              work / "a_mech", "--metrics", work / "mech.jsonl"], work / "mech.log", env)
    packing = re.search(r"[0-9,]+ examples \([0-9,]+ tokens\) in .*?per epoch \([^)]*\)", mech)
    print(f"lora_mechanisms: {packing.group(0) if packing else 'no packing described'}")
    plan = re.search(r"memory plan for \S+: .*", mech)
    print(f"lora_mechanisms: {plan.group(0) if plan else 'no plan printed'}")
    if not plan or "layers:" not in mech:
        fail("the plan did not recompute some layers but not all (see mech.log); the test needs one that does")
    if "gradient checkpointing off" not in plain:
        fail("the plain run did not say 'gradient checkpointing off'")

    a, b = losses(work / "plain.jsonl"), losses(work / "mech.jsonl")
    if sorted(a) != sorted(b):
        fail(f"the runs logged different steps ({len(a)} and {len(b)})")
    worst = max((abs(b[s] - a[s]) / abs(a[s]), s) for s in a)
    verdict = "PASS" if worst[0] <= args.tolerance else "FAIL"
    print(f"lora_mechanisms: {len(a)} steps, losses {a[min(a)]:.4f} -> {a[max(a)]:.4f} (plain) and "
          f"{b[min(b)]:.4f} -> {b[max(b)]:.4f} (mechanisms); largest relative gap {worst[0]:.2e} at step {worst[1]} "
          f"(tolerance {args.tolerance:g}): {verdict}")
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
