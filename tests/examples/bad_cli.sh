#!/usr/bin/env bash
# Bad arguments and bad input files given to the GPT programs, on the CPU: each command must end
# with a non-zero exit status (not a signal, not a timeout) and print the expected words, which
# name the option or file and what is wrong. One line per case; fails if any case does.
#   bad_cli.sh <bin dir> <work dir>
set -uo pipefail
bin=$1 w=$2
rm -rf "$w" && mkdir -p "$w/empty"
setup_fail() { echo "FAIL: setup: $*"; exit 1; }

for i in $(seq 1 100); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$w/a.txt"
: >"$w/e.txt"
"$bin/gpt_tokenize" --output "$w/a.tok" "$w/a.txt" >/dev/null || setup_fail "gpt_tokenize"
# A valid token file whose vocabulary (1000) is larger than the byte-level models' (256):
# magic, version 1, 2 bytes per token, vocab_size 1000, reserved 0, count 3, tokens 1 2 999.
printf 'MTTOKENS\x01\0\0\0\x02\0\0\0\xe8\x03\0\0\0\0\0\0\x03\0\0\0\0\0\0\0\x01\0\x02\0\xe7\x03' >"$w/big.tok"

# Two tiny models (widths 16 and 32), a checkpoint of the wider one, and an adapter for it.
short=(--device cpu --data "$w/a.tok" --seq-len 16 --batch-size 2 --steps 2 --sample-tokens 0)
"$bin/gpt_train" "${short[@]}" --layers 1 --heads 2 --embd 16 --out "$w/model" >/dev/null ||
  setup_fail "gpt_train (width 16)"
"$bin/gpt_train" "${short[@]}" --layers 1 --heads 2 --embd 32 --out "$w/wide" --save-dir "$w/wide_ck" >/dev/null ||
  setup_fail "gpt_train (width 32)"
"$bin/gpt_lora" "${short[@]}" --r 2 --base "$w/wide" --adapter-out "$w/wide_adapter" >/dev/null ||
  setup_fail "gpt_lora"
ckpt=step-000000002.safetensors
[[ -s "$w/wide_ck/$ckpt" ]] || setup_fail "no checkpoint $w/wide_ck/$ckpt"
mkdir -p "$w/cut_ck" && head -c -100 "$w/wide_ck/$ckpt" >"$w/cut_ck/$ckpt"  # its last 100 bytes lost
mkdir -p "$w/text_model" && cp "$w/model/config.json" "$w/text_model/" &&
  cp "$w/a.txt" "$w/text_model/model.safetensors"

passed=0 failed=0
# check <case> <expected words> <command...>; the expected words may be several parts joined by " ... ".
check() {
  local name=$1 want=$2
  shift 2
  local out rc part missing=""
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  while IFS= read -r part; do
    [[ "$out" == *"$part"* ]] || missing=$part
  done <<<"${want// ... /$'\n'}"
  if ((rc == 0 || rc >= 124)); then
    echo "FAIL $name: exit status $rc (expected an error exit, not success, a signal or a timeout)"
  elif [[ -n "$missing" ]]; then
    echo "FAIL $name: exit status $rc, but the output lacks '$missing':"
    tail -n 5 <<<"$out" | sed 's/^/    /'
  else
    echo "ok   $name: $(grep -F -m 1 -- "${want%% ... *}" <<<"$out" | cut -c 1-200)"
    passed=$((passed + 1))
    return
  fi
  failed=$((failed + 1))
}

train=("$bin/gpt_train" --device cpu --out "$w/out" --layers 1 --sample-tokens 0)
lora=("$bin/gpt_lora" --device cpu --adapter-out "$w/adapter_out" --sample-tokens 0)
generate=("$bin/gpt_generate" --device cpu --tokens 4)

# Arguments.
check steps_negative "--steps: expected a positive number, got -1" "${train[@]}" --data "$w/a.tok" --steps -1
check tokens_zero "--tokens: expected a positive number, got 0" "${generate[@]}" --model "$w/model" --tokens 0
check unknown_option "The following argument was not expected: --bogus" "${train[@]}" --data "$w/a.tok" --bogus
check required_missing "--data is required" "${train[@]}"
check device_unknown "Device: cannot parse 'tpu'; expected 'cpu', 'cuda' or 'cuda:N'" "$bin/gpt_train" --device tpu \
  --data "$w/a.tok" --out "$w/out"
