#!/usr/bin/env bash
# Bad arguments and bad input files given to the programs (examples/ and tools/bench/), on the
# CPU: each command must end with a non-zero exit status (not a signal, not a timeout) and print
# the expected words, which name the program, the option or file and what is wrong, once (never
# "mlp: mlp: ..."). One line per case; fails if any case does.
#   bad_cli.sh <bin dir> <work dir> <tools bin dir>
set -uo pipefail
bin=$1 w=$2 tools=$3
rm -rf "$w" && mkdir -p "$w/empty"
setup_fail() { echo "FAIL: setup: $*"; exit 1; }

for i in $(seq 1 100); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$w/a.txt"
: >"$w/e.txt"
"$bin/mt_tokenize" --output "$w/a.tok" "$w/a.txt" >/dev/null || setup_fail "mt_tokenize"
# A valid token file whose vocabulary (1000) is larger than the byte-level models' (256):
# magic, version 1, 2 bytes per token, vocab_size 1000, reserved 0, count 3, tokens 1 2 999.
printf 'MTTOKENS\x01\0\0\0\x02\0\0\0\xe8\x03\0\0\0\0\0\0\x03\0\0\0\0\0\0\0\x01\0\x02\0\xe7\x03' >"$w/big.tok"

# Two tiny models (widths 16 and 32), a checkpoint of the wider one, and an adapter for it.
short=(--device cpu --data "$w/a.tok" --seq-len 16 --batch-size 2 --steps 2 --sample-tokens 0)
"$bin/mt_train" "${short[@]}" --layers 1 --heads 2 --embd 16 --out "$w/model" >/dev/null ||
  setup_fail "mt_train (width 16)"
"$bin/mt_train" "${short[@]}" --layers 1 --heads 2 --embd 32 --out "$w/wide" --save-dir "$w/wide_ck" >/dev/null ||
  setup_fail "mt_train (width 32)"
"$bin/mt_lora" "${short[@]}" --r 2 --base "$w/wide" --adapter-out "$w/wide_adapter" >/dev/null ||
  setup_fail "mt_lora"
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
  elif grep -q -E '^([a-z_]+): \1: ' <<<"$out"; then
    echo "FAIL $name: the program's name twice: $(grep -E -m 1 '^([a-z_]+): \1: ' <<<"$out")"
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

train=("$bin/mt_train" --device cpu --out "$w/out" --layers 1 --sample-tokens 0)
lora=("$bin/mt_lora" --device cpu --adapter-out "$w/adapter_out" --sample-tokens 0)
generate=("$bin/mt_generate" --device cpu --tokens 4)
merge=("$bin/mt_merge" --device cpu --out "$w/merged_out")

# Arguments.
check steps_negative "mt_train: --steps: expected a positive number, got -1" "${train[@]}" --data "$w/a.tok" \
  --steps -1
check tokens_zero "mt_generate: --tokens: expected a positive number, got 0" "${generate[@]}" --model "$w/model" \
  --tokens 0
check unknown_option "mt_train: The following argument was not expected: --bogus" "${train[@]}" --data "$w/a.tok" \
  --bogus
check required_missing "mt_train: --data is required" "${train[@]}"
check heads_do_not_divide_width "n_embd 16 is not a multiple of n_head 3" "${train[@]}" --data "$w/a.tok" --embd 16 \
  --heads 3
check checkpoint_mode_unknown "'all' is not one of off, blocks, blocks:K" "${train[@]}" --data "$w/a.tok" \
  --checkpoint all
check seq_len_over_context "--seq-len 32 exceeds the model's longest sequence 16" "${train[@]}" --data "$w/a.tok" \
  --seq-len 32 --context 16
check cuda_graph_on_cpu "mt_train: --cuda-graph needs a CUDA device" "${train[@]}" --data "$w/a.tok" --cuda-graph
check precision_unknown "mt_train: --precision: expected amp or fp8, got fp16" "${train[@]}" --data "$w/a.tok" \
  --precision fp16
check fp8_recipe_unknown "mt_train: --fp8-recipe: expected delayed or current, got tensorwise" "${train[@]}" \
  --data "$w/a.tok" --fp8-recipe tensorwise
fp8_needs_bf16="mt_train: --precision fp8 runs the Linear layers in FP8 inside bf16 autocast and needs --amp bf16"
check fp8_without_bf16 "$fp8_needs_bf16 ... got off (f32)" "${train[@]}" --data "$w/a.tok" --precision fp8
check fp8_with_fp16 "$fp8_needs_bf16 ... got fp16" "${train[@]}" --data "$w/a.tok" --precision fp8 --amp fp16
check fp8_with_block_checkpointing \
  "mt_train: --precision fp8 cannot run with --checkpoint blocks: recomputing a block would not repeat its FP8 scales" \
  "${train[@]}" --data "$w/a.tok" --precision fp8 --amp bf16 --checkpoint blocks
