#!/usr/bin/env bash
# mt_export and mt_train --init-from: the model exported from the last checkpoint of a run is the
# model the run saved (bit for bit), for a GPT-2 and for a Llama; --init-from continues from a
# model directory and carries its tokenizer files to the new model and checkpoint directories;
# errors name what is missing.
#   export.sh <bin dir> <work dir>
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

# A Llama from its config.json: the type comes from the config.json in the --save-dir.
cat >"$work/llama.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
"${train[@]}" --config "$work/llama.json" --out "$work/llama" --save-dir "$work/llama_ck" >"$work/llama.log" ||
  { cat "$work/llama.log"; fail "training a Llama"; }
"$bin/mt_export" --checkpoint "$work/llama_ck" --out "$work/llama_exported" >"$work/llama_export.log" ||
  { cat "$work/llama_export.log"; fail "export of a Llama"; }
grep -q "mt_export: step 4 of .*step-000000004.safetensors -> .* (llama, " "$work/llama_export.log" ||
  { cat "$work/llama_export.log"; fail "Llama export line"; }
cmp "$work/llama/model.safetensors" "$work/llama_exported/model.safetensors" || fail "the exported Llama weights differ"
cmp "$work/llama/config.json" "$work/llama_exported/config.json" || fail "the exported Llama config differs"

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
printf '{"model_type": "bert"}\n' >"$work/empty/config.json"
out=$("$bin/mt_export" --checkpoint "$work/empty" --out "$work/x" 2>&1) && fail "export of a bert ran"
grep -q "config.json: model_type \"bert\" is not supported (gpt2, llama, mistral, qwen2)" <<<"$out" ||
  fail "unsupported type message: $out"
echo "export: the exported GPT-2 and Llama equal the saved ones; --init-from keeps the shape and the tokenizer files"
