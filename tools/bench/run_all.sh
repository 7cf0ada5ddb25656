#!/usr/bin/env bash
# Every benchmark, ours and PyTorch's twin side by side, on the GPU machine. Called by
# `tools/device_check.sh --bench` after the build; BUILD names the build folder.
#
#   tools/bench/run_all.sh [--only gpt|mlp|ops|ddp|llama|llama-train|llama-generate|lora-7b|fp8-train]
#
# --only runs one section (llama: llama-train, then llama-generate). MT_PROFILE_STEPS (default 3)
# steps per mode are then profiled op by op.
# The Llama section's sizes come from these variables (defaults in brackets):
#   SMOLLM_BATCH [8], SMOLLM_SEQ_LEN [2048]      SmolLM2-135M shape, full training
#   LLAMA_BATCH [8], LLAMA_SEQ_LEN [2048]        Llama-3.2-1B shape, LoRA r=16
#   GEN_PROMPT_LEN [128], GEN_NEW_TOKENS [256]   Llama-3.2-1B shape, generation
#   LARGE_BATCH [1], LARGE_ACCUMULATE [4]        7B/8B/13B shapes, LoRA r=16, T=2048 (lora-7b)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${BUILD:-build-device}"
profile="${MT_PROFILE_STEPS:-3}"
sections="gpt mlp ops ddp llama-train llama-generate lora-7b fp8-train"
usage="usage: tools/bench/run_all.sh [--only gpt|mlp|ops|ddp|llama|llama-train|llama-generate|lora-7b|fp8-train]"

only=""
while (($# > 0)); do
  case "$1" in
    --only)
      (($# >= 2)) || { echo "run_all.sh: --only needs a section; $usage" >&2; exit 2; }
      only="$2"
      shift 2
      ;;
    --only=*)
      only="${1#--only=}"
      shift
      ;;
    -h | --help)
      echo "$usage"
      exit 0
      ;;
    *)
      echo "run_all.sh: unknown argument '$1'; $usage" >&2
      exit 2
      ;;
  esac
done
if [[ -n "$only" && " $sections llama " != *" $only "* ]]; then
  echo "run_all.sh: --only: expected one of ${sections// /, }, llama, got '$only'" >&2
  exit 2
fi
wanted() { [[ -z "$only" || "$only" == "$1" || ("$only" == llama && "$1" == llama-*) ]]; }

gpt_section() {
  echo "== GPT-2 124M shape, B=16, T=1024, bf16, LoRA r=8 on c_attn: checkpointing =="
  "$build/tools/gpt_step" --device cuda --checkpoint off,blocks,selective --lora-r 8 --lora-targets c_attn \
    --profile "$profile"
  echo "== GPT-2 124M shape, B=16, T=1024, bf16, full training =="
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --profile "$profile"
  echo "-- full training with the f32 weights cast at every step (--cast-weights), not taken from AdamW's copies --"
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --cast-weights
  echo "-- full training and LoRA, each step replayed from a CUDA Graph (then full with its weights cast) --"
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --cuda-graph
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --cuda-graph --cast-weights
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 8 --lora-targets c_attn --cuda-graph
  echo "-- full training and LoRA with --gemm-autotune (each GEMM problem times cuBLASLt's best few algorithms) --"
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --gemm-autotune
  "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 8 --lora-targets c_attn --gemm-autotune
  echo "-- PyTorch + PEFT --"
  python3 tools/bench/gpt_step_torch.py
  echo "-- PyTorch, full training, eager and torch.compile --"
  python3 tools/bench/gpt_step_torch.py --full
}

mlp_section() {
  echo "== 4 x Linear(1024) + GELU MLP, batch 64, fp16 autocast + GradScaler + AdamW (launch-bound) =="
  "$build/tools/mlp_step" --device cuda --profile "$profile"
  echo "-- the same step captured once in a CUDA Graph and replayed (mt::CudaGraphStep) --"
  "$build/tools/mlp_step" --device cuda --cuda-graph
  echo "-- the graph again, its weights cast at every step (--cast-weights), not taken from AdamW's copies --"
  "$build/tools/mlp_step" --device cuda --cuda-graph --cast-weights
  python3 tools/bench/mlp_step_torch.py
}

