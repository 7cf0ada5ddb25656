#!/usr/bin/env bash
# mt_export and mt_train --init-from: the model exported from the last checkpoint of a run is
# the model the run saved (bit for bit); --init-from continues from a model directory and carries
# its tokenizer files to the new model and checkpoint directories; errors name what is missing.
#   mt_export.sh <bin dir> <work dir>
set -uo pipefail
bin=$1 work=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 100); do echo "line $i of a small text to train on, again and again."; done >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || fail "tokenize"
train=("$bin/mt_train" --device cpu --data "$work/a.tok" --seq-len 16 --batch-size 2 --steps 4 --sample-tokens 0)

"${train[@]}" --layers 1 --heads 2 --embd 16 --out "$work/model" --save-dir "$work/ck" >"$work/train.log" ||
  { cat "$work/train.log"; fail "training"; }
[[ -f "$work/ck/config.json" ]] || fail "mt_train --save-dir wrote no config.json"
"$bin/mt_export" --checkpoint "$work/ck" --out "$work/exported" >"$work/export.log" ||
  { cat "$work/export.log"; fail "export"; }
grep -q "mt_export: step 4 of .*step-000000004.safetensors" "$work/export.log" || { cat "$work/export.log"; fail "export line"; }
cmp "$work/model/model.safetensors" "$work/exported/model.safetensors" || fail "the exported weights differ"
cmp "$work/model/config.json" "$work/exported/config.json" || fail "the exported config differs"

# --init-from: the architecture and the tokenizer files come from the directory.
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}\n' >"$work/model/tokenizer.json"
"${train[@]}" --init-from "$work/model" --out "$work/continued" --save-dir "$work/ck2" >"$work/init.log" ||
  { cat "$work/init.log"; fail "--init-from"; }
grep -q "GPT 1 layers, 2 heads, width 16" "$work/init.log" || { cat "$work/init.log"; fail "not the model's shape"; }
cmp "$work/model/tokenizer.json" "$work/continued/tokenizer.json" || fail "tokenizer.json not copied to --out"
"$bin/mt_export" --checkpoint "$work/ck2/step-000000004.safetensors" --out "$work/exported2" >/dev/null ||
  fail "export of --init-from's checkpoint"
cmp "$work/model/tokenizer.json" "$work/exported2/tokenizer.json" || fail "tokenizer.json not carried by the export"

# Errors.
out=$("${train[@]}" --init-from "$work/model" --layers 3 --out "$work/x" 2>&1) && fail "--init-from with --layers ran"
grep -q -- "--init-from excludes --layers" <<<"$out" || fail "no exclusion message: $out"
mkdir -p "$work/empty"
out=$("$bin/mt_export" --checkpoint "$work/empty" --out "$work/x" 2>&1) && fail "export of an empty directory ran"
grep -q "no checkpoint (step-\*.safetensors) in it" <<<"$out" || fail "empty directory message: $out"
cp "$work/ck/step-000000004.safetensors" "$work/empty/"
out=$("$bin/mt_export" --checkpoint "$work/empty" --out "$work/x" 2>&1) && fail "export without a config ran"
grep -q "config.json: no model config here; pass --config" <<<"$out" || fail "missing config message: $out"
echo "mt_export: the exported model equals the saved one; --init-from keeps the shape and the tokenizer files"
