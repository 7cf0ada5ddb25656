#!/usr/bin/env bash
# Fine-tuning data end to end on the CPU, with a BPE tokenizer (the GPT-2-style fixture): pretrain a
# small GPT on text, turn a JSONL of prompt/completion pairs into a loss-masked token file, fine-tune
# with LoRA on it, and sample through the tokenizer saved with the model. The tokenizer reports
# the examples it wrote, also when split into shards and a validation file.
#   finetune_mask.sh <examples dir> <tokenizer fixture dir> <work dir>
# Skipped (77) where mixtrain was built without PCRE2 (the BPE tokenizers).
set -euo pipefail
bin=$1 tokenizer=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
if ! out=$("$bin/mt_tokenize" --tokenizer "$tokenizer" --output "$work/probe.tok" "$tokenizer/merges.txt" 2>&1); then
  grep -q "has no PCRE2" <<<"$out" && { echo "finetune_mask: $out; skipped"; exit 77; }
  fail "mt_tokenize: $out"
fi

for i in $(seq 1 300); do echo "Sentence $i of the text, with words that repeat and repeat."; echo; done >"$work/text.txt"
"$bin/mt_tokenize" --tokenizer "$tokenizer" --output "$work/text.tok" "$work/text.txt" | tee "$work/tokenize.log"
grep -q "byte-level BPE" "$work/tokenize.log" || fail "mt_tokenize did not use the BPE tokenizer"
"$bin/mt_train" --device cpu --tokenizer "$tokenizer" --data "$work/text.tok" --layers 2 --heads 2 --embd 32 \
  --seq-len 32 --batch-size 8 --steps 20 --log-every 10 --prompt "Sentence" --sample-tokens 8 --out "$work/base" \
  >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "mt_train"; }
grep -q "vocab 1001" "$work/train.log" || fail "the model's vocabulary is not the tokenizer's"
[[ -f "$work/base/tokenizer.json" ]] || fail "the tokenizer was not saved with the model"

for i in $(seq 1 200); do
  echo "{\"prompt\": \"Question $i: what comes after $i?\", \"completion\": \" Answer: $((i + 1)).\"}"
done >"$work/sft.jsonl"
"$bin/mt_tokenize" --tokenizer "$work/base" --format prompt-completion --output "$work/sft.tok" "$work/sft.jsonl" |
  tee "$work/sft_tokenize.log"
grep -Eq "200 examples .*% of tokens trained on" "$work/sft_tokenize.log" || fail "no loss-mask summary"
grep -q "train [0-9,]* tokens in 200 examples" "$work/sft_tokenize.log" || fail "no count of the examples written"
# Split and sharded, every file begins at an example start: the examples written add up to 200.
"$bin/mt_tokenize" --tokenizer "$work/base" --format prompt-completion --output "$work/sft_shards" --shard-tokens 1000 \
  --val-output "$work/sft_val.tok" --val-fraction 0.1 "$work/sft.jsonl" | tee "$work/sft_split.log"
train_examples=$(sed -nE 's/.*train [0-9,]+ tokens in ([0-9,]+) examples.*/\1/p' "$work/sft_split.log")
val_examples=$(sed -nE 's/.*val [0-9,]+ tokens in ([0-9,]+) examples.*/\1/p' "$work/sft_split.log")
[[ -n "$train_examples" && -n "$val_examples" ]] || fail "the split run printed no example counts"
((train_examples + val_examples == 200 && val_examples >= 1)) ||
  fail "train $train_examples + val $val_examples examples, not 200"
"$bin/mt_lora" --device cpu --base "$work/base" --data "$work/sft.tok" --seq-len 32 --batch-size 8 --steps 20 \
  --log-every 10 --prompt "Question 7: what comes after 7?" --sample-tokens 6 --adapter-out "$work/adapter" \
  >"$work/lora.log" 2>&1 || { cat "$work/lora.log"; fail "mt_lora"; }
grep -E "targets|loss .* -> " "$work/lora.log"
grep -q "adapter saved" "$work/lora.log" || fail "mt_lora saved no adapter"
echo "finetune_mask: OK"