ops_section() {
  echo "== Op micro-benchmarks, GPT-2 124M shapes, bf16: ours against the floors, then PyTorch's =="
  ops_dir="$(mktemp -d)"
  trap 'rm -rf "$ops_dir"' EXIT
  "$build/tools/op_bench" --device cuda | tee "$ops_dir/ours.txt"
  python3 tools/bench/op_bench_torch.py | tee "$ops_dir/torch.txt"
  echo "-- ours / PyTorch, median ms per op (ratio < 1: we are faster) --"
  awk '$1 == "op_bench:" && NF == 3 { ours[$2] = $3; order[++n] = $2 }
       $1 == "op_bench_torch:" && NF == 3 { torch[$2] = $3 }
       END {
         printf "%-14s %10s %10s %8s\n", "op", "ours", "torch", "ratio"
         for (i = 1; i <= n; ++i) {
           op = order[i]
           if (op in torch) printf "%-14s %10.3f %10.3f %8.2f\n", op, ours[op], torch[op], ours[op] / torch[op]
         }
       }' "$ops_dir/ours.txt" "$ops_dir/torch.txt"
}

ddp_section() {
  if (($(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') >= 2)); then
    echo "== GPT-2 124M shape, full training, data parallel over 2 GPUs (B=16 per GPU) =="
    mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      -x NVSHMEM_DISABLE_NVLS=1 "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0
    echo "-- the same with the optimizer's update after every all-reduce (synchronize, then step) --"
    mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      -x NVSHMEM_DISABLE_NVLS=1 "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --ddp-update after
  fi
}

# A Llama or FP8 command that fails is reported and the next one runs (each pair of numbers is worth
# having without the others); the script then exits 1, after the last section.
any_failed=0
keep_going() {
  "$@" || {
    local rc=$?
    echo "run_all.sh: FAILED (exit $rc): $*"
    any_failed=1
  }
}
# SmolLM2-135M full training at B x T = 8 x 2048 (16k tokens a step) fits an 80 GB card by a
# wide margin, so it needs no fallback to 16 x 1024: the weights, gradients and AdamW's two
# moments in f32 are 16 bytes a parameter, 2.2 GB for 135M; what backward keeps is of order
# 30 KB a token a layer (the residual stream and RMSNorm's f32 intermediates, q/k/v and the
# attention output, gate, up and their product; SDPA keeps no T x T scores), so 30 layers x 16k
# tokens x 30 KB ~ 15 GB; PyTorch's LM head adds the [16k, 49152] logits in bf16 (1.6 GB), their
# f32 copy, log-softmax and its gradient (3.2 GB each) ~ 11 GB: under 30 GB in all.
sb="${SMOLLM_BATCH:-8}" st="${SMOLLM_SEQ_LEN:-2048}"
# Llama-3.2-1B LoRA at 8 x 2048 is the tight one, for PyTorch: ~130 KB a token a layer kept for
# backward (bf16 activations, RMSNorm's f32 ones, an 8192-wide MLP) x 16 layers x 16k tokens
# ~ 34 GB, and the [16k, 128256] logits in bf16 (4.2 GB), f32, log-softmax and gradient (8.4 GB
# each) ~ 30 GB, beside the 2.5 GB bf16 base: near 70 GB. Ours runs with the same bf16 base and f32
# adapters (--base-dtype bf16), then with its default f32 base (5 GB, and the bf16 copies autocast
# keeps of it); its fused LM head never forms the whole logits. A mode that runs out of memory
# prints so and the next one runs; then rerun with LLAMA_BATCH=4.
lb="${LLAMA_BATCH:-8}" lt="${LLAMA_SEQ_LEN:-2048}"

prompt="${GEN_PROMPT_LEN:-128}" new="${GEN_NEW_TOKENS:-256}"

llama_train_section() {
  echo "== SmolLM2-135M shape, B=$sb, T=$st, bf16 autocast, full training, checkpointing off and blocks =="
  keep_going "$build/tools/llama_step" --device cuda --shape smollm2-135m --lora-r 0 --batch "$sb" --seq-len "$st" \
    --checkpoint off,blocks --profile "$profile"
  echo "-- PyTorch, full training (f32 weights, fused AdamW): eager, torch.compile, eager with checkpointing --"
  keep_going python3 tools/bench/llama_step_torch.py --shape smollm2-135m --lora-r 0 --batch "$sb" --seq-len "$st" \
    --modes eager,compile,blocks
  echo "== Llama-3.2-1B shape, B=$lb, T=$lt, bf16 autocast, LoRA r=16 alpha=32 on the seven projections =="
  keep_going "$build/tools/llama_step" --device cuda --shape llama-3.2-1b --lora-r 16 --base-dtype bf16 \
    --batch "$lb" --seq-len "$lt" --checkpoint off,blocks --profile "$profile"
  echo "-- the same with the frozen base in FP8 (E4M3, a scale per output channel; its GEMMs in FP8) --"
  keep_going "$build/tools/llama_step" --device cuda --shape llama-3.2-1b --lora-r 16 --base-dtype fp8 \
    --batch "$lb" --seq-len "$lt" --checkpoint off,blocks --profile "$profile"
  echo "-- the same with the frozen base in f32 (llama_step's default), cast once to bf16 copies by autocast --"
  keep_going "$build/tools/llama_step" --device cuda --shape llama-3.2-1b --lora-r 16 --batch "$lb" --seq-len "$lt" \
    --checkpoint off
  echo "-- PyTorch + PEFT (frozen base bf16, adapters f32): eager, torch.compile, eager with checkpointing --"
  keep_going python3 tools/bench/llama_step_torch.py --shape llama-3.2-1b --lora-r 16 --batch "$lb" --seq-len "$lt" \
    --modes eager,compile,blocks
}

llama_generate_section() {
  echo "== Llama-3.2-1B shape, bf16 weights, batch 1, prompt $prompt, $new new tokens: greedy generation, KV cache =="
  keep_going "$build/tools/generate_bench" --device cuda --shape llama-3.2-1b --prompt-len "$prompt" --new-tokens "$new"
  echo "-- PyTorch: transformers' model.generate --"
  keep_going python3 tools/bench/generate_torch.py --shape llama-3.2-1b --prompt-len "$prompt" --new-tokens "$new"
}

# LoRA r=16 alpha=32 on the seven projections at the shapes of Llama-3-8B, Llama-2-7B (bf16 base)
# and Llama-2-13B (FP8 base), T=2048, LARGE_ACCUMULATE micro-batches of LARGE_BATCH sequences per
# step (8192 tokens by default). Ours under the checkpointing --max-memory plans for a 24 GB card
# (printed, with the planned peak under each measured row), beside every layer recomputed; PEFT with
# transformers' gradient checkpointing, eager and compiled.
large_b="${LARGE_BATCH:-1}" large_acc="${LARGE_ACCUMULATE:-4}"
lora_7b_section() {
  local shape budget base
  for shape in llama-3-8b llama-2-7b llama-2-13b; do
    case $shape in
      llama-3-8b) budget=21GiB base=bf16 ;;
      llama-2-7b) budget=18GiB base=bf16 ;;
      *) budget=23GiB base=fp8 ;;
    esac
    local run=(--shape "$shape" --lora-r 16 --batch "$large_b" --accumulate "$large_acc" --seq-len 2048 --warmup 1
      --steps 4)
    echo "== $shape shape, LoRA r=16, $large_acc x $large_b x 2048 tokens per step, $base base, plan for $budget =="
    keep_going "$build/tools/llama_step" --device cuda "${run[@]}" --base-dtype "$base" --checkpoint blocks \
      --max-memory "$budget"
    echo "-- PyTorch + PEFT (bf16 base): gradient checkpointing, eager and torch.compile --"
    keep_going python3 tools/bench/llama_step_torch.py "${run[@]}" --modes blocks,blocks-compile
  done
}

