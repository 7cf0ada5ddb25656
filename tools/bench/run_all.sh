#!/usr/bin/env bash
# Every benchmark, ours and PyTorch's twin side by side, on the GPU machine. Called by
# `tools/device_check.sh --bench` after the build; BUILD names the build folder.
# MT_PROFILE_STEPS (default 3) steps per mode are then profiled op by op.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${BUILD:-build-device}"
profile="${MT_PROFILE_STEPS:-3}"

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
echo "== 4 x Linear(1024) + GELU MLP, batch 64, fp16 autocast + GradScaler + AdamW (launch-bound) =="
"$build/tools/mlp_step" --device cuda --profile "$profile"
echo "-- the same step captured once in a CUDA Graph and replayed (mt::CudaGraphStep) --"
"$build/tools/mlp_step" --device cuda --cuda-graph
echo "-- the graph again, its weights cast at every step (--cast-weights), not taken from AdamW's copies --"
"$build/tools/mlp_step" --device cuda --cuda-graph --cast-weights
python3 tools/bench/mlp_step_torch.py
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
if (($(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') >= 2)); then
  echo "== GPT-2 124M shape, full training, data parallel over 2 GPUs (B=16 per GPU) =="
  mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    -x NVSHMEM_DISABLE_NVLS=1 "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0
  echo "-- the same with the optimizer's update after every all-reduce (synchronize, then step) --"
  mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    -x NVSHMEM_DISABLE_NVLS=1 "$build/tools/gpt_step" --device cuda --checkpoint off --lora-r 0 --ddp-update after
fi
