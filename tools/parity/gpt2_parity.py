#!/usr/bin/env python3
"""mixtrain's GPT-2 against Hugging Face transformers and PEFT, on the same weights.

1. transformers builds a GPT-2 from a small random config and saves it with save_pretrained.
2. tools/parity/gpt_logits (mixtrain) loads that directory and computes logits in f32;
   PyTorch computes them from the same ids; the relative L2 error must be <= 1e-4.
3. gpt_logits puts a LoRA adapter with random B on the model, saves it in PEFT's layout and
   computes logits with it; peft.PeftModel.from_pretrained loads that adapter onto the
   PyTorch model; the logits must again agree within 1e-4, and differ from the base's.

Usage (after building): python3 tools/parity/gpt2_parity.py --bin build/tools/gpt_logits --device cuda
Exit status 0 when every check passes. TF32 is off on both sides.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

TOLERANCE = 1e-4


def relative_error(ours, theirs):
    return ((ours - theirs).norm() / theirs.norm()).item()


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="path of the built gpt_logits program")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", default=None, help="where to write the model, ids and logits")
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    work = args.workdir or tempfile.mkdtemp(prefix="gpt2_parity_")
    os.makedirs(work, exist_ok=True)

    config = GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=8,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(os.path.join(work, "model"), safe_serialization=True)
    ids = torch.randint(0, config.vocab_size, (4, 128), dtype=torch.int64)
    save_file({"ids": ids}, os.path.join(work, "ids.safetensors"))
    print(f"transformers {__import__('transformers').__version__}, peft {__import__('peft').__version__}, "
          f"torch {torch.__version__}; GPT-2 {config.n_layer} layers, width {config.n_embd}, "
          f"vocab {config.vocab_size}; ids {list(ids.shape)} on {args.device}")

    run([args.bin, "--model", os.path.join(work, "model"), "--ids", os.path.join(work, "ids.safetensors"),
         "--out", os.path.join(work, "base_logits.safetensors"), "--device", args.device])
    ours = load_file(os.path.join(work, "base_logits.safetensors"))["logits"].double()
    with torch.no_grad():
        theirs = model.to(args.device)(ids.to(args.device)).logits.double().cpu()
    base_error = relative_error(ours, theirs)
    print(f"base logits: relative L2 error {base_error:.3e}, max abs diff {(ours - theirs).abs().max().item():.3e} "
          f"(tolerance {TOLERANCE:g})")

    adapter = os.path.join(work, "adapter")
    run([args.bin, "--model", os.path.join(work, "model"), "--ids", os.path.join(work, "ids.safetensors"),
         "--out", os.path.join(work, "lora_logits.safetensors"), "--device", args.device, "--make-adapter", adapter,
         "--r", "8", "--alpha", "16", "--targets", "c_attn,c_proj,c_fc", "--seed", "1"])
    ours_lora = load_file(os.path.join(work, "lora_logits.safetensors"))["logits"].double()
    peft_model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        theirs_lora = peft_model(ids.to(args.device)).logits.double().cpu()
    lora_error = relative_error(ours_lora, theirs_lora)
    adapter_effect = relative_error(theirs_lora, theirs)
    print(f"LoRA logits (adapter saved by mixtrain, loaded by peft.PeftModel.from_pretrained): relative L2 error "
          f"{lora_error:.3e}, max abs diff {(ours_lora - theirs_lora).abs().max().item():.3e} "
          f"(tolerance {TOLERANCE:g}); the adapter moves the logits by {adapter_effect:.3e} relative")

    ok = base_error <= TOLERANCE and lora_error <= TOLERANCE and adapter_effect > 1e-3
    print("gpt2_parity:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
