#!/usr/bin/env bash
# The main job: installs what is missing, builds, pretrains a small GPT on the licence texts
# every Debian machine has (/usr/share/common-licenses), then LoRA-fine-tunes it on a
# different text (the Perl modules of perl-base, also on every Debian machine), printing the
# trainable fraction, the falling loss, and a sample before and after. On a GPU it trains in
# bf16 autocast; without one it builds the CPU-only library and trains a smaller run.
# Extra arguments go to both training programs, e.g. `tools/demo.sh --steps 100`.
#   MT_BUILD_DIR   build folder (default: build on a GPU machine, build-cpu-only without one)
#   MT_CMAKE_ARGS  extra configure arguments
#   DEMO_DIR       where the token files, model and adapter go (default: <build>/demo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

tools/setup.sh
# CPU loops and GEMMs run on OpenMP threads; idle threads sleep instead of spinning, which
# on small or shared machines (VMs, CI runners) is 2-3x faster than GNU OpenMP's default.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

device=cpu
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then device=cuda; fi
if [[ $device == cuda ]]; then
  build="${MT_BUILD_DIR:-build}"
  config=(-DMT_ENABLE_CUDA=ON)
  # model and run sizes: layers heads width, sequence length, batch, steps (pretrain, LoRA)
  model=(--layers 6 --heads 8 --embd 384 --dropout 0.1) seq=256 batch=32 pre_steps=600 lora_steps=300
else
  # Without a GPU the CUDA code would be built for nothing: build the CPU-only library, for this
  # machine's instruction set (about 2x on the CPU GEMMs it trains with; the build stays here).
  build="${MT_BUILD_DIR:-build-cpu-only}"
  config=(-DMT_ENABLE_CUDA=OFF -DMT_CPU_NATIVE=ON)
  model=(--layers 4 --heads 4 --embd 128) seq=64 batch=16 pre_steps=250 lora_steps=120
fi

fresh=()  # for a new build folder: Ninja when there is one, and a build type (see tools/test.sh)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  fresh=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
  if command -v ninja >/dev/null; then fresh+=(-G Ninja); fi
fi
read -r -a extra <<<"${MT_CMAKE_ARGS:-}"
cmake -S . -B "$build" "${fresh[@]}" "${config[@]}" "${extra[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target mt_tokenize mt_train_program mt_lora mt_generate
echo "demo.sh: built in $((SECONDS - start)) s"

work="${DEMO_DIR:-$build/demo}"
mkdir -p "$work"
bin="$build/examples"

# Pretraining text: the licences (regular files only: GPL, LGPL and GFDL are links to versions).
mapfile -t licences < <(find /usr/share/common-licenses -maxdepth 1 -type f | sort)
((${#licences[@]} > 0)) || { echo "demo.sh: no files in /usr/share/common-licenses" >&2; exit 1; }
# Fine-tuning text: perl-base's modules (perl-base is essential on Debian).
perl_dir=$(dirname "$(perl -Mstrict -e 'print $INC{"strict.pm"}' 2>/dev/null)" 2>/dev/null || true)
mapfile -t perl_modules < <(find "${perl_dir:-/nonexistent}" -maxdepth 1 -name '*.pm' -type f 2>/dev/null | sort)
((${#perl_modules[@]} > 0)) || { echo "demo.sh: cannot find perl-base's modules (is perl installed?)" >&2; exit 1; }

echo "demo.sh: === 1. tokenize (bytes) ==="
"$bin/mt_tokenize" --output "$work/licences.tok" --val-output "$work/licences_val.tok" --val-fraction 0.05 \
  "${licences[@]}"
"$bin/mt_tokenize" --output "$work/perl.tok" --val-output "$work/perl_val.tok" --val-fraction 0.05 \
  "${perl_modules[@]}"

echo "demo.sh: === 2. pretrain a GPT on the licences ($device) ==="
"$bin/mt_train" --data "$work/licences.tok" --val-data "$work/licences_val.tok" --out "$work/model" \
  "${model[@]}" --seq-len "$seq" --batch-size "$batch" --steps "$pre_steps" --lr 2e-3 \
  --log-every $((pre_steps / 10)) --eval-every $((pre_steps / 5)) --prompt "This License " --sample-tokens 160 --metrics "$work/pretrain.jsonl" "$@"

echo "demo.sh: === 3. LoRA fine-tune it on Perl source ==="
"$bin/mt_lora" --base "$work/model" --data "$work/perl.tok" --val-data "$work/perl_val.tok" \
  --adapter-out "$work/adapter" --r 8 --alpha 16 --targets c_attn,c_proj,c_fc --seq-len "$seq" \
  --batch-size "$batch" --steps "$lora_steps" --lr 3e-3 --log-every $((lora_steps / 10)) --eval-every $((lora_steps / 5)) \
  --prompt "sub " --sample-tokens 160 --metrics "$work/lora.jsonl" "$@"

# Both runs' loss, learning rate, throughput and memory in one picture. matplotlib is optional
# (tools/setup.sh installs it where it can): without it the demo says how to get it and goes on.
plot="$work/metrics.png"
if ! command -v python3 >/dev/null; then
  echo "demo.sh: no metrics plot: python3 is not installed (apt-get install python3 python3-matplotlib)"
elif tools/plot_metrics.py "$work/pretrain.jsonl" "$work/lora.jsonl" -o "$plot" \
     --title "mixtrain demo ($device): pretraining and LoRA fine-tuning" >/dev/null 2>"$work/plot_metrics.err"; then
  echo "demo.sh: metrics plot: $plot"
else
  echo "demo.sh: no metrics plot: $(cat "$work/plot_metrics.err")"
fi

echo "demo.sh: model in $work/model, adapter in $work/adapter; sample again with"
echo "  $bin/mt_generate --model $work/model --adapter $work/adapter --prompt 'sub '"
echo "demo.sh: done in $((SECONDS - start)) s"
