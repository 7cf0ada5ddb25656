#!/usr/bin/env python3
"""mixtrain's Llama-family models against Hugging Face transformers, on the same weights.

For each small random config of model_type llama, mistral and qwen2 (odd sizes: head sizes that
are not powers of two, 3 query heads per kv head, an explicit head_dim, qkv biases, tied and untied
embeddings, Llama 3 rope scaling), transformers builds the model, its weights are redrawn (biases
and norms included, so that every tensor matters) and it is saved with save_pretrained, sharded
for some. tools/parity/llama_logits (mixtrain) loads the directory and computes logits for a batch
of random ids of a length that is not a power of two:
  - f32 on every device asked for: relative L2 error against transformers' f32 logits <= 1e-4;
  - bf16 on CUDA: our error against the f32 logits at most twice transformers' own bf16 error;
  - our save_pretrained (sharded) read back by transformers gives its logits again (<= 1e-6);
  - LoRA on all seven projections both ways: our adapter (random B) loaded by PEFT, and PEFT's
    adapter loaded by mixtrain, give the same logits (<= 1e-4), different from the base's.

Usage (after building): python3 tools/parity/llama_parity.py --bin build/tools/llama_logits --devices cpu,cuda
Exit status 0 when every check passes. TF32 is off.
"""
import argparse
import copy
import os
import subprocess
import sys
import tempfile

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

TOLERANCE = 1e-4
COMMON = dict(max_position_embeddings=64, rms_norm_eps=1e-5, num_hidden_layers=2)
CONFIGS = {
    "llama untied, 3 q per kv, head 12": (LlamaConfig, dict(vocab_size=97, hidden_size=72, intermediate_size=100,
                                                               num_attention_heads=6, num_key_value_heads=2,
                                                               tie_word_embeddings=False, **COMMON), None),
    "llama tied, head_dim 10 != 64/4, llama3 rope": (
        LlamaConfig, dict(vocab_size=131, hidden_size=64, intermediate_size=88, num_attention_heads=4,
                          num_key_value_heads=4, head_dim=10, tie_word_embeddings=True, rope_theta=500000.0,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=16), **COMMON), "30KB"),
    "llama attention_bias": (LlamaConfig, dict(vocab_size=61, hidden_size=48, intermediate_size=72,
                                                num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                                **COMMON), None),
    "mistral, sliding window above T": (MistralConfig, dict(vocab_size=89, hidden_size=60, intermediate_size=84,
                                                            num_attention_heads=5, num_key_value_heads=5,
                                                            sliding_window=4096, **COMMON), "20KB"),
    "qwen2 tied, qkv bias, 3 q per kv": (Qwen2Config, dict(vocab_size=101, hidden_size=72, intermediate_size=96,
                                                           num_attention_heads=6, num_key_value_heads=2,
                                                           tie_word_embeddings=True, **COMMON), None),
}


def relative_error(ours, theirs):
    return ((ours - theirs).norm() / theirs.norm()).item()


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def build(config_class, kwargs, directory, shard):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_class(**kwargs), torch_dtype=torch.float32,
                                             attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(directory, max_shard_size=shard) if shard else model.save_pretrained(directory)
    return model


TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adapter_checks(binary, work, directory, model, ids, base_logits):
    ids_path, out = os.path.join(work, "ids.safetensors"), os.path.join(work, "lora.safetensors")
    ours_dir, peft_dir = os.path.join(work, "ours_adapter"), os.path.join(work, "peft_adapter")
    run([binary, "--model", directory, "--ids", ids_path, "--out", out, "--make-adapter", ours_dir])
    ours = load_file(out)["logits"]
    with torch.no_grad():
        theirs = PeftModel.from_pretrained(model, ours_dir).eval()(ids).logits.float()
    # PEFT's own adapter (random B: init_lora_weights=False) on a fresh copy of the base.
    base = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    torch.manual_seed(1)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))
    peft_model.save_pretrained(peft_dir)
    with torch.no_grad():
        peft_logits = peft_model.eval()(ids).logits.float()
    run([binary, "--model", directory, "--ids", ids_path, "--out", out, "--adapter", peft_dir])
    return [("our adapter in PEFT", relative_error(ours, theirs), TOLERANCE),
            ("PEFT's adapter in mixtrain", relative_error(load_file(out)["logits"], peft_logits), TOLERANCE),
            ("the adapter moves the logits from the base's (at least 1e-3)", -relative_error(theirs, base_logits), -1e-3)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="path of the built llama_logits program")
    parser.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for index, (label, (config_class, kwargs, shard)) in enumerate(CONFIGS.items()):
            directory = os.path.join(work, f"model{index}")
            model = build(config_class, kwargs, directory, shard)
            sharded = os.path.exists(os.path.join(directory, "model.safetensors.index.json"))
            ids = torch.randint(0, kwargs["vocab_size"], (2, 37))
            save_file({"ids": ids}, os.path.join(work, "ids.safetensors"))
            with torch.no_grad():
                theirs = model(ids).logits.float()
            checks = []
            for device in args.devices.split(","):
                out = os.path.join(work, f"logits_{device}.safetensors")
                saved = os.path.join(work, f"saved{index}_{device}")
                run([args.bin, "--model", directory, "--ids", os.path.join(work, "ids.safetensors"), "--out", out,
                     "--device", device, "--save-to", saved, "--max-shard-bytes", "40000"])
                checks.append((f"f32 {device}", relative_error(load_file(out)["logits"], theirs), TOLERANCE))
                if device == "cuda":
                    run([args.bin, "--model", directory, "--ids", os.path.join(work, "ids.safetensors"), "--out", out,
                         "--device", device, "--dtype", "bf16"])
                    # A copy: casting the model itself to bf16 and back would leave its weights rounded
                    # for the checks after this one.
                    with torch.no_grad():
                        hf_bf16 = copy.deepcopy(model).to("cuda", torch.bfloat16)(ids.cuda()).logits.float().cpu()
                    hf_error = relative_error(hf_bf16, theirs)
                    checks.append((f"bf16 cuda (transformers' bf16 error {hf_error:.2e})",
                                   relative_error(load_file(out)["logits"], theirs), 2 * hf_error))
                reread = AutoModelForCausalLM.from_pretrained(saved, torch_dtype=torch.float32).eval()
                with torch.no_grad():
                    checks.append((f"our save_pretrained read by transformers ({device} run)",
                                   relative_error(reread(ids).logits.float(), theirs), 1e-6))
            checks += adapter_checks(args.bin, work, directory, model, ids, theirs)
            for what, error, tolerance in checks:
                ok = error <= tolerance
                failures += not ok
                # A negative pair is a lower bound on a difference, printed as such.
                shown = f"relative difference {-error:.2e} {'>=' if ok else '<'} {-tolerance:.1e}" if tolerance < 0 else \
                    f"relative error {error:.2e} {'<=' if ok else '>'} {tolerance:.1e}"
                print(f"llama_parity: {label}{' (sharded)' if sharded else ''}: {what}: {shown} {'ok' if ok else 'FAIL'}")
    print(f"llama_parity: {'all checks pass' if failures == 0 else f'{failures} checks FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
