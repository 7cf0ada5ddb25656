#!/usr/bin/env bash
# mt_merge, for a GPT-2 and a Llama, on the CPU: an adapter that mt_lora trained, merged into its
# base, gives a model whose greedy text is the base's with the adapter (and not the base's alone);
# the merged directory is a plain model (no LoRA tensors) with the base's tokenizer files; a bf16
# base gives a bf16 model that mt_generate samples; an adapter of another model is refused and
# nothing is written.
#   merge.sh <bin dir> <work dir>
# The bf16 base is the f32 one rounded by a few lines of Python (MT_PYTHON, default python3; the
# standard library only).
set -uo pipefail
bin=$1 work=$2
python=${MT_PYTHON:-python3}
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"

for i in $(seq 1 200); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$work/a.txt"
for i in $(seq 1 200); do echo "sub f$i { my (\$x) = @_; return \$x * $i; }"; done >"$work/b.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || fail "mt_tokenize"
"$bin/mt_tokenize" --output "$work/b.tok" "$work/b.txt" >/dev/null || fail "mt_tokenize"
cat >"$work/llama.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON

# to_bf16 <model dir> <new dir>: the same model with every f32 tensor rounded to bf16 (to nearest even).
to_bf16() {
  mkdir -p "$2" && cp "$1/config.json" "$2/" &&
    "$python" - "$1/model.safetensors" "$2/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header, body = json.loads(data[8:8 + n]), data[8 + n:]
out, chunks, offset = {}, [], 0
for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
    if name == "__metadata__":
        out[name] = t
        continue
    raw = body[t["data_offsets"][0]:t["data_offsets"][1]]
    if t["dtype"] == "F32":
        bits = struct.unpack("<%dI" % (len(raw) // 4), raw)
        raw = struct.pack("<%dH" % len(bits), *[(b + 0x7FFF + ((b >> 16) & 1)) >> 16 for b in bits])
        t = dict(t, dtype="BF16")
    out[name] = dict(t, data_offsets=[offset, offset + len(raw)])
    chunks.append(raw)
    offset += len(raw)
text = json.dumps(out, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
PY
}
dtypes() { "$python" -c 'import json, struct, sys
d = open(sys.argv[1], "rb").read(); h = json.loads(d[8:8 + struct.unpack("<Q", d[:8])[0]])
print(" ".join(sorted({t["dtype"] for k, t in h.items() if k != "__metadata__"})))' "$1"; }

short=(--device cpu --seq-len 32 --batch-size 8 --log-every 10 --sample-tokens 0)
greedy=(--device cpu --prompt "sub " --tokens 30 --temperature 0)
for type in gpt2 llama; do
  w=$work/$type
  mkdir -p "$w"
  if [[ $type == gpt2 ]]; then shape=(--layers 2 --heads 2 --embd 32); else shape=(--config "$work/llama.json"); fi
  "$bin/mt_train" "${short[@]}" "${shape[@]}" --data "$work/a.tok" --steps 40 --lr 3e-3 --out "$w/base" \
    >"$w/train.log" 2>&1 || { cat "$w/train.log"; fail "$type: mt_train"; }
  "$bin/mt_lora" "${short[@]}" --base "$w/base" --data "$work/b.tok" --steps 40 --lr 1e-2 --r 4 --alpha 8 \
    --adapter-out "$w/adapter" >"$w/lora.log" 2>&1 || { cat "$w/lora.log"; fail "$type: mt_lora"; }
  "$bin/mt_merge" --device cpu --model "$w/base" --adapter "$w/adapter" --out "$w/merged" >"$w/merge.log" 2>&1 ||
    { cat "$w/merge.log"; fail "$type: mt_merge"; }
  cat "$w/merge.log"
  grep -q -E \
    "^mt_merge: $type model $w/base \(.* parameters, f32\) \+ adapter $w/adapter \(LoRA r=4 alpha=8 on [0-9]+ layers" \
    "$w/merge.log" || fail "$type: no line naming the model and the adapter"
  grep -q "^mt_merge: merged model saved to $w/merged (.* parameters, f32, no tokenizer files)$" "$w/merge.log" ||
    fail "$type: no line naming the merged model"
  [[ $(dtypes "$w/merged/model.safetensors") == F32 ]] || fail "$type: the merged f32 model is not f32"
  ! grep -q -a "lora" <(head -c 8192 "$w/merged/model.safetensors") || fail "$type: LoRA tensors in the merged model"
  cmp -s "$w/base/config.json" "$w/merged/config.json" || fail "$type: the merged config differs from the base's"

  with=$("$bin/mt_generate" --model "$w/base" --adapter "$w/adapter" "${greedy[@]}" 2>"$w/generate.log") ||
    { cat "$w/generate.log"; fail "$type: mt_generate --adapter"; }
  merged=$("$bin/mt_generate" --model "$w/merged" "${greedy[@]}" 2>>"$w/generate.log") ||
    { cat "$w/generate.log"; fail "$type: mt_generate of the merged model"; }
  base=$("$bin/mt_generate" --model "$w/base" "${greedy[@]}" 2>>"$w/generate.log") ||
    { cat "$w/generate.log"; fail "$type: mt_generate of the base"; }
  echo "merge: $type greedy, base with the adapter: '$with'; merged: '$merged'; base alone: '$base'"
  [[ "$with" == "$merged" ]] || fail "$type: the merged model's greedy text differs from the base's with the adapter"
  [[ "$with" != "$base" ]] || fail "$type: the adapter does not change the greedy text, so the test shows nothing"

  # A bf16 base, with a tokenizer file: a bf16 merged model (rounded once), the tokenizer file beside it.
  to_bf16 "$w/base" "$w/base_bf16" || fail "$type: converting the base to bf16"
  printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}\n' >"$w/base_bf16/tokenizer.json"
  "$bin/mt_merge" --device cpu --model "$w/base_bf16" --adapter "$w/adapter" --out "$w/merged_bf16" \
    >"$w/merge_bf16.log" 2>&1 || { cat "$w/merge_bf16.log"; fail "$type: mt_merge of the bf16 base"; }
  grep -q "^mt_merge: merged model saved to $w/merged_bf16 (.* parameters, bf16, 1 tokenizer files)$" \
    "$w/merge_bf16.log" || { cat "$w/merge_bf16.log"; fail "$type: no bf16 merged model line"; }
  [[ $(dtypes "$w/merged_bf16/model.safetensors") == BF16 ]] ||
    fail "$type: the merged bf16 model holds $(dtypes "$w/merged_bf16/model.safetensors")"
  cmp -s "$w/base_bf16/tokenizer.json" "$w/merged_bf16/tokenizer.json" || fail "$type: tokenizer.json not copied"
  bf16=$("$bin/mt_generate" --model "$w/merged_bf16" --tokenizer bytes "${greedy[@]}" 2>>"$w/generate.log") ||
    { cat "$w/generate.log"; fail "$type: mt_generate of the merged bf16 model"; }
  [[ "$bf16" == "sub "* ]] || fail "$type: the merged bf16 model's text does not continue the prompt: '$bf16'"
  echo "merge: $type greedy, merged bf16: '$bf16'"
done

# An adapter of another model: refused before anything is written, exit status 2.
out=$("$bin/mt_merge" --device cpu --model "$work/gpt2/base" --adapter "$work/llama/adapter" --out "$work/x" 2>&1)
rc=$?
((rc == 2)) || fail "merging a Llama adapter into a GPT-2: exit status $rc, expected 2: $out"
grep -q "^mt_merge: load_adapter: $work/llama/adapter/" <<<"$out" || fail "the refusal does not name the adapter: $out"
[[ ! -e "$work/x" ]] || fail "a refused merge wrote $work/x"
echo "merge: refused: $out"
echo "merge: PASS"
