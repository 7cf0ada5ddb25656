#!/usr/bin/env bash
# The MLP example's training checkpoints: 300 steps straight vs 150 steps, stop, resume to 300.
# The logged steps after the stop (loss, accuracy, learning rate, loss scale) and the final
# accuracy must be identical.
#   mlp_resume.sh <mlp> <work dir> [extra mlp args]
set -uo pipefail
mlp=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
run=("$mlp" --device cpu --steps 300 --log-every 25 --points-per-class 100 "$@")
logged() { grep -E '^mlp: (step|final)' "$1" | sed -E 's/ \| [0-9.]+ ms\/step \| eta .*//'; }
"${run[@]}" >"$work/straight.log" || fail "straight run"
"${run[@]}" --save-dir "$work/ck" --stop-at 150 >"$work/first.log" || fail "first half"
grep -q "mlp: stopped after step 150 (--stop-at)" "$work/first.log" || fail "did not stop at 150"
"${run[@]}" --save-dir "$work/ck" --resume >"$work/second.log" || fail "resumed half"
grep -q "resumed from .*step-000000150.safetensors at step 150" "$work/second.log" || fail "did not resume at step 150"
diff <(logged "$work/straight.log" | awk '$2 != "step" || $3 + 0 > 150') <(logged "$work/second.log") \
  >"$work/diff.txt" || { cat "$work/diff.txt"; fail "the resumed run differs from the straight one"; }
echo "mlp_resume: steps 151-300 and the final accuracy identical after a stop at 150"
echo "mlp_resume: PASS"
