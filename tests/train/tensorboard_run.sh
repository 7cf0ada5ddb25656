#!/usr/bin/env bash
# mt_train's --metrics (JSON lines) and --tensorboard (event files) agree, as TensorBoard itself reads
# them, across a stop and a resume: 6 steps, stop with a checkpoint, resume to step 12; TensorBoard
# must show steps 1 to 12 once each (train/tensorboard.h, Note [Resumed runs in TensorBoard]).
# Skipped (77) where the python (MT_PYTHON, default python3) has no tensorboard, or mt_train was
# built without protobuf.
#   tensorboard_run.sh <mt_train dir> <work dir>
set -euo pipefail
bin=$1 work=$2
python=${MT_PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }

if ! "$python" -c "import tensorboard.backend.event_processing.event_accumulator" 2>/dev/null; then
  echo "tensorboard_run: $python cannot import tensorboard; skipped (pip install tensorboard; MT_PYTHON=that python)"
  exit 77
fi

rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 200); do echo "line $i of the text the model learns, with words that repeat and repeat."; done \
  >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" --val-output "$work/a_val.tok" --val-fraction 0.1 "$work/a.txt" \
  >/dev/null || fail "tokenize"
train=("$bin/mt_train" --device cpu --data "$work/a.tok" --val-data "$work/a_val.tok" --eval-batches 2
       --layers 2 --heads 2 --embd 32 --seq-len 32 --batch-size 4 --lr 3e-3 --sample-tokens 0 --steps 12
       --log-every 1 --metrics "$work/m.jsonl" --tensorboard "$work/tb" --save-dir "$work/ck" --out "$work/model")

if ! "${train[@]}" --stop-at 6 >"$work/first.log" 2>&1; then
  cat "$work/first.log"
  if grep -q "TensorBoard event files need protobuf" "$work/first.log"; then
    echo "tensorboard_run: mt_train was built without protobuf; skipped"
    exit 77
  fi
  fail "the first 6 steps"
fi
"${train[@]}" --resume >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the resumed run"; }
grep -q "resumed from .* at step 6" "$work/second.log" || { cat "$work/second.log"; fail "did not resume at step 6"; }
files=$(find "$work/tb" -maxdepth 1 -name 'events.out.tfevents.*' | wc -l)
((files == 2)) || fail "$files event files in $work/tb, expected one per run"

"$python" "$here/tensorboard_check.py" "$work/m.jsonl" "$work/tb" --steps 1..12
echo "tensorboard_run: PASS"
