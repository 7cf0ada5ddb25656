#!/usr/bin/env python3
"""Encoding speed of byte-level BPE: mixtrain (tokenize_bench) against Hugging Face tokenizers and
tiktoken, on one thread, on the same text, in one run; also mixtrain on all cores.

The text is what every Debian machine has under /usr/share (licenses, package copyright files and
changelogs), cut to --megabytes. A GPT-2-style tokenizer (ByteLevel pre-tokenizer with GPT-2's
pattern, --vocab ids) is trained on it with HF tokenizers, and tiktoken gets the same vocabulary as
mergeable ranks (the ids of a trained BPE are in merge order, so ranks = ids). All three must give
the same ids (checked by hash); then each encodes every document (cut at blank lines) --repeat
times, one thread, and the median is reported.

  tools/bench/tokenize_bench.py --bench build/tools/tokenize_bench [--megabytes 20] [--vocab 32000]
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # HF tokenizers: one thread, set before the import
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tiktoken  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def debian_text(limit_bytes):
    parts, total = [], 0
    files = sorted(Path("/usr/share/common-licenses").glob("*")) + sorted(Path("/usr/share/doc").glob("*/copyright"))
    files += sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz"))
    for f in files:
        if total >= limit_bytes or not f.is_file():
            continue
        data = gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes()
        text = data.decode("utf-8", errors="replace")
        parts.append(text)
        total += len(text.encode())
    return "\n\n".join(parts).encode()[:limit_bytes].decode("utf-8", errors="ignore")


def train(text_path, vocab, out):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(text_path)], trainer)
    tok.save(str(out))
    return tok


def tiktoken_encoding(tok):
    byte_of = {ch: b for b, ch in enumerate(bytes_to_unicode())}
    ranks = {bytes(byte_of[c] for c in token): i for token, i in tok.get_vocab().items()}
    return tiktoken.Encoding("bench", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})


def bytes_to_unicode():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def fnv1a(all_ids):
    h = 1469598103934665603
    count = 0
    for ids in all_ids:
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        count += len(ids)
    return h, count


def documents(text):
    docs, begin = [], 0
    while begin < len(text):
        end = text.find("\n\n", begin)
        end = len(text) if end < 0 else end + 2
        docs.append(text[begin:end])
        begin = end
    return docs


def time_python(encode, docs, repeat):
    encode(docs[:100])  # warm-up
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = encode(docs)
        runs.append(time.perf_counter() - start)
    return statistics.median(sorted(runs)), out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="the tokenize_bench program")
    parser.add_argument("--megabytes", type=float, default=20)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tokenize_bench."))
    text = debian_text(int(args.megabytes * 1e6))
    text_path = work / "text.txt"
    text_path.write_text(text, encoding="utf-8")
    mb = len(text.encode()) / 1e6
    hf = train(text_path, args.vocab, work / "tokenizer.json")
    tt = tiktoken_encoding(hf)
    docs = documents(text)

    ours = subprocess.run([args.bench, "--tokenizer", str(work / "tokenizer.json"), "--text", str(text_path),
                           "--repeat", str(args.repeat)], check=True, capture_output=True, text=True).stdout
    print(ours, end="")
    lines = ours.strip().splitlines()
    ours_one = float(lines[0].split(": ")[2].split()[0])
    ours_all = float(lines[1].split(": ")[2].split()[0])
    ours_hash = lines[0].rsplit(" ", 1)[1]

    hf_s, hf_ids = time_python(lambda d: [e.ids for e in map(hf.encode, d)], docs, args.repeat)
    tt_s, tt_ids = time_python(lambda d: [tt.encode_ordinary(x) for x in d], docs, args.repeat)
    for name, ids in (("HF tokenizers", hf_ids), ("tiktoken", tt_ids)):
        h, count = fnv1a(ids)
        agree = f"{h:016x}" == ours_hash
        print(f"tokenize_bench.py: {name}: {count} tokens, ids {'equal' if agree else 'DIFFER FROM'} mixtrain's")
        if not agree:
            sys.exit(1)
    rows = [("mixtrain, 1 thread", ours_one), ("HF tokenizers " + tokenizers.__version__ + ", 1 thread", mb / hf_s),
            ("tiktoken " + tiktoken.__version__ + ", 1 thread", mb / tt_s), (f"mixtrain, {os.cpu_count()} cores", ours_all)]
    print(f"\n{mb:.1f} MB of text, {len(docs)} documents, GPT-2-style BPE of {args.vocab} ids, median of {args.repeat}")
    print("| tokenizer | MB/s | vs tiktoken |\n| --- | ---: | ---: |")
    for name, speed in rows:
        print(f"| {name} | {speed:.2f} | {speed / (mb / tt_s):.2f}x |")
    print(json.dumps({"mb": mb, "mixtrain_1": ours_one, "hf_1": mb / hf_s, "tiktoken_1": mb / tt_s, "mixtrain_all": ours_all}))


if __name__ == "__main__":
    main()