check fp8_with_layer_checkpointing \
  "mt_train: --precision fp8 cannot run with --checkpoint layers:1: recomputing a block would not repeat its FP8 scales" \
  "${train[@]}" --data "$w/a.tok" --precision fp8 --amp bf16 --checkpoint layers:1
check max_memory_for_gpt2 "mt_train: --max-memory plans Llama-family models (llama, mistral, qwen2), not gpt2" \
  "${train[@]}" --data "$w/a.tok" --max-memory 20GiB
check max_memory_unit "mt_train: --max-memory: memory size '20TB': the unit must be GiB, G, MiB, M, GB or MB" \
  "${train[@]}" --data "$w/a.tok" --max-memory 20TB
check max_memory_with_checkpoint "mt_train: --checkpoint excludes --max-memory" "${train[@]}" --data "$w/a.tok" \
  --max-memory 20GiB --checkpoint blocks
check max_memory_fp8 "mt_train: --max-memory plans layer recomputation, which --precision fp8 cannot run" \
  "${train[@]}" --data "$w/a.tok" --max-memory 20GiB --precision fp8 --amp bf16
check lora_fp8 "mt_lora: --precision fp8 is not supported for LoRA yet: the adapted layers run in bf16" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --precision fp8
check lora_base_dtype_unknown "mt_lora: --base-dtype: expected auto, f32, bf16 or fp8, got f16" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --base-dtype f16
check lora_fp8_base_merged "mt_lora: --merged-out merges the adapter into the base's weights, which --base-dtype fp8" \
  "${lora[@]}" --base "$w/model" --data "$w/a.tok" --base-dtype fp8 --merged-out "$w/merged_out"
check lora_targets_match_nothing "apply_lora: no module matches the targets [q_proj]" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --targets q_proj
check lora_packed_gpt "mt_lora: --examples packed: gpt2 models do not implement packed sequences" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --examples packed
check lora_padded_without_example_starts "records no example starts, so its examples cannot be packed apart" \
  "${lora[@]}" --base "$w/model" --data "$w/a.tok" --examples padded
check examples_layout_unknown "mt_lora: --examples: expected stream, packed or padded, got rows" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --examples rows
check empty_prompt "generate: the prompt is empty" "${generate[@]}" --model "$w/model" --prompt ""
check top_p_zero "mt_generate: --top-p: expected a number above 0, at most 1, got 0" "${generate[@]}" \
  --model "$w/model" --top-p 0
check dtype_unknown "mt_generate: --dtype: expected auto, f32 or bf16, got f16" "${generate[@]}" --model "$w/model" \
  --dtype f16
check stop_not_one_token "mt_generate: --stop 'ab': not one token (the tokenizer makes 2 of it: [97, 98])" \
  "${generate[@]}" --model "$w/model" --stop ab
check stop_id_outside_the_vocabulary \
  "mt_generate: --stop 300: not a token id of this model (its vocabulary has 256 ids)" "${generate[@]}" \
  --model "$w/model" --stop 300
check merge_adapter_required "mt_merge: --adapter is required" "${merge[@]}" --model "$w/model"
check merge_out_is_the_base "mt_merge: --out $w/model is the base model's directory" "${merge[@]}" \
  --model "$w/model" --adapter "$w/wide_adapter" --out "$w/model"

# Numbers out of range: the flag, the accepted range and the value (not CLI11's "Value 2 not in range ...").
check dropout_out_of_range "mt_train: --dropout: expected a number from 0 to 0.99, got 1.5" "${train[@]}" \
  --data "$w/a.tok" --dropout 1.5
check min_lr_ratio_out_of_range "mt_train: --min-lr-ratio: expected a number from 0 to 1, got 2" "${train[@]}" \
  --data "$w/a.tok" --min-lr-ratio 2
check lora_dropout_out_of_range "mt_lora: --lora-dropout: expected a number from 0 to 0.99, got -0.1" "${lora[@]}" \
  --base "$w/model" --data "$w/a.tok" --lora-dropout -0.1
check val_fraction_out_of_range "mt_tokenize: --val-fraction: expected a number from 0 to 1, got 2" \
  "$bin/mt_tokenize" --output "$w/x.tok" --val-output "$w/v.tok" --val-fraction 2 "$w/a.txt"
