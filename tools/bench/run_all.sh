#!/usr/bin/env bash
# Every benchmark, ours and PyTorch's twin side by side, on the GPU machine. Called by
# `tools/device_check.sh --bench` after the build; BUILD names the build folder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${BUILD:-build-device}"

echo "== GPT-2 124M shape, B=16, T=1024, bf16, LoRA r=8 on c_attn: checkpointing =="
"$build/tools/gpt_step" --device cuda --checkpoint off,blocks,selective --lora-r 8 --lora-targets c_attn
echo "-- PyTorch + PEFT --"
python3 tools/bench/gpt_step_torch.py