# FP8 full training at GPT-2 medium and XL shapes (B=8, T=1024: XL's f32 weights, gradients and
# AdamW moments are 25 GB, its bf16 activations near 30 GB): our bf16 step, our FP8 step, and
# PyTorch's bf16 and float8 steps under torch.compile (torchao's tensorwise recipe when torchao
# imports, else the same recipe by hand on torch._scaled_mm; gpt_step_torch.py --float8).
fp8_float8="${FP8_TORCH:-torchao}"
fp8_train_section() {
  local shape name
  # torchao is not in the GPU machine's image: its wheel travels in .whl (python3 -m pip download torchao).
  if compgen -G ".whl/torchao-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mt-site .whl/torchao-*.whl &&
      export PYTHONPATH="/tmp/mt-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  for name in medium xl; do
    if [[ $name == medium ]]; then shape="--layers 24 --heads 16 --embd 1024"; else shape="--layers 48 --heads 25 --embd 1600"; fi
    echo "== GPT-2 $name shape, B=8, T=1024, full training: bf16, then FP8 Linear layers (delayed scaling) =="
    keep_going "$build/tools/gpt_step" --device cuda $shape --lora-r 0 --batch 8 --checkpoint off --precision amp
    keep_going "$build/tools/gpt_step" --device cuda $shape --lora-r 0 --batch 8 --checkpoint off --precision fp8
    echo "-- PyTorch + torch.compile: bf16 (Conv1D as nn.Linear), then float8 ($fp8_float8) --"
    keep_going python3 tools/bench/gpt_step_torch.py --full --linear --modes compile $shape --batch 8
    keep_going python3 tools/bench/gpt_step_torch.py --full --float8 "$fp8_float8" $shape --batch 8
  done
}

# Under set -e, as before the sections: a failing command ends the script with its status.
for section in $sections; do
  if wanted "$section"; then "${section//-/_}_section"; fi
done
exit "$any_failed"