check mlp_momentum_out_of_range "mlp: --momentum: expected a number from 0 to 0.999, got 1" "$bin/mlp" --momentum 1
check mlp_min_accuracy_out_of_range "mlp: --min-accuracy: expected a number from 0 to 1, got 95" "$bin/mlp" \
  --min-accuracy 95
check mlp_steps_zero "mlp: --steps: expected a positive number, got 0" "$bin/mlp" --steps 0
check mlp_points_not_a_number "mlp: --points-per-class: expected a positive number, got many" "$bin/mlp" \
  --points-per-class many
check gpt_step_steps_zero "gpt_step: --steps: expected a positive number, got 0" "$tools/gpt_step" --steps 0
check mlp_step_repeats_zero "mlp_step: --repeats: expected a positive number, got 0" "$tools/mlp_step" --repeats 0
check op_bench_iters_zero "op_bench: --iters: expected a positive number, got 0" "$tools/op_bench" --iters 0
check llama_step_fp8_base_full_training "llama_step: --base-dtype fp8 is for LoRA (--lora-r > 0)" "$tools/llama_step" \
  --device cpu --lora-r 0 --base-dtype fp8

# --device and --amp: the same words in every program. args_for <program>: its required arguments.
args_for() {
  case $1 in
    mt_train) args=(--data "$w/a.tok" --out "$w/out" --layers 1 --heads 2 --embd 16) ;;
    mt_lora) args=(--data "$w/a.tok" --base "$w/model" --adapter-out "$w/adapter_out") ;;
    mt_generate) args=(--model "$w/model") ;;
    mt_merge) args=(--model "$w/wide" --adapter "$w/wide_adapter" --out "$w/merged_out") ;;
    *) args=() ;;
  esac
}
for p in "$bin/mlp" "$bin/mt_train" "$bin/mt_lora" "$bin/mt_generate" "$bin/mt_merge" "$tools/gpt_step" \
  "$tools/mlp_step" "$tools/op_bench"; do
  name=$(basename "$p")
  args_for "$name"
  check "${name}_device_unknown" "$name: --device: expected auto, cpu, cuda or cuda:N, got tpu" "$p" "${args[@]}" \
    --device tpu
  # A GPU asked for where none is usable: one sentence (on a GPU machine cuda:99 does not exist).
  check "${name}_device_missing" "$name: --device cuda:99: no usable CUDA device (" "$p" "${args[@]}" --device cuda:99
done
for p in "$bin/mlp" "$bin/mt_train" "$bin/mt_lora" "$tools/gpt_step"; do
  name=$(basename "$p")
  args_for "$name"
  check "${name}_amp_unknown" "$name: --amp: expected auto, off, bf16 or fp16, got fp8" "$p" "${args[@]}" --amp fp8
done
if ! command -v nvidia-smi >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  # No driver on this machine: the sentence says so (or that the build has no CUDA at all).
  for p in "$bin/mt_train" "$bin/mlp"; do
    name=$(basename "$p")
    args_for "$name"
    out=$("$p" "${args[@]}" --device cuda 2>&1)
    if grep -q -E "^$name: --device cuda: no usable CUDA device \((driver not found|mixtrain was built without CUDA)\)$" \
      <<<"$out"; then
      echo "ok   ${name}_device_without_driver: $(head -n 1 <<<"$out")"
      passed=$((passed + 1))
    else
      echo "FAIL ${name}_device_without_driver: expected '$name: --device cuda: no usable CUDA device (driver not found)':"
      tail -n 5 <<<"$out" | sed 's/^/    /'
      failed=$((failed + 1))
    fi
  done
fi
check op_bench_dtype_unknown "op_bench: --dtype: expected bf16, f16 or f32, got f64" "$tools/op_bench" --dtype f64
check mlp_optimizer_unknown "mlp: --optimizer: expected adamw or sgd, got adam" "$bin/mlp" --optimizer adam

# The checkpoint flags: the same checks and words in mt_train, mt_lora and mlp.
for p in "$bin/mt_train" "$bin/mt_lora" "$bin/mlp"; do
  name=$(basename "$p")
  args_for "$name"
  args+=(--device cpu --steps 2)
  [[ $name == mlp ]] && args+=(--points-per-class 10) || args+=(--sample-tokens 0 --seq-len 16 --batch-size 2)
  check "${name}_resume_without_save_dir" "$name: --resume needs --save-dir" "$p" "${args[@]}" --resume
  check "${name}_stop_at_without_save_dir" "$name: --stop-at needs --save-dir" "$p" "${args[@]}" --stop-at 1
  check "${name}_keep_zero" "$name: --keep: expected a positive number, got 0" "$p" "${args[@]}" --keep 0
  check "${name}_save_every_negative" "$name: --save-every: expected a number >= 0, got -1" "$p" "${args[@]}" \
    --save-every -1
