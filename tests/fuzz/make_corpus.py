#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Each seed is a small valid file, so the fuzzer starts from inputs that pass the readers'
checks and mutates its way into the corners. Run it again after a format change; the
layouts follow core/safetensors.h, core/data/token_file.h (MTTOKENS versions 1 and 2 with
their loss mask and example starts, llm.c shards) and PEFT's adapter_config.json.
"""
import json
import pathlib
import struct

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)], laid out in name order as the writer does."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in sorted(tensors):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + data


def token_file(tokens, vocab_size):
    """Version 1: u16 tokens, no flags."""
    header = b"MTTOKENS" + struct.pack("<IIIIQ", 1, 2, vocab_size, 0, len(tokens))
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


def token_file_v2(tokens, vocab_size, loss_mask=None, example_starts=None):
    """Version 2: u16 tokens up to a vocabulary of 65536, else u32; flags bit 0 and the mask after the tokens,
    flags bit 1 and the example starts (a u64 count, then u64 offsets) after those."""
    width, code = (2, "H") if vocab_size <= 65536 else (4, "I")
    flags = (1 if loss_mask is not None else 0) | (2 if example_starts is not None else 0)
    header = b"MTTOKENS" + struct.pack("<IIIIQ", 2, width, vocab_size, flags, len(tokens))
    starts = b"" if example_starts is None else struct.pack(f"<{len(example_starts) + 1}Q", len(example_starts),
                                                              *example_starts)
    return header + struct.pack(f"<{len(tokens)}{code}", *tokens) + bytes(loss_mask or []) + starts


def llmc_shard(tokens):
    """llm.c's .bin shard: 256 i32 of header (magic, version 1, count, zeros), then u16 tokens."""
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(253 * 4)
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


def adapter_config(**overrides):
    config = {  # the fields PEFT writes for a LoRA adapter (json.dumps with sort_keys=True, indent=2)
        "alpha_pattern": {},
        "base_model_name_or_path": "gpt2",
        "bias": "none",
        "fan_in_fan_out": True,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": 8,
        "rank_pattern": {},
        "revision": None,
        "target_modules": ["c_attn", "c_proj"],
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    config.update(overrides)
    return json.dumps(config, indent=2, sort_keys=True).encode()


SEEDS = {
    "safetensors": {
        "two_tensors.safetensors": safetensors(
            [("bias", "I64", [2], struct.pack("<2q", -1, 7)),
             ("weight", "F32", [2, 3], struct.pack("<6f", 0.5, -1, 2, 0, 3.25, -0.125))],
            metadata={"format": "pt"}),
        "every_dtype.safetensors": safetensors(
            [("a_bf16", "BF16", [2], b"\x80\x3f\x00\xc0"),
             ("b_bool", "BOOL", [3], b"\x01\x00\x01"),
             ("c_f16", "F16", [1, 2], b"\x00\x3c\x00\xbc"),
             ("d_f64", "F64", [1], struct.pack("<d", 2.5)),
             ("e_i32", "I32", [2], struct.pack("<2i", 3, -4)),
             ("f_u8", "U8", [2, 2], b"\x00\x01\xfe\xff"),
             ("g_f8e4m3", "F8_E4M3", [2], b"\x38\xb8"),
             ("h_f8e5m2", "F8_E5M2", [2], b"\x3c\xbc")]),
        "empty_and_scalar.safetensors": safetensors(
            [("empty", "F32", [0, 4], b""), ("scalar", "F32", [], struct.pack("<f", 1.0))]),
    },
    "token_file": {
        "bytes.tokens": token_file(list(b"hello, token file"), 256),
        "full_u16.tokens": token_file([0, 1, 65535, 40000, 7], 65536),
        "one_token.tokens": token_file([0], 1),
        "v2_u16_masked.tokens": token_file_v2(list(b"Q: 2+2? A: 4"), 256, loss_mask=[0] * 8 + [1] * 4),
        "v2_u32.tokens": token_file_v2([0, 65535, 65536, 199999, 123456], 200000),
        "v2_u32_masked.tokens": token_file_v2([70000, 1, 2, 69999], 70001, loss_mask=[0, 1, 1, 0]),
        "v2_u16_examples.tokens": token_file_v2(list(b"Q: 1? A: 2Q: 3? A: 4"), 256,
                                                loss_mask=[0] * 7 + [1] * 3 + [0] * 7 + [1] * 3,
                                                example_starts=[0, 10]),
        "v2_u32_examples.tokens": token_file_v2([70000, 1, 2, 69999, 5], 70001, example_starts=[0, 1, 3]),
        "llmc_shard.bin": llmc_shard([50256, 15496, 11, 995, 0, 65535]),
    },
    "adapter_config": {
        "list_targets.json": adapter_config(),
        "regex_targets.json": adapter_config(target_modules=r".*\.(c_attn|c_fc)", use_rslora=True, r=4,
                                             lora_alpha=8.5),
        "minimal.json": json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                    "target_modules": ["q_proj", "v_proj"]}).encode(),
    },
}


def main():
    for target, seeds in SEEDS.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in seeds.items():
            assert len(content) < 4096, f"{target}/{name} is {len(content)} bytes; seeds stay under 4 KiB"
            (folder / name).write_bytes(content)
            print(f"{folder / name}: {len(content)} bytes")


if __name__ == "__main__":
    main()