check amp_unknown "--amp: fp8 not in {auto,off,bf16,fp16}" "${train[@]}" --data "$w/a.tok" --amp fp8
check heads_do_not_divide_width "n_embd 16 is not a multiple of n_head 3" "${train[@]}" --data "$w/a.tok" --embd 16 \
  --heads 3
check checkpoint_mode_unknown "'all' is not one of off, blocks, blocks:K" "${train[@]}" --data "$w/a.tok" \
  --checkpoint all
check resume_without_save_dir "gpt_train: --resume needs --save-dir" "${train[@]}" --data "$w/a.tok" --resume
check seq_len_over_context "--seq-len 32 exceeds the model's n_positions 16" "${train[@]}" --data "$w/a.tok" \
  --seq-len 32 --context 16
check cuda_graph_on_cpu "gpt_train: --cuda-graph needs a CUDA device" "${train[@]}" --data "$w/a.tok" --cuda-graph
check lora_targets_match_nothing "apply_lora: no module matches the targets [q_proj]" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --targets q_proj
check empty_prompt "generate: the prompt is empty" "${generate[@]}" --model "$w/model" --prompt ""

# Data files.
check data_missing "--data: File does not exist: $w/nope.tok" "${train[@]}" --data "$w/nope.tok"
check data_is_text "$w/a.txt: not a token file: the first 8 bytes are not the magic \"MTTOKENS\"" "${train[@]}" \
  --data "$w/a.txt"
check data_vocab_too_large "$w/big.tok: the token file's vocab_size 1000 is larger than the model's vocab_size 256" \
  "${train[@]}" --data "$w/big.tok"
check data_shorter_than_a_window "$w/a.tok: 7292 tokens are too few for one window of seq_len 10000" "${train[@]}" \
  --data "$w/a.tok" --seq-len 10000
check tokenize_input_missing "$w/nope.txt: cannot open: No such file or directory" "$bin/gpt_tokenize" \
  --output "$w/x.tok" "$w/nope.txt"
check tokenize_input_empty "the input file '$w/e.txt' is empty" "$bin/gpt_tokenize" --output "$w/x.tok" "$w/e.txt"
check tokenize_no_training_tokens "7,292 tokens leave no training tokens with --val-fraction 1" "$bin/gpt_tokenize" \
  --output "$w/x.tok" --val-output "$w/v.tok" --val-fraction 1 "$w/a.txt"

# Model and adapter directories.
check base_missing "--base: Directory does not exist: $w/nowhere" "${lora[@]}" --base "$w/nowhere" --data "$w/a.tok"
check base_without_config "$w/empty/config.json: cannot open the GPT-2 config: No such file or directory" \
  "${lora[@]}" --base "$w/empty" --data "$w/a.tok"
check model_without_config "$w/empty/config.json: cannot open the GPT-2 config" "${generate[@]}" --model "$w/empty"
check weights_not_safetensors "$w/text_model/model.safetensors: safetensors header length" "${generate[@]}" \
  --model "$w/text_model"
check adapter_missing "--adapter: Directory does not exist: $w/nowhere" "${generate[@]}" --model "$w/model" \
  --adapter "$w/nowhere"
check adapter_files_missing "load_adapter: $w/empty/adapter_config.json: does not exist" "${generate[@]}" \
  --model "$w/model" --adapter "$w/empty"
expected="$w/wide_adapter/adapter_model.safetensors: 'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight'"
check adapter_of_another_base "$expected has shape [2, 32] in the file but [2, 16] in the model" "${generate[@]}" \
  --model "$w/model" --adapter "$w/wide_adapter"

# Training checkpoints (--resume reads the newest in --save-dir).
expected="$w/wide_ck/$ckpt: not a usable training checkpoint: load_state_dict: 'transformer.h.0.attn.c_attn.bias'"
check resume_from_another_model "$expected has shape [96] in the state but [48] in the module" "${train[@]}" \
  --data "$w/a.tok" --heads 2 --embd 16 --seq-len 16 --batch-size 2 --save-dir "$w/wide_ck" --resume
check resume_from_a_truncated_checkpoint "$w/cut_ck/$ckpt: tensor ... are out of the data section" "${train[@]}" \
  --data "$w/a.tok" --heads 2 --embd 32 --seq-len 16 --batch-size 2 --save-dir "$w/cut_ck" --resume

echo "bad_cli: $passed passed, $failed failed"
((failed == 0)) || exit 1
echo "bad_cli: PASS"
