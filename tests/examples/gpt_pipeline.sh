#!/usr/bin/env bash
# The language-model programs end to end with a small GPT-2: tokenize two texts, pretrain on one,
# LoRA-fine-tune on the other, sample with the adapter (unmerged and merged: the same text), and
# load the merged model. Fails unless each program succeeds and both training losses fall. The
# samples are in f32 (--dtype f32), so that merging changes no greedy choice on a GPU either.
#   gpt_pipeline.sh <bin dir> <device> <work dir>
set -euo pipefail
bin=$1 device=$2 work=$3
rm -rf "$work" && mkdir -p "$work"

# Two different texts, generated here so the test needs no particular file on the machine.
for i in $(seq 1 300); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$work/a.txt"
for i in $(seq 1 300); do echo "sub f$i { my (\$x) = @_; return \$x * $i; }"; done >"$work/b.txt"

"$bin/mt_tokenize" --output "$work/a.tok" --val-output "$work/a_val.tok" --val-fraction 0.1 "$work/a.txt"
"$bin/mt_tokenize" --output "$work/b.tok" "$work/b.txt"

common=(--device "$device" --seq-len 32 --batch-size 8 --log-every 10 --sample-tokens 40)
"$bin/mt_train" --data "$work/a.tok" --val-data "$work/a_val.tok" --out "$work/model" --layers 2 --heads 2 \
  --embd 32 --steps 40 --lr 3e-3 --prompt "the " "${common[@]}" | tee "$work/train.log"
"$bin/mt_lora" --base "$work/model" --data "$work/b.tok" --adapter-out "$work/adapter" --merged-out "$work/merged" \
  --r 4 --alpha 8 --steps 40 --lr 1e-2 --prompt "sub " "${common[@]}" | tee "$work/lora.log"

falls() {  # "<tag>: loss A -> B ..." with B < A
  local line
  line=$(grep -E "^$1: loss [0-9.]+ -> [0-9.]+" "$2") || { echo "FAIL: no '$1: loss A -> B' line"; exit 1; }
  awk -v tag="$1" '{ if ($5 + 0 >= $3 + 0) { print "FAIL: " tag " loss did not fall: " $0; exit 1 } }' <<<"$line"
}
falls mt_train "$work/train.log"
falls mt_lora "$work/lora.log"
grep -q "trainable params: .* || all params: .* || trainable%: " "$work/lora.log" || { echo "FAIL: no PEFT summary"; exit 1; }
for f in adapter/adapter_config.json adapter/adapter_model.safetensors merged/config.json merged/model.safetensors; do
  [[ -s "$work/$f" ]] || { echo "FAIL: $f was not written"; exit 1; }
done

sample=(--device "$device" --dtype f32 --prompt "sub " --tokens 30 --temperature 0)
unmerged=$("$bin/mt_generate" --model "$work/model" --adapter "$work/adapter" "${sample[@]}")
merged=$("$bin/mt_generate" --model "$work/model" --adapter "$work/adapter" --merge "${sample[@]}")
saved=$("$bin/mt_generate" --model "$work/merged" "${sample[@]}")
echo "greedy sample with the adapter: $unmerged"
[[ "$unmerged" == "$merged" && "$merged" == "$saved" ]] ||
  { echo "FAIL: greedy samples differ: unmerged '$unmerged', merged '$merged', saved merged '$saved'"; exit 1; }
echo "gpt_pipeline: PASS"
