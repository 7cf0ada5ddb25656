#!/usr/bin/env bash
# A Llama-family model end to end on the CPU through the same programs as GPT-2: a small llama
# config (3 query heads per kv head, untied head) pretrained from its config.json with the Llama 3
# style fixture tokenizer, LoRA on its seven projections with loss-masked prompt/completion data,
# the adapter merged, and samples through the saved tokenizer.
#   llama_finetune.sh <examples dir> <tokenizer fixture dir> <work dir>
# Skipped (77) where mixtrain was built without PCRE2 (the BPE tokenizers).
set -euo pipefail
bin=$1 tokenizer=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 200); do echo "Sentence $i of the text, with words that repeat and repeat."; echo; done >"$work/text.txt"
if ! out=$("$bin/mt_tokenize" --tokenizer "$tokenizer" --output "$work/text.tok" "$work/text.txt" 2>&1); then
  grep -q "has no PCRE2" <<<"$out" && { echo "llama_finetune: skipped: $out"; exit 77; }
  fail "mt_tokenize: $out"
fi
cat >"$work/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 1208, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
"$bin/mt_train" --device cpu --config "$work/config.json" --tokenizer "$tokenizer" --data "$work/text.tok" \
  --seq-len 32 --batch-size 8 --steps 30 --lr 3e-3 --log-every 10 --prompt "Sentence" --sample-tokens 8 \
  --out "$work/base" >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "mt_train --config"; }
grep -q "llama 2 layers, width 48, context 64, vocab 1208" "$work/train.log" || { cat "$work/train.log"; fail "model line"; }
first=$(grep -Eo "loss [0-9.]+ -> [0-9.]+" "$work/train.log" | tail -1)
echo "llama_finetune: pretraining $first"
awk '{ if (!($2 > $4)) exit 1 }' <<<"$first" || fail "pretraining did not lower the loss: $first"
[[ -f "$work/base/tokenizer.json" && -f "$work/base/config.json" ]] || fail "the model directory is incomplete"

for i in $(seq 1 100); do
  echo "{\"prompt\": \"Question $i: what comes after $i?\", \"completion\": \" Answer: $((i + 1)).\"}"
done >"$work/sft.jsonl"
"$bin/mt_tokenize" --tokenizer "$work/base" --format prompt-completion --output "$work/sft.tok" "$work/sft.jsonl" >/dev/null
"$bin/mt_lora" --device cpu --base "$work/base" --data "$work/sft.tok" --seq-len 32 --batch-size 8 --steps 20 \
  --lr 3e-3 --log-every 10 --prompt "Question 7: what comes after 7?" --sample-tokens 6 --r 4 --alpha 8 \
  --adapter-out "$work/adapter" --merged-out "$work/merged" >"$work/lora.log" 2>&1 || { cat "$work/lora.log"; fail "mt_lora"; }
grep -q "LoRA r=4 alpha=8 on 14 layers (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)" "$work/lora.log" ||
  { cat "$work/lora.log"; fail "not the seven projections of both layers"; }
grep -q "loss mask: .*% of tokens are targets" "$work/lora.log" || fail "no loss mask in the data line"
grep -q '"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"' <(head -c 4096 "$work/adapter/adapter_model.safetensors") ||
  fail "the adapter's keys are not PEFT's for this model"
"$bin/mt_generate" --device cpu --model "$work/merged" --prompt "Question 3:" --tokens 5 >"$work/generate.log" 2>&1 ||
  { cat "$work/generate.log"; fail "mt_generate of the merged model"; }
grep -E "loss .* -> " "$work/lora.log"
echo "llama_finetune: OK"
