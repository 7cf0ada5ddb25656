#!/usr/bin/env bash
# With stdout and stderr in one file (not a terminal), the progress lines a program printed come
# before the error that ends it: each program's stdout is line-buffered.
#   output_order.sh <bin dir> <work dir>
set -uo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
passed=0 failed=0
# check <case> <progress pattern> <error words> <command...>: the command fails after progress lines.
check() {
  local name=$1 progress=$2 error=$3
  shift 3
  local log="$work/$name.log" rc last_progress error_line
  timeout 120 "$@" >"$log" 2>&1
  rc=$?
  last_progress=$(grep -n -E -- "$progress" "$log" | tail -n 1 | cut -d: -f1)
  error_line=$(grep -n -F -- "$error" "$log" | head -n 1 | cut -d: -f1)
  if ((rc == 0 || rc >= 124)); then
    echo "FAIL $name: exit status $rc (expected an error exit)"
  elif [[ -z "$last_progress" || -z "$error_line" ]]; then
    echo "FAIL $name: no progress line ('$progress') or no error ('$error') in the output:"
    sed 's/^/    /' "$log"
  elif ((error_line < last_progress)); then
    echo "FAIL $name: the error (line $error_line) comes before the last progress line (line $last_progress):"
    sed 's/^/    /' "$log"
  else
    echo "ok   $name: error on line $error_line after the last progress line ($last_progress)"
    passed=$((passed + 1))
    return
  fi
  failed=$((failed + 1))
}

# The MLP fails after training when the accuracy is below --min-accuracy.
check mlp "step +[0-9]+" "is below --min-accuracy" "$bin/mlp" --device cpu --steps 30 --log-every 10 \
  --points-per-class 50 --min-accuracy 1
# mt_train fails after training when it cannot write the model (--out under a regular file).
for i in $(seq 1 100); do echo "line $i of the text the model learns."; done >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || { echo "FAIL: setup: mt_tokenize"; exit 1; }
: >"$work/file"
check mt_train "step +[0-9]+/" "$work/file/model" "$bin/mt_train" --device cpu --data "$work/a.tok" --layers 1 \
  --heads 2 --embd 16 --seq-len 16 --batch-size 2 --steps 6 --log-every 2 --sample-tokens 0 --out "$work/file/model"

echo "output_order: $passed passed, $failed failed"
((failed == 0)) || exit 1
echo "output_order: PASS"
