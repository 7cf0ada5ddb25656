#!/usr/bin/env bash
# examples/quickstart/trainer.cpp: the loss falls 10-fold over 400 steps; the metrics file holds
# each logged step once; a second run resumes from the last checkpoint (step 400) and trains no
# further; the model file is written.
#   quickstart_trainer.sh <quickstart_trainer binary> <work dir>
set -uo pipefail
bin=$1 work=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"
"$bin" "$work" >"$work.first.log" 2>&1 || { cat "$work.first.log"; fail "first run"; }
read -r first last < <(sed -n -E 's/^loss ([0-9.e+-]+) -> ([0-9.e+-]+)$/\1 \2/p' "$work.first.log")
[[ -n "${first:-}" ]] || { cat "$work.first.log"; fail "no 'loss A -> B' line"; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b * 10 < a) }' || fail "loss $first -> $last did not fall 10-fold"
[[ -f "$work/model.safetensors" ]] || fail "no model.safetensors"
steps=$(sed -E 's/^\{"step":([0-9]+),.*/\1/' "$work/metrics.jsonl" | tr '\n' ' ')
[[ "$steps" == "1 100 200 300 400 " ]] || fail "metrics steps: $steps"
"$bin" "$work" >"$work.second.log" 2>&1 || { cat "$work.second.log"; fail "second run"; }
grep -q "resumed from .*step-000000400.safetensors at step 400" "$work.second.log" ||
  { cat "$work.second.log"; fail "the second run did not resume at step 400"; }
steps=$(sed -E 's/^\{"step":([0-9]+),.*/\1/' "$work/metrics.jsonl" | tr '\n' ' ')
[[ "$steps" == "1 100 200 300 400 " ]] || fail "metrics steps after the second run: $steps"
echo "quickstart_trainer: loss $first -> $last; resumed at step 400 with nothing left to do"
