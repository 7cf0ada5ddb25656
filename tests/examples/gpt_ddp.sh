#!/usr/bin/env bash
# mt_train and mt_lora unchanged under `mpirun -np 2` on the CPU: both ranks train their
# shards, rank 0 alone logs and writes, and the result loads and samples.
#   gpt_ddp.sh <bin dir> <mpirun> <work dir>
set -euo pipefail
bin=$1 mpirun=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 300); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt"
run=("$mpirun" --allow-run-as-root --oversubscribe -np 2)
common=(--device cpu --seq-len 32 --batch-size 4 --log-every 10 --sample-tokens 20)
"${run[@]}" "$bin/mt_train" --data "$work/a.tok" --out "$work/model" --layers 2 --heads 2 --embd 32 --steps 30 \
  --lr 3e-3 "${common[@]}" | tee "$work/train.log"
"${run[@]}" "$bin/mt_lora" --base "$work/model" --data "$work/a.tok" --adapter-out "$work/adapter" --r 4 \
  --steps 20 "${common[@]}" | tee "$work/lora.log"

grep -q "data parallel over 2 ranks" "$work/train.log" || { echo "FAIL: not data parallel"; exit 1; }
for log in train lora; do
  n=$(grep -c "step   10/" "$work/$log.log" || true)
  [[ $n == 1 ]] || { echo "FAIL: $log: $n ranks printed progress (rank 0 alone should)"; exit 1; }
done
awk '/^mt_train: loss [0-9.]+ -> / { if ($5 + 0 >= $3 + 0) { print "FAIL: loss did not fall: " $0; exit 1 } }' \
  "$work/train.log"
[[ -s "$work/model/model.safetensors" && -s "$work/adapter/adapter_model.safetensors" ]] ||
  { echo "FAIL: model or adapter not written"; exit 1; }
"$bin/mt_generate" --device cpu --model "$work/model" --adapter "$work/adapter" --tokens 20 >/dev/null
echo "gpt_ddp: PASS"