done

# Data files.
check data_missing "--data: File does not exist: $w/nope.tok" "${train[@]}" --data "$w/nope.tok"
check data_is_text "$w/a.txt: not a token file: the first 8 bytes are not the magic \"MTTOKENS\"" "${train[@]}" \
  --data "$w/a.txt"
check data_vocab_too_large "$w/big.tok: the token file's vocab_size 1000 is larger than the model's vocab_size 256" \
  "${train[@]}" --data "$w/big.tok"
check data_shorter_than_a_window "$w/a.tok: 7292 tokens are too few for one window of seq_len 10000" "${train[@]}" \
  --data "$w/a.tok" --seq-len 10000
check tokenize_input_missing "$w/nope.txt: cannot open: No such file or directory" "$bin/mt_tokenize" \
  --output "$w/x.tok" "$w/nope.txt"
check tokenize_input_empty "the input file '$w/e.txt' is empty" "$bin/mt_tokenize" --output "$w/x.tok" "$w/e.txt"
check tokenize_no_training_tokens "7,292 tokens leave no training tokens with --val-fraction 1" "$bin/mt_tokenize" \
  --output "$w/x.tok" --val-output "$w/v.tok" --val-fraction 1 "$w/a.txt"

# Model and adapter directories.
check base_missing "--base: Directory does not exist: $w/nowhere" "${lora[@]}" --base "$w/nowhere" --data "$w/a.tok"
check base_without_config "$w/empty/config.json: cannot open the model config: No such file or directory" \
  "${lora[@]}" --base "$w/empty" --data "$w/a.tok"
check model_without_config "$w/empty/config.json: cannot open the model config" "${generate[@]}" --model "$w/empty"
check weights_not_safetensors "$w/text_model/model.safetensors: safetensors header length" "${generate[@]}" \
  --model "$w/text_model"
check adapter_missing "--adapter: Directory does not exist: $w/nowhere" "${generate[@]}" --model "$w/model" \
  --adapter "$w/nowhere"
check merge_model_missing "mt_merge: --model: Directory does not exist: $w/nowhere" "${merge[@]}" \
  --model "$w/nowhere" --adapter "$w/wide_adapter"
check merge_adapter_missing "mt_merge: --adapter: Directory does not exist: $w/nowhere" "${merge[@]}" \
  --model "$w/model" --adapter "$w/nowhere"
check merge_model_without_config "mt_merge: $w/empty/config.json: cannot open the model config" "${merge[@]}" \
  --model "$w/empty" --adapter "$w/wide_adapter"
check merge_adapter_files_missing "mt_merge: load_adapter: $w/empty/adapter_config.json: does not exist" \
  "${merge[@]}" --model "$w/model" --adapter "$w/empty"
check adapter_files_missing "load_adapter: $w/empty/adapter_config.json: does not exist" "${generate[@]}" \
  --model "$w/model" --adapter "$w/empty"
expected="$w/wide_adapter/adapter_model.safetensors: 'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight'"
check adapter_of_another_base "$expected has shape [2, 32] in the file but [2, 16] in the model" "${generate[@]}" \
  --model "$w/model" --adapter "$w/wide_adapter"
check merge_adapter_of_another_base \
  "mt_merge: load_adapter: $expected has shape [2, 32] in the file but [2, 16] in the model" "${merge[@]}" \
  --model "$w/model" --adapter "$w/wide_adapter"
[[ ! -e "$w/merged_out" ]] ||
  { echo "FAIL merge_adapter_of_another_base: $w/merged_out was written"; failed=$((failed + 1)); }

# Training checkpoints (--resume reads the newest in --save-dir).
expected="$w/wide_ck/$ckpt: not a usable training checkpoint: load_state_dict: 'transformer.h.0.attn.c_attn.bias'"
check resume_from_another_model "$expected has shape [96] in the state but [48] in the module" "${train[@]}" \
  --data "$w/a.tok" --heads 2 --embd 16 --seq-len 16 --batch-size 2 --save-dir "$w/wide_ck" --resume
check resume_from_a_truncated_checkpoint "$w/cut_ck/$ckpt: tensor ... are out of the data section" "${train[@]}" \
  --data "$w/a.tok" --heads 2 --embd 32 --seq-len 16 --batch-size 2 --save-dir "$w/cut_ck" --resume

echo "bad_cli: $passed passed, $failed failed"
((failed == 0)) || exit 1
echo "bad_cli: PASS"
